"""Real text corpora from Debian's archive: which packages, and how each format becomes documents.

Two corpora (``CORPORA``), each a list of ``Source``\\ s (a package, its licence and a converter
from the package's extracted tree to ``(document name, text bytes)``):

  * ``english`` (~18M words): the GNU Collaborative International Dictionary of English
    (dictd's gzip-compatible ``.dict.dz``, entries grouped into pages of ``ENTRIES_PER_DOC``),
    the kernel's English documentation and Python's (reST sources, ``translations/`` left out),
    Spurgeon's *Treasury of David*, Matthew Henry's concise commentary and the World English
    Bible (SWORD modules: a ``.?zs`` index of 12-byte little-endian records (offset, size,
    uncompressed size) into zlib blocks, OSIS markup removed; one document a block), WordNet's
    glosses (the text after ``|`` in ``data.*``, pages of ``ENTRIES_PER_DOC`` synsets), Perl's
    POD pages, the PostgreSQL manual (HTML, tags removed) and the fortune cookies (one document a
    file);
  * ``kernel``: the C source of Linux 6.1 (``.c``/``.h`` files of the ``linux-source-6.1``
    tarball, as they are; one document a file).

The corpus is built (downloaded, extracted, split by document, tokenized) by ``corpus.build``:
``python -m data_pipelines.debian_text --corpus=english --output_dir=data/english`` (or
``make corpus``). Every package is free software or in the public domain; each one's licence is
recorded in the corpus manifest.
"""

from __future__ import annotations

import glob
import gzip
import html
import html.parser
import json
import os
import re
import struct
import tarfile
import zlib
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

from absl import app
from absl import flags

from data_pipelines import corpus
from data_pipelines import records
from data_pipelines.corpus import Document
from data_pipelines.corpus import Source

ENTRIES_PER_DOC = 100  # dictionary entries / WordNet synsets per document
_SOURCE_TAG = re.compile(rb"^\s*\[[^\]\n]+\]\s*$", re.M)  # '[1913 Webster]', '[PJC]' lines
_TAG = re.compile(rb"<[^>]*>")
_NOTE = re.compile(rb"<note\b[^>]*>.*?</note>", re.S)  # OSIS footnotes and cross-references
_BLOCK = re.compile(rb"</?(?:div|p|title|chapter|lb|l|lg|br|item|list|head)\b[^>]*>")
_HTML_BLOCKS = frozenset("p div h1 h2 h3 h4 h5 h6 li tr td th br pre table dt dd title".split())
_HTML_NAV = ("navheader", "navfooter")  # the manual's navigation bars, the same on every page
_SWORD_RECORD = struct.Struct("<III")  # offset, compressed size, uncompressed size


def _files(root: str, pattern: str, exclude: str = "") -> List[str]:
  """Regular files under ``root`` matching ``pattern`` (recursive glob), sorted, without those
  whose path holds ``exclude``."""
  found = [p for p in glob.glob(os.path.join(root, pattern), recursive=True)
           if os.path.isfile(p) and not os.path.islink(p) and not (exclude and exclude in p)]
  if not found:
    raise records.DataError(f"{root}: no files match {pattern!r}: is this the right package?")
  return sorted(found)


