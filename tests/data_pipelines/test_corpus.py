"""Tests of the corpus builder on real .deb files: provenance, split by document, tokens, errors."""

import hashlib
import json
import os
import re

import numpy as np
import pytest

from data_pipelines import corpus
from data_pipelines import debian_text
from data_pipelines import records
from data_pipelines import token_lm

import debian_fixtures

VOCAB = 300
FIXTURE_PACKAGES = ("dict-gcide", "wordnet-base", "sword-text-web", "postgresql-doc-15",
                    "perl-doc", "fortunes")
SOURCES = tuple(s for s in debian_text.CORPORA["english"] if s.package in FIXTURE_PACKAGES)


@pytest.fixture()
def debs(tmp_path):
  """A folder with every fixture package's .deb (as `apt-get download` leaves them)."""
  out = tmp_path / "debs"
  out.mkdir()
  for package, files in debian_fixtures.english_packages().items():
    debian_fixtures.make_deb(str(out), package, files)
  return str(out)


def _build(tmp_path, debs, **kwargs):
  kwargs = {"vocab_size": VOCAB, "debs_dir": debs, "eval_fraction": 0.3, "train_shards": 2,
            "eval_shards": 1, **kwargs}
  return corpus.build(str(tmp_path / "english"), SOURCES, **kwargs)


def test_build_records_provenance_and_splits_by_document(tmp_path, debs):
  manifest = _build(tmp_path, debs)
  out = tmp_path / "english"
  assert sorted(os.listdir(out)) == ["manifest.json", "text", "tokens"]
  assert not os.path.exists(str(out) + ".partial")
  by_package = {p["package"]: p for p in manifest["packages"]}
  assert list(by_package) == [s.package for s in SOURCES] and len(SOURCES) == 6
  gcide = by_package["dict-gcide"]
  with open(os.path.join(debs, gcide["deb"]), "rb") as f:
    assert gcide["sha256"] == hashlib.sha256(f.read()).hexdigest()
  assert gcide["version"] == "1.0-1" and gcide["licence"] == "GPL-3+"
  assert by_package["sword-text-web"]["documents"] == 2
  names = {}
  for split in corpus.SPLITS:
    for path in sorted((out / "text").glob(f"{split}-*.jsonl")):
      names[split] = names.get(split, set()) | {
          (d["package"], d["name"]) for d in map(json.loads, path.read_text().splitlines())}
  assert names["train"] and names["eval"] and not names["train"] & names["eval"]
  documents = sum(p["documents"] for p in manifest["packages"])
  assert len(names["train"]) + len(names["eval"]) == documents
  assert manifest["splits"]["train"]["documents"] == len(names["train"])


def test_token_shards_decode_to_the_documents_and_counts_add_up(tmp_path, debs):
  manifest = _build(tmp_path, debs)
  tokens_dir = tmp_path / "english" / "tokens"
  tokenizer = token_lm.load_tokenizer(str(tokens_dir / token_lm.TOKENIZER_FILE))
  assert tokenizer.get_vocab_size() == VOCAB
  text_shard = tmp_path / "english" / "text" / "train-00000-of-00002.jsonl"
  texts = [json.loads(line)["text"] for line in text_shard.read_text().splitlines()]
  ids = corpus.shard_tokens(str(tokens_dir / "train-00000-of-00002.tfrecord"))
  documents = np.split(ids, np.flatnonzero(ids == token_lm.EOS_ID) + 1)[:-1]
  assert [tokenizer.decode(d[:-1].tolist()) for d in documents] == texts
  counts = token_lm.read_counts(str(tokens_dir / token_lm.COUNTS_FILE))
  assert counts.sum() == manifest["splits"]["train"]["tokens"] == corpus.share_tokens(manifest)
  assert (corpus.share_tokens(manifest, 0, 2) + corpus.share_tokens(manifest, 1, 2)
          == manifest["splits"]["train"]["tokens"])


def test_a_finished_corpus_is_reused_and_other_settings_refused(tmp_path, debs, monkeypatch):
  first = _build(tmp_path, debs)
  monkeypatch.setattr(corpus, "convert_package", lambda *a: pytest.fail("rebuilt"))
  assert _build(tmp_path, debs) == first
  with pytest.raises(records.DataError, match=r"built with other settings \(vocab_size: \[300\]"):
    _build(tmp_path, debs, vocab_size=320)


def test_a_stopped_build_resumes_and_is_never_used_half_built(tmp_path, debs, monkeypatch):
  def stop(*args):
    raise KeyboardInterrupt

  monkeypatch.setattr(corpus, "tokenize_shards", stop)
  with pytest.raises(KeyboardInterrupt):
    _build(tmp_path, debs)
  partial = tmp_path / "english.partial"
  assert (partial / "docs" / "fortunes.json").exists() and not (tmp_path / "english").exists()
  with pytest.raises(FileNotFoundError, match="not a finished corpus"):
    corpus.read_manifest(str(tmp_path / "english"))
  monkeypatch.undo()
  # Resumed: every package's documents are reused (no .deb is opened again).
  monkeypatch.setattr(corpus, "fetch_deb", lambda *a: pytest.fail("converted again"))
  manifest = _build(tmp_path, debs)
  assert manifest["splits"]["train"]["tokens"] > 0 and not partial.exists()


