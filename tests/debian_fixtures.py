"""Small real Debian packages for the corpus builder's tests, built with ``dpkg-deb --build``.

Each package holds its format as the archive's package does (a gzip dictionary, WordNet data
files, a zText SWORD module, HTML pages, POD, fortune files, a C source tarball), only smaller.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import struct
import subprocess
import tarfile
import zlib
from typing import Dict, Mapping, Sequence

Files = Mapping[str, bytes]  # path inside the package -> contents


def make_deb(out_dir: str, package: str, files: Files, version: str = "1.0-1") -> str:
  """Builds ``<package>_<version>_all.deb`` in ``out_dir`` from ``files``; returns its path."""
  root = os.path.join(out_dir, f"{package}-root")
  os.makedirs(os.path.join(root, "DEBIAN"))
  with open(os.path.join(root, "DEBIAN", "control"), "w") as f:
    f.write(f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
            f"Maintainer: tests <tests@localhost>\nDescription: a test fixture\n")
  for path, data in files.items():
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
      f.write(data)
  deb = os.path.join(out_dir, f"{package}_{version}_all.deb")
  subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, deb], check=True,
                 capture_output=True)
  shutil.rmtree(root)
  return deb


def sword_module(blocks: Sequence[bytes], prefix: str) -> Dict[str, bytes]:
  """The index (``.bzs``: offset, size, uncompressed size) and data (``.bzz``) of a zText module."""
  index, data = b"", b""
  for block in blocks:
    packed = zlib.compress(block)
    index += struct.pack("<III", len(data), len(packed), len(block))
    data += packed
  return {f"{prefix}.bzs": index, f"{prefix}.bzz": data}


def tarball(members: Mapping[str, bytes], compression: str = "xz") -> bytes:
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode=f"w:{compression}") as tar:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return buffer.getvalue()


ENTRIES = [b"Abacus \\Ab\"a*cus\\, n. A {calculating} frame with beads.\n   [1913 Webster]",
           b"Abaft \\A*baft\\, adv. Toward the stern of a ship.\n   [1913 Webster]",
           b"Abandon \\A*ban\"don\\, v. t. To give up wholly.\n   [PJC]"]
GLOSSES = [b"a plant or animal that is atypically small", b"an organism that needs others",
           b"an organism from which younger ones are obtained"]
VERSES = [b'<div type="book" osisID="Gen"/><title>Genesis</title><chapter n="1"/>'
          b'<w lemma="strong:H7225">In the beginning</w> God created the heavens and the earth.'
          b'<note type="x-footnote">a footnote</note> The earth was formless &amp; empty.',
          b'<div type="book" osisID="Exod"/><title>Exodus</title>Now these are the names.']
PAGE = (b'<html><head><title>initdb</title><style>p {}</style></head><body>'
        b'<div class="navheader"><table><tr><td>Prev</td><td>Next</td></tr></table></div>'
        b'<h1>initdb</h1><p>initdb creates a new <em>PostgreSQL</em> database cluster.</p>'
        b'<script>var x = 1;</script><div class="navfooter">Home</div></body></html>')
C_FILES = {"linux-source-6.1/kernel/fork.c":
               b"int nr_threads;\n/* fork */\nint fork(void) { return 0; }\n",
           "linux-source-6.1/include/linux/list.h":
               b"struct list_head { struct list_head *next; };\n",
           "linux-source-6.1/README": b"Linux kernel\n"}


def english_packages() -> Dict[str, Dict[str, bytes]]:
  """Package name -> files of a small form of every format of the english corpus."""
  wordnet_header = b"  1 This software and database is being provided\n  2 WordNet 3.0\n"
  wordnet_lines = b"".join(b"0000%d 03 n 01 word%d 0 000 | %s  \n" % (i, i, g)
                           for i, g in enumerate(GLOSSES))
  fortune = b"Do not meddle in the affairs of wizards.\n%\nA bird in the hand.\n%\n"
  return {
      "dict-gcide": {"usr/share/dictd/gcide.dict.dz": gzip.compress(
          b"00-database-info\n   the header\n\n" + b"\n\n".join(ENTRIES) + b"\n")},
      "wordnet-base": {"usr/share/wordnet/data.noun": wordnet_header + wordnet_lines},
      "sword-text-web": {
          "usr/share/sword/mods.d/web.conf": b"[WEB]\nDataPath=./modules/texts/ztext/web/\n",
          **sword_module(VERSES, "usr/share/sword/modules/texts/ztext/web/ot")},
      "postgresql-doc-15": {"usr/share/doc/postgresql-doc-15/html/app-initdb.html": PAGE},
      "perl-doc": {"usr/share/perl/5.36.0/pod/perlintro.pod":
                   b"=head1 NAME\n\nperlintro - a brief introduction\n"},
      "fortunes": {"usr/share/games/fortunes/wisdom": fortune,
                   "usr/share/games/fortunes/wisdom.dat": b"\x00\x00\x00\x02binary index"},
      "linux-source-6.1": {"usr/src/linux-source-6.1.tar.xz": tarball(C_FILES)},
  }


def fortunes_package(words: int, seed: int = 0) -> Dict[str, bytes]:
  """A fortunes package of ``words`` words of made-up English in fortunes of 5-30 words (enough
  text for a few hundred training steps of a toy language model without repeating it)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  vocabulary = ("the a of to and in is it that was he for on are with as his they be at one have "
                "this from or had by hot word but what some we can out other were all there when "
                "up use your how said an each she which do their time if will way about many then "
                "them write would like so these her long make thing see him two has look more day "
                "could go come did number sound no most people my over know water than call first "
                "who may down side been now find").split()
  rng = np.random.default_rng(seed)
  fortunes, left = [], words
  while left > 0:
    n = min(left, int(rng.integers(5, 31)))
    fortunes.append(" ".join(rng.choice(vocabulary, n)).capitalize() + ".")
    left -= n
  files = {}
  for part in range(8):  # 8 documents (fortune files)
    chosen = fortunes[part::8]
    files[f"usr/share/games/fortunes/part{part}"] = ("\n%\n".join(chosen) + "\n%\n").encode()
  return files


def every_english_package(words: int = 30_000) -> Dict[str, Dict[str, bytes]]:
  """Package name -> files for every package of the english corpus (the formats of
  ``english_packages``, reST for the two documentation packages, the SWORD commentaries in
  their own modules), the fortunes holding ``words`` words of made-up text in many files, so
  that a toy corpus fills the default 64 training and 8 validation shards."""
  packages = english_packages()
  del packages["linux-source-6.1"]
  rst = b"Title\n=====\n\nSome *reStructuredText* with ``code``.\n"
  packages["linux-doc-6.1"] = {
      "usr/share/doc/linux-doc-6.1/html/_sources/PCI/pci.rst.txt": rst,
      "usr/share/doc/linux-doc-6.1/html/_sources/translations/it/pci.rst.txt": b"Titolo\n"}
  packages["python3.11-doc"] = {
      "usr/share/doc/python3.11/html/_sources/tutorial/index.rst.txt": rst}
  for name in ("sword-comm-tdavid", "sword-comm-mhcc"):
    packages[name] = sword_module(VERSES[::-1], f"usr/share/sword/modules/comments/zcom/{name}/ot")
  fortunes = {}
  for part in range(250):
    fortunes.update({k.replace("part", f"set{part}_"): v for k, v in
                     fortunes_package(words // 250, seed=part).items()})
  packages["fortunes"] = fortunes
  packages["fortunes-min"] = {"usr/share/games/fortunes/fortunes": b"Short.\n%\nShorter.\n%\n"}
  return packages