def _read(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def whole_files(pattern: str, exclude: str = "") -> Callable[[str], Iterator[Document]]:
  """A converter taking every file matching ``pattern`` as one document, as it is (reST, POD)."""

  def convert(root: str) -> Iterator[Document]:
    for path in _files(root, pattern, exclude):
      yield os.path.relpath(path, root), _read(path)

  return convert


def _pages(name: str, entries: Sequence[bytes]) -> Iterator[Document]:
  for start in range(0, len(entries), ENTRIES_PER_DOC):
    yield f"{name}#{start // ENTRIES_PER_DOC}", b"\n\n".join(entries[start:start + ENTRIES_PER_DOC])


def gcide(root: str) -> Iterator[Document]:
  """GCIDE entries (dictd format: gzip text, entries apart by blank lines), source tags such as
  ``[1913 Webster]`` and cross-reference braces removed, in pages of ENTRIES_PER_DOC; the
  ``00-database-*`` header entries are left out."""
  [path] = _files(root, "usr/share/dictd/gcide.dict.dz")
  try:
    with gzip.open(path, "rb") as f:
      text = f.read()
  except (OSError, EOFError, zlib.error) as e:
    raise records.DataError(f"{path}: not a readable gzip/dictzip file: {e}") from None
  entries = [_SOURCE_TAG.sub(b"", e).replace(b"{", b"").replace(b"}", b"").strip()
             for e in re.split(rb"\n\s*\n", text)]
  entries = [e for e in entries if e and not e.startswith(b"00-database")]
  yield from _pages(os.path.relpath(path, root), entries)


def wordnet(root: str) -> Iterator[Document]:
  """WordNet glosses: the text after ``| `` of each synset line of ``data.*`` (the licence
  header's lines start with two spaces), in pages of ENTRIES_PER_DOC synsets."""
  for path in _files(root, "usr/share/wordnet/data.*"):
    glosses = []
    for number, line in enumerate(_read(path).splitlines(), 1):
      if line.startswith(b"  ") or not line.strip():
        continue
      _, bar, gloss = line.partition(b"| ")
      if not bar:
        raise records.DataError(f"{path}:{number}: a synset line without '| ' (its gloss)")
      glosses.append(gloss.strip())
    yield from _pages(os.path.relpath(path, root), glosses)


def sword_blocks(index_path: str) -> Iterator[Tuple[int, bytes]]:
  """(block number, uncompressed bytes) of a zText/zCom SWORD module's index and data file
  (``ot.bzs`` + ``ot.bzz``, or ``.czs`` + ``.czz``); a damaged block fails, naming the file."""
  data_path = index_path[:-1] + "z"
  index, data = _read(index_path), _read(data_path)
  if len(index) % _SWORD_RECORD.size:
    raise records.DataError(f"{index_path}: {len(index)} bytes is not a whole number of "
                            f"{_SWORD_RECORD.size}-byte index records")
  for number, (offset, size, full) in enumerate(_SWORD_RECORD.iter_unpack(index)):
    if not size:
      continue
    try:
      block = zlib.decompress(data[offset:offset + size])
    except zlib.error as e:
      raise records.DataError(f"{data_path}: block {number} (bytes {offset}-{offset + size}) "
                              f"is not zlib data: {e}") from None
    if len(block) != full:
      raise records.DataError(f"{data_path}: block {number} holds {len(block)} bytes, its index "
                              f"{index_path} says {full}")
    yield number, block


def _squeezed(text: str) -> str:
  text = re.sub(r"[ \t]+", " ", text)
  return re.sub(r" ?\n[\s]*", lambda m: "\n\n" if m.group().count("\n") > 1 else "\n",
                text).strip()


def strip_markup(text: bytes) -> bytes:
  """OSIS text without notes and tags (block tags become line breaks), entities decoded."""
  text = _TAG.sub(b"", _BLOCK.sub(b"\n", _NOTE.sub(b"", text)))
  return _squeezed(html.unescape(text.decode("utf-8"))).encode("utf-8")


def sword(root: str) -> Iterator[Document]:
  """The blocks (books or chapters) of every SWORD module of the package, markup removed."""
  for index_path in _files(root, "usr/share/sword/modules/**/*.?zs"):
    for number, block in sword_blocks(index_path):
      text = strip_markup(block)
      if text:
        yield f"{os.path.relpath(index_path, root)}#{number}", text


class _TextOf(html.parser.HTMLParser):
  """Collects an HTML page's text: block elements end lines; scripts, styles and navigation
  bars are left out."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.parts: List[str] = []
    self._skipped: List[str] = []  # open elements whose text is left out

  def handle_starttag(self, tag, attrs):
    if tag in _HTML_BLOCKS:
      self.parts.append("\n")
    classes = (dict(attrs).get("class") or "").split()
    if self._skipped or tag in ("script", "style") or any(c in _HTML_NAV for c in classes):
      self._skipped.append(tag)

  def handle_endtag(self, tag):
    if tag in _HTML_BLOCKS:
      self.parts.append("\n")
    if self._skipped and self._skipped[-1] == tag:
      self._skipped.pop()

  def handle_data(self, data):
    if not self._skipped:
      self.parts.append(data)


def html_text(page: bytes) -> bytes:
  """The text of an HTML page (tags removed, entities decoded, blank lines squeezed)."""
  parser = _TextOf()
  parser.feed(page.decode("utf-8"))
  parser.close()
  return _squeezed("".join(parser.parts)).encode("utf-8")


def html_pages(pattern: str) -> Callable[[str], Iterator[Document]]:
  """A converter taking the text of every HTML page matching ``pattern`` as one document."""

  def convert(root: str) -> Iterator[Document]:
    for path in _files(root, pattern):
      yield os.path.relpath(path, root), html_text(_read(path))

  return convert


def fortunes(root: str) -> Iterator[Document]:
  """Each fortune file (not its ``.dat`` index or ``.u8`` link), its ``%`` separators removed."""
  for path in _files(root, "usr/share/games/fortunes/*"):
    if not path.endswith(".dat"):
      yield os.path.relpath(path, root), re.sub(rb"(?m)^%\n", b"\n", _read(path)).strip()


def c_source(tarball_pattern: str) -> Callable[[str], Iterator[Document]]:
  """A converter taking every ``.c``/``.h`` file of the tarball matching ``tarball_pattern`` as
  one document, as it is, read as a stream (nothing of the tarball is unpacked to disk)."""

  def convert(root: str) -> Iterator[Document]:
    [path] = _files(root, tarball_pattern)
    try:
      with tarfile.open(path, "r|*") as tar:
        for member in tar:
          if member.isfile() and member.name.endswith((".c", ".h")):
            yield member.name, tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as e:
      raise records.DataError(f"{path}: damaged tar archive: {e}") from None

  return convert


GPL = "GPL-2"
CORPORA: Dict[str, Tuple[Source, ...]] = {
    "english": (
        Source("dict-gcide", "GPL-3+", gcide),
        Source("linux-doc-6.1", GPL, whole_files(
            "usr/share/doc/linux-doc-6.1/html/_sources/**/*.rst.txt", exclude="/translations/")),
        Source("sword-comm-tdavid", "public domain", sword),
        Source("wordnet-base", "WordNet (BSD-style)", wordnet),
        Source("python3.11-doc", "PSF-2.0", whole_files(
            "usr/share/doc/python3.11/html/_sources/**/*.rst.txt")),
        Source("perl-doc", "Artistic or GPL-1+", whole_files("usr/share/perl/5.36.0/pod/*.pod")),
        Source("postgresql-doc-15", "PostgreSQL", html_pages(
            "usr/share/doc/postgresql-doc-15/html/*.html")),
        Source("sword-text-web", "public domain", sword),
        Source("sword-comm-mhcc", "public domain", sword),
        Source("fortunes", "BSD-4-clause and public domain", fortunes),
        Source("fortunes-min", "BSD-4-clause and public domain", fortunes),
    ),
    "kernel": (
        Source("linux-source-6.1", GPL, c_source("usr/src/linux-source-6.1.tar.*")),
    ),
}


def main(argv: Sequence[str]) -> None:
  """Builds the corpus named by --corpus into --output_dir (resumable; reused when complete)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  pinned_to = None
  if FLAGS.pinned_to:
    try:
      with open(FLAGS.pinned_to) as f:
        pinned_to = json.load(f)
    except (OSError, ValueError) as e:
      raise app.UsageError(f"--pinned_to={FLAGS.pinned_to}: not a readable manifest: {e}")
  manifest = corpus.build(FLAGS.output_dir, CORPORA[FLAGS.corpus], vocab_size=FLAGS.vocab_size,
                          debs_dir=FLAGS.debs_dir, bad_lines=FLAGS.bad_lines,
                          sample_fraction=FLAGS.sample_fraction, split_by=FLAGS.split_by,
                          pinned_to=pinned_to)
  print(corpus.describe(manifest))


if __name__ == "__main__":
  flags.DEFINE_enum("corpus", "english", list(CORPORA), "Which corpus to build.")
  flags.DEFINE_string("output_dir", None, "Where the corpus goes (built in <output_dir>.partial, "
                      "then renamed).", required=True)
  flags.DEFINE_integer("vocab_size", 8192, "Subword (byte-level BPE) vocabulary size.")
  flags.DEFINE_string("debs_dir", None, "A folder with the packages' .deb files already "
                      "downloaded (default: <output_dir>.debs, filled by apt-get download "
                      "and kept).")
  flags.DEFINE_enum("bad_lines", "error", list(records.BAD_LINE_POLICIES),
                    "A document that is not UTF-8: fail naming it, or skip and count it.")
  flags.DEFINE_float("sample_fraction", 1.0, "Keep this fraction of the documents (chosen by a "
                     "hash of their names), e.g. 0.25 of the kernel's C files.")
  flags.DEFINE_enum("split_by", "name", list(corpus.SPLIT_KEYS), "What decides a document's "
                    "split: a hash of its name, or of its content (copies of one file under "
                    "several names stay on one side: use it for the kernel).")
  flags.DEFINE_string("pinned_to", None, "A recorded manifest.json (e.g. a suite's "
                      "benchmarks/results/<suite>/corpus_manifest.json): build from exactly the "
                      "package versions it names (`apt-get download NAME=VERSION`, sha256 "
                      "checked), so a fresh machine rebuilds the same corpus.")
  FLAGS = flags.FLAGS
  app.run(main)