def test_a_document_that_is_not_utf8_fails_or_is_counted(tmp_path):
  debs = tmp_path / "debs"
  debs.mkdir()
  files = {"usr/share/games/fortunes/latin": b"caf\xe9\n%\nplain\n",
           "usr/share/games/fortunes/wisdom":
               b"A bird in the hand is worth two in the bush.\n" * 20}
  debian_fixtures.make_deb(str(debs), "fortunes", files)
  sources = [s for s in SOURCES if s.package == "fortunes"]
  with pytest.raises(records.DataError, match=r"fortunes .* document usr/share/games/fortunes/"
                                              r"latin: not UTF-8 at byte 3"):
    corpus.build(str(tmp_path / "a"), sources, vocab_size=270, debs_dir=str(debs),
                 train_shards=1, eval_shards=1, eval_fraction=1e-9)
  manifest = corpus.build(str(tmp_path / "b"), sources, vocab_size=270, debs_dir=str(debs),
                          bad_lines="skip", train_shards=1, eval_shards=1, eval_fraction=1e-9)
  assert manifest["packages"][0]["skipped_documents"] == 1
  assert manifest["packages"][0]["skipped_names"] == ["usr/share/games/fortunes/latin"]
  assert manifest["packages"][0]["documents"] == 1


def test_copies_of_a_file_under_other_names_stay_on_one_side_when_split_by_content(tmp_path):
  debs = tmp_path / "debs"
  debs.mkdir()
  same = b"The same fortune under many names, a copy of one file.\n" * 4
  files = {f"usr/share/games/fortunes/copy{i}": same for i in range(40)}
  files.update({f"usr/share/games/fortunes/own{i}": f"Fortune number {i} is its own.\n".encode()
                * 4 for i in range(40)})
  debian_fixtures.make_deb(str(debs), "fortunes", files)
  sources = [s for s in SOURCES if s.package == "fortunes"]

  def sides(split_by):
    out = tmp_path / split_by
    corpus.build(str(out), sources, vocab_size=270, debs_dir=str(debs), train_shards=1,
                 eval_shards=1, eval_fraction=0.3, split_by=split_by)
    return {split: {json.loads(line)["name"] for path in (out / "text").glob(f"{split}-*.jsonl")
                    for line in path.read_text().splitlines()} for split in corpus.SPLITS}

  by_name = sides("name")
  copies = {f"usr/share/games/fortunes/copy{i}" for i in range(40)}
  assert by_name["train"] & copies and by_name["eval"] & copies  # the copies on both sides
  by_content = sides("content")
  assert copies <= by_content["train"] or copies <= by_content["eval"]
  assert by_content["train"] - copies and by_content["eval"] - copies
  settings = json.loads((tmp_path / "content" / "manifest.json").read_text())["settings"]
  assert settings["split_by"] == "content"
  assert "split_by" not in json.loads((tmp_path / "name" / "manifest.json").read_text())[
      "settings"]  # as corpora built before the setting existed record it
  with pytest.raises(ValueError, match="split_by"):
    corpus.build(str(tmp_path / "x"), sources, debs_dir=str(debs), split_by="path")


def test_a_build_stopped_while_finishing_only_finishes(tmp_path, debs, monkeypatch):
  renames = []

  def stop_at_rename(src, dst):
    renames.append(dst)
    raise KeyboardInterrupt

  monkeypatch.setattr(corpus.os, "rename", stop_at_rename)
  with pytest.raises(KeyboardInterrupt):
    _build(tmp_path, debs)
  partial_manifest = tmp_path / "english.partial" / "manifest.json"
  assert partial_manifest.exists() and renames
  monkeypatch.undo()
  other = json.loads(partial_manifest.read_text())
  other["packages"][-1]["sha256"] = "0" * 64
  with pytest.raises(records.DataError, match=r"english.partial holds fortunes 1.0-1 .*not the "
                                              r"recorded 1.0-1"):
    _build(tmp_path, debs, pinned_to=other)
  for stage in ("convert_package", "split_documents", "tokenizer_for", "tokenize_shards"):
    monkeypatch.setattr(corpus, stage, lambda *a, **k: pytest.fail("built again"))
  manifest = _build(tmp_path, debs)
  assert manifest == corpus.read_manifest(str(tmp_path / "english"))
  assert not (tmp_path / "english.partial").exists()


def test_the_debs_are_kept_beside_the_corpus_by_default(tmp_path, debs):
  kept = tmp_path / "english.debs"
  kept.mkdir()
  for name in os.listdir(debs):
    os.link(os.path.join(debs, name), kept / name)
  manifest = _build(tmp_path, debs, debs_dir=None)
  assert sorted(os.listdir(kept)) == sorted(os.listdir(debs))
  assert {p["deb"] for p in manifest["packages"]} <= set(os.listdir(kept))


