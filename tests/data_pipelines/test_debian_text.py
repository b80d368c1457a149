"""Tests of the Debian formats' converters, on real (small) packages extracted with dpkg-deb."""

import os
import subprocess

import pytest

from data_pipelines import debian_text
from data_pipelines import records

import debian_fixtures


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
  """package -> the root its fixture .deb was extracted to (dpkg-deb -x)."""
  base = tmp_path_factory.mktemp("debs")
  roots = {}
  for package, files in debian_fixtures.english_packages().items():
    deb = debian_fixtures.make_deb(str(base), package, files)
    roots[package] = str(base / f"x-{package}")
    subprocess.run(["dpkg-deb", "-x", deb, roots[package]], check=True)
  return roots


def _docs(convert, root):
  return {name: text.decode("utf-8") for name, text in convert(root)}


def test_gcide_pages_without_source_tags_or_braces(extracted):
  docs = _docs(debian_text.gcide, extracted["dict-gcide"])
  assert list(docs) == ["usr/share/dictd/gcide.dict.dz#0"]  # 3 entries: one page
  [text] = docs.values()
  assert "Abacus" in text and "Abandon" in text and "calculating frame" in text
  assert "[1913 Webster]" not in text and "[PJC]" not in text and "{" not in text
  assert "00-database" not in text


def test_wordnet_glosses_only(extracted):
  [text] = _docs(debian_text.wordnet, extracted["wordnet-base"]).values()
  assert text.split("\n\n") == [g.decode() for g in debian_fixtures.GLOSSES]


def test_wordnet_line_without_gloss_names_the_line(tmp_path):
  path = tmp_path / "usr/share/wordnet/data.noun"
  path.parent.mkdir(parents=True)
  path.write_bytes(b"  1 header\n00001 03 n 01 word 0 000 no bar here\n")
  with pytest.raises(records.DataError, match=r"data.noun:2: a synset line without"):
    list(debian_text.wordnet(str(tmp_path)))


def test_sword_blocks_without_markup_or_notes(extracted):
  docs = _docs(debian_text.sword, extracted["sword-text-web"])
  assert sorted(docs) == [f"usr/share/sword/modules/texts/ztext/web/ot.bzs#{i}" for i in (0, 1)]
  first = docs["usr/share/sword/modules/texts/ztext/web/ot.bzs#0"]
  assert first.startswith("Genesis\n\nIn the beginning God created the heavens and the earth.")
  assert "The earth was formless & empty." in first
  assert "<" not in first and "footnote" not in first and "strong" not in first


def test_damaged_sword_block_names_file_and_block(tmp_path):
  files = debian_fixtures.sword_module([b"<p>one</p>", b"<p>two</p>"], "m/ot")
  data = bytearray(files["m/ot.bzz"])
  data[-3:] = b"xyz"
  for name, content in [("m/ot.bzs", files["m/ot.bzs"]), ("m/ot.bzz", bytes(data))]:
    os.makedirs(tmp_path / "m", exist_ok=True)
    (tmp_path / name).write_bytes(content)
  with pytest.raises(records.DataError, match=r"ot.bzz: block 1 .* is not zlib data"):
    list(debian_text.sword_blocks(str(tmp_path / "m/ot.bzs")))
  (tmp_path / "m/ot.bzs").write_bytes(files["m/ot.bzs"][:-1])
  with pytest.raises(records.DataError, match=r"not a whole number of 12-byte index records"):
    list(debian_text.sword_blocks(str(tmp_path / "m/ot.bzs")))


def test_html_text_without_navigation_scripts_or_styles(extracted):
  convert = debian_text.html_pages("usr/share/doc/postgresql-doc-15/html/*.html")
  [text] = _docs(convert, extracted["postgresql-doc-15"]).values()
  assert text == "initdb\n\ninitdb\n\ninitdb creates a new PostgreSQL database cluster."


def test_fortunes_without_index_or_separators(extracted):
  docs = _docs(debian_text.fortunes, extracted["fortunes"])
  assert list(docs) == ["usr/share/games/fortunes/wisdom"]
  assert docs["usr/share/games/fortunes/wisdom"] == (
      "Do not meddle in the affairs of wizards.\n\nA bird in the hand.")


def test_whole_files_and_missing_files(extracted):
  convert = debian_text.whole_files("usr/share/perl/5.36.0/pod/*.pod")
  assert list(_docs(convert, extracted["perl-doc"])) == ["usr/share/perl/5.36.0/pod/perlintro.pod"]
  with pytest.raises(records.DataError, match=r"no files match .*\.rst\.txt"):
    list(debian_text.whole_files("usr/share/doc/**/*.rst.txt")(extracted["perl-doc"]))


def test_c_source_reads_c_and_h_files_from_the_tarball(extracted):
  convert = debian_text.c_source("usr/src/linux-source-6.1.tar.*")
  docs = _docs(convert, extracted["linux-source-6.1"])
  assert sorted(docs) == ["linux-source-6.1/include/linux/list.h", "linux-source-6.1/kernel/fork.c"]
  assert docs["linux-source-6.1/kernel/fork.c"] == debian_fixtures.C_FILES[
      "linux-source-6.1/kernel/fork.c"].decode()


def test_damaged_tarball_names_the_file(tmp_path):
  path = tmp_path / "usr/src/linux-source-6.1.tar.xz"
  path.parent.mkdir(parents=True)
  path.write_bytes(debian_fixtures.tarball(debian_fixtures.C_FILES)[:60])
  with pytest.raises(records.DataError, match=r"linux-source-6.1.tar.xz: damaged tar archive"):
    list(debian_text.c_source("usr/src/linux-source-6.1.tar.*")(str(tmp_path)))


def test_corpora_name_every_package_once():
  for name, sources in debian_text.CORPORA.items():
    packages = [s.package for s in sources]
    assert len(set(packages)) == len(packages), name
    assert all(s.licence for s in sources)