def test_a_literal_end_of_document_in_a_text_is_encoded_as_text(tmp_path, debs):
  _build(tmp_path, debs)
  tokenizer = token_lm.load_tokenizer(
      str(tmp_path / "english" / "tokens" / token_lm.TOKENIZER_FILE))
  [ids] = token_lm.encode(tokenizer, ["a <eos> b"])
  assert list(ids).count(token_lm.EOS_ID) == 1 and ids[-1] == token_lm.EOS_ID
  assert tokenizer.decode(ids[:-1].tolist()) == "a <eos> b"


def test_a_corrupt_deb_and_a_missing_package_are_named(tmp_path, debs, monkeypatch):
  with open(os.path.join(debs, "perl-doc_1.0-1_all.deb"), "r+b") as f:
    f.truncate(100)
  with pytest.raises(records.DataError, match=r"perl-doc_1.0-1_all.deb: not a readable Debian "
                                              r"package"):
    _build(tmp_path, debs)
  empty = tmp_path / "no-debs"
  monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no apt-get here
  with pytest.raises(records.DataError, match=r"downloading dict-gcide .*`apt-get` is not "
                                              r"installed"):
    corpus.fetch_deb("dict-gcide", str(empty))


def test_an_existing_folder_that_is_not_a_corpus_is_refused(tmp_path, debs):
  (tmp_path / "english").mkdir()
  (tmp_path / "english" / "notes.txt").write_text("mine")
  with pytest.raises(records.DataError, match=r"exists without manifest.json"):
    _build(tmp_path, debs)


def _another_build(debs, package, version, text=b"Another build of the package.\n" * 30):
  """A .deb of ``package`` at ``version`` with other content than the fixture's."""
  return debian_fixtures.make_deb(debs, package, {f"usr/share/games/fortunes/{package}": text},
                                  version=version)


def test_a_pinned_build_takes_the_recorded_version_and_sha256(tmp_path, debs):
  recorded = _build(tmp_path, debs)
  _another_build(debs, "fortunes", "2.0-1")  # Debian moved the package on since
  with pytest.raises(records.DataError, match=r"expected one fortunes_\*_\*.deb"):
    corpus.build(str(tmp_path / "unpinned"), SOURCES, vocab_size=VOCAB, debs_dir=debs,
                 eval_fraction=0.3, train_shards=2, eval_shards=1)
  rebuilt = corpus.build(str(tmp_path / "again"), SOURCES, vocab_size=VOCAB, debs_dir=debs,
                         eval_fraction=0.3, train_shards=2, eval_shards=1, pinned_to=recorded)
  assert rebuilt["packages"] == recorded["packages"]
  assert corpus.fingerprint(rebuilt) == corpus.fingerprint(recorded)
  assert rebuilt["splits"] == recorded["splits"]
  # A finished corpus is reused only when it holds the pinned builds.
  assert _build(tmp_path, debs, pinned_to=recorded) == recorded
  moved = json.loads(json.dumps(recorded))
  moved["packages"][-1]["version"] = "2.0-1"
  moved["packages"][-1]["sha256"] = "0" * 64
  with pytest.raises(records.DataError, match=r"english holds fortunes 1.0-1 \(sha256 \w+\), "
                                              r"not the recorded 2.0-1"):
    _build(tmp_path, debs, pinned_to=moved)


def test_a_pinned_build_refuses_another_build_of_the_same_version(tmp_path, debs):
  recorded = _build(tmp_path, debs)
  os.remove(os.path.join(debs, "fortunes_1.0-1_all.deb"))
  rebuilt = _another_build(debs, "fortunes", "1.0-1")
  with pytest.raises(records.DataError, match=rf"{re.escape(rebuilt)}: sha256 \w+ is not the "
                                              r"recorded "
                                              rf"{recorded['packages'][-1]['sha256']} of "
                                              r"fortunes 1.0-1"):
    _build(tmp_path / "b", debs, pinned_to=recorded)


def test_a_pinned_version_is_found_as_apt_names_it_or_downloaded_by_name(tmp_path, monkeypatch):
  debs = str(tmp_path / "debs")
  os.makedirs(debs)
  deb = _another_build(debs, "fortunes", "1:2.0-1")
  apt_named = os.path.join(debs, "fortunes_1%3a2.0-1_all.deb")  # as `apt-get download` names it
  os.rename(deb, apt_named)
  with open(apt_named, "rb") as f:
    pin = {"version": "1:2.0-1", "sha256": hashlib.sha256(f.read()).hexdigest()}
  assert corpus.fetch_deb("fortunes", debs, pin) == apt_named
  monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no apt-get here
  with pytest.raises(records.DataError, match=r"downloading fortunes=1:3.0-1 .*`apt-get` is not "
                                              r"installed"):
    corpus.fetch_deb("fortunes", debs, {"version": "1:3.0-1", "sha256": pin["sha256"]})


def test_a_recorded_manifest_without_a_package_is_refused(tmp_path, debs):
  recorded = _build(tmp_path, debs)
  recorded["packages"] = recorded["packages"][:-1]
  with pytest.raises(records.DataError, match=r"pinned to has no \['fortunes'\]"):
    _build(tmp_path / "b", debs, pinned_to=recorded)
