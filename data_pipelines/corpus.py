"""Builds a language-modelling corpus from Debian packages: resumable, atomic, with provenance.

``build(output_dir, sources)`` goes through these stages inside ``<output_dir>.partial`` (each
stage's output written atomically, so a build stopped at any point resumes where it stopped):

  1. each package's ``.deb``: taken from ``debs_dir`` (default ``<output_dir>.debs``, kept
     after the build so that the same machine rebuilds from the same files) when there, else
     ``apt-get download`` (no root needed; with ``pinned_to``, a recorded manifest, exactly
     the version it names, its sha256 checked); checked and versioned with ``dpkg-deb -f``,
     hashed (sha256), extracted with ``dpkg-deb -x``, converted to documents
     (``Source.convert``) into ``docs/<package>.jsonl``; the extracted tree is removed;
  2. the split, by document: a document goes to validation when the hash of ``package/name``
     (``split_by='name'``) or of ``package/text`` (``split_by='content'``: copies of one file
     under several names, as the kernel's ``tools/`` mirrors of its headers, stay on one side)
     falls in the first ``eval_fraction`` (so validation documents never appear in training),
     and to one of the split's shards by another part of the same hash; ``text/`` holds the
     shards as JSON Lines (``{"package", "name", "text"}``);
  3. a byte-level BPE tokenizer trained on the training shards only (``tokens/tokenizer.json``);
  4. pre-tokenized TFRecord shards (``tokens/{train,eval}-NNNNN-of-NNNNN.tfrecord``, see
     token_lm) and the training split's token counts (``tokens/token_counts.tsv``);
  5. ``manifest.json`` (packages, versions, licences, sha256 of each ``.deb``, documents, words,
     tokens, skipped documents and the first names of those), then ``<output_dir>.partial`` is
     renamed to ``output_dir`` (a build stopped after its manifest only finishes that).

A corpus directory without its manifest is never used; one with a manifest is reused when its
settings match and refused (naming the difference) when they do not.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import shutil
import subprocess
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from data_pipelines import records
from data_pipelines import token_lm

Document = Tuple[str, bytes]  # (name inside the package, UTF-8 text as read)
MANIFEST = "manifest.json"
SPLITS = ("train", "eval")
_ENCODE_BATCH = 512
_NAMES_KEPT = 100  # skipped documents named in a package's record
SPLIT_KEYS = ("name", "content")


@dataclasses.dataclass(frozen=True)
class Source:
  """One Debian package of a corpus: its name, licence and converter to documents."""
  package: str
  licence: str
  convert: Callable[[str], Iterator[Document]]


def _run(command: Sequence[str], what: str, **kwargs) -> str:
  """Runs a dpkg/apt command; a failure is a DataError saying ``what`` failed, with its stderr."""
  try:
    done = subprocess.run(list(command), capture_output=True, text=True, check=False, **kwargs)
  except FileNotFoundError:
    raise records.DataError(f"{what}: `{command[0]}` is not installed here (Debian's "
                            f"{'apt' if command[0] == 'apt-get' else 'dpkg'} package)") from None
  if done.returncode:
    raise records.DataError(f"{what}: `{' '.join(command)}` exited with {done.returncode}: "
                            f"{done.stderr.strip()[-500:]}")
  return done.stdout


def _matching_debs(package: str, debs_dir: str, version: Optional[str]) -> List[str]:
  """The package's ``.deb`` files in ``debs_dir`` (of ``version`` only, when given: named as
  ``apt-get download`` names them, epoch as ``%3a``, or as the archive's pool does, without it)."""
  if version is None:
    return sorted(glob.glob(os.path.join(debs_dir, f"{package}_*.deb")))
  names = {f"{package}_{version.replace(':', '%3a')}_", f"{package}_{version.split(':')[-1]}_"}
  return sorted(path for path in glob.glob(os.path.join(debs_dir, f"{package}_*.deb"))
                if any(os.path.basename(path).startswith(name) for name in names))


def fetch_deb(package: str, debs_dir: str, pin: Optional[Mapping[str, str]] = None) -> str:
  """The package's ``.deb`` in ``debs_dir``, downloaded there with ``apt-get download`` if
  absent. With ``pin`` (``version`` and ``sha256``, as a recorded manifest has them) it is
  exactly that build: ``apt-get download NAME=VERSION``, its sha256 checked."""
  os.makedirs(debs_dir, exist_ok=True)
  version = pin["version"] if pin else None
  wanted = f"{package}={version}" if pin else package
  found = _matching_debs(package, debs_dir, version)
  if not found:
    _run(["apt-get", "download", wanted],
         f"downloading {wanted} (run `apt-get update`, or put {package}_*.deb into {debs_dir})",
         cwd=debs_dir)
    found = _matching_debs(package, debs_dir, version)
  if len(found) != 1:
    raise records.DataError(f"{debs_dir}: expected one {package}_{version or '*'}_*.deb, found "
                            f"{found}")
  actual = _sha256(found[0]) if pin else None
  if pin and actual != pin["sha256"]:
    raise records.DataError(f"{found[0]}: sha256 {actual} is not the recorded "
                            f"{pin['sha256']} of {package} {version}: another build of the "
                            f"package; remove the file to download the recorded one")
  return found[0]


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def _doc_hash(package: str, name: str) -> Tuple[float, int]:
  """(a uniform number in [0, 1), a shard number) from the document's identity."""
  digest = hashlib.sha256(f"{package}/{name}".encode("utf-8")).digest()
  return (int.from_bytes(digest[:8], "little") / 2.0 ** 64,
          int.from_bytes(digest[8:16], "little"))


def _documents(source: Source, root: str, deb: str, bad_lines: str,
               sample_fraction: float, stats: Dict) -> Iterator[dict]:
  """The package's documents as JSON records (UTF-8 checked, sampled), counting into ``stats``."""
  for name, raw in source.convert(root):
    if sample_fraction < 1.0 and _doc_hash("sample/" + source.package, name)[0] >= sample_fraction:
      continue
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      if bad_lines == "error":
        raise records.DataError(
            f"{source.package} ({deb}): document {name}: not UTF-8 at byte {e.start}; bind "
            f"--bad_lines=skip to skip and count such documents") from None
      stats["skipped_documents"] += 1
      if len(stats["skipped_names"]) < _NAMES_KEPT:
        stats["skipped_names"].append(name)
      logging.warning("%s: skipped %s: not UTF-8 at byte %d", source.package, name, e.start)
      continue
    if not text.strip():
      continue
    stats["documents"] += 1
    stats["words"] += len(text.split())
    stats["bytes"] += len(raw)
    yield {"package": source.package, "name": name, "text": text}


def convert_package(source: Source, debs_dir: str, work_dir: str, bad_lines: str,
                    sample_fraction: float, pin: Optional[Mapping[str, str]] = None) -> dict:
  """Stage 1 for one package (reused when done): its documents file and provenance record."""
  docs_path = os.path.join(work_dir, "docs", f"{source.package}.jsonl")
  record_path = docs_path[:-len(".jsonl")] + ".json"
  if os.path.exists(record_path):
    with open(record_path) as f:
      return json.load(f)
  deb = fetch_deb(source.package, debs_dir, pin)
  what = f"{deb}: not a readable Debian package (remove it to download it again)"
  version = _run(["dpkg-deb", "-f", deb, "Version"], what).strip()
  extracted = os.path.join(work_dir, "extracted", source.package)
  shutil.rmtree(extracted, ignore_errors=True)
  os.makedirs(extracted)
  _run(["dpkg-deb", "-x", deb, extracted], f"extracting {deb} (a damaged archive? remove it to "
       f"download it again)")
  stats: Dict = {"documents": 0, "words": 0, "bytes": 0, "skipped_documents": 0,
                 "skipped_names": []}
  os.makedirs(os.path.dirname(docs_path), exist_ok=True)
  with records.written_atomically(docs_path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    for doc in _documents(source, extracted, deb, bad_lines, sample_fraction, stats):
      f.write(json.dumps(doc, ensure_ascii=False) + "\n")
  shutil.rmtree(extracted)
  if not stats["documents"]:
    raise records.DataError(f"{source.package} ({deb}): no documents with text")
  record = {"package": source.package, "version": version, "licence": source.licence,
            "deb": os.path.basename(deb), "sha256": _sha256(deb), **stats}
  with records.written_atomically(record_path) as tmp, open(tmp, "w") as f:
    json.dump(record, f, indent=1)
  logging.info("%s %s: %d documents, %d words", source.package, version, stats["documents"],
               stats["words"])
  return record


def shard_name(split: str, index: int, count: int, suffix: str) -> str:
  return f"{split}-{index:05d}-of-{count:05d}.{suffix}"


def _read_jsonl(path: str) -> Iterator[dict]:
  with open(path, encoding="utf-8") as f:
    for line in f:
      yield json.loads(line)


def split_documents(work_dir: str, packages: Sequence[str], eval_fraction: float,
                    shards: Dict[str, int], split_by: str = "name") -> Dict[str, List[str]]:
  """Stage 2 (reused when done): the documents split by document into text shards."""
  text_dir = os.path.join(work_dir, "text")
  paths = {split: [os.path.join(text_dir, shard_name(split, i, n, "jsonl")) for i in range(n)]
           for split, n in shards.items()}
  done = os.path.join(text_dir, ".done")
  if os.path.exists(done):
    return paths
  os.makedirs(text_dir, exist_ok=True)
  temporary = {p: p + ".tmp" for split in SPLITS for p in paths[split]}
  outputs = {p: open(t, "w", encoding="utf-8") for p, t in temporary.items()}
  try:
    for package in packages:
      for doc in _read_jsonl(os.path.join(work_dir, "docs", f"{package}.jsonl")):
        key = doc["text"] if split_by == "content" else doc["name"]
        where, number = _doc_hash(doc["package"], key)
        split = "eval" if where < eval_fraction else "train"
        outputs[paths[split][number % shards[split]]].write(json.dumps(doc, ensure_ascii=False)
                                                           + "\n")
  finally:
    for f in outputs.values():
      f.close()
  for path, tmp in temporary.items():
    os.replace(tmp, path)
  open(done, "w").close()
  return paths


def _texts(paths: Sequence[str]) -> Iterator[str]:
  for path in paths:
    for doc in _read_jsonl(path):
      yield doc["text"]


def tokenizer_for(work_dir: str, train_texts: Sequence[str], vocab_size: int):
  """Stage 3 (reused when done): the BPE tokenizer trained on the training shards."""
  path = os.path.join(work_dir, "tokens", token_lm.TOKENIZER_FILE)
  if os.path.exists(path):
    return token_lm.load_tokenizer(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tokenizer = token_lm.train_tokenizer(_texts(train_texts), vocab_size)
  with records.written_atomically(path) as tmp:
    tokenizer.save(tmp)
  return tokenizer


def shard_tokens(path: str) -> np.ndarray:
  """All token ids of a TFRecord token shard, in order (uint16)."""
  blobs = [r.numpy() for r in tf.data.TFRecordDataset(path)]
  return np.frombuffer(b"".join(blobs), "<u2")


def tokenize_shards(tokenizer, text_paths: Dict[str, List[str]], tokens_dir: str,
                    vocab_size: int) -> Dict[str, List[dict]]:
  """Stage 4 (each shard reused when written): token shards, and the training token counts."""
  files: Dict[str, List[dict]] = {}
  counts = np.zeros([vocab_size], np.int64)
  for split in SPLITS:
    files[split] = []
    for text_path in text_paths[split]:
      path = os.path.join(tokens_dir, os.path.basename(text_path)[:-len("jsonl")] + "tfrecord")
      if not os.path.exists(path):
        texts = list(_texts([text_path]))
        encoded = (ids for start in range(0, len(texts), _ENCODE_BATCH)
                   for ids in token_lm.encode(tokenizer, texts[start:start + _ENCODE_BATCH]))
        token_lm.write_shard(path, encoded)
      ids = shard_tokens(path)
      documents = int(np.sum(ids == token_lm.EOS_ID))
      files[split].append({"file": os.path.basename(path), "documents": documents,
                           "tokens": int(ids.size)})
      if split == "train":
        counts += np.bincount(ids, minlength=vocab_size)
  token_lm.write_counts(tokenizer, counts, os.path.join(tokens_dir, token_lm.COUNTS_FILE))
  return files


def _settings(sources, vocab_size, bad_lines, sample_fraction, eval_fraction, shards,
              split_by) -> dict:
  settings = {"packages": [s.package for s in sources], "vocab_size": vocab_size,
              "bad_lines": bad_lines, "sample_fraction": sample_fraction,
              "eval_fraction": eval_fraction, "shards": dict(shards)}
  if split_by != "name":  # absent from the manifests of corpora built before it existed
    settings["split_by"] = split_by
  return settings


def _check_settings(path: str, settings: dict, directory: str) -> None:
  with open(path) as f:
    recorded = json.load(f)
  recorded = recorded.get("settings", recorded)
  if recorded != settings:
    differ = sorted(k for k in settings if recorded.get(k) != settings[k])
    raise records.DataError(f"{directory} was built with other settings ({', '.join(differ)}: "
                            f"{[recorded.get(k) for k in differ]} here, "
                            f"{[settings[k] for k in differ]}"
                            f" asked): remove it to rebuild, or build into another directory")


def build(output_dir: str, sources: Sequence[Source], *, vocab_size: int = 8192,
          debs_dir: Optional[str] = None, bad_lines: str = "error", sample_fraction: float = 1.0,
          eval_fraction: float = 0.05, train_shards: int = 64, eval_shards: int = 8,
          split_by: str = "name", pinned_to: Optional[Mapping] = None) -> dict:
  """Builds (or resumes, or reuses) the corpus of ``sources`` in ``output_dir``; its manifest.

  ``pinned_to``: a recorded manifest whose packages (version and ``.deb`` sha256) the corpus must
  be built from, so that a fresh machine rebuilds the corpus earlier runs read after Debian has
  moved a package on. ``split_by``: what decides a document's split, its ``name`` or its
  ``content`` (see the module's stage 2).
  """
  records.check_choice("bad_lines", bad_lines, records.BAD_LINE_POLICIES)
  records.check_choice("split_by", split_by, SPLIT_KEYS)
  if not 0 < sample_fraction <= 1 or not 0 < eval_fraction < 1:
    raise ValueError(f"sample_fraction={sample_fraction} must be in (0, 1] and "
                     f"eval_fraction={eval_fraction} in (0, 1)")
  shards = {"train": train_shards, "eval": eval_shards}
  settings = _settings(sources, vocab_size, bad_lines, sample_fraction, eval_fraction, shards,
                       split_by)
  pins = _pins(sources, pinned_to)
  manifest_path = os.path.join(output_dir, MANIFEST)
  if os.path.exists(manifest_path):
    _check_settings(manifest_path, settings, output_dir)
    finished = read_manifest(output_dir)
    _check_pins(finished, pins, output_dir)
    return finished
  if os.path.exists(output_dir) and os.listdir(output_dir):
    raise records.DataError(f"{output_dir} exists without {MANIFEST} (not a finished corpus): "
                            f"remove it or choose another --output_dir")
  work = output_dir.rstrip("/") + ".partial"
  if os.path.exists(os.path.join(work, MANIFEST)):  # stopped while finishing
    _check_settings(os.path.join(work, MANIFEST), settings, work)
    with open(os.path.join(work, MANIFEST)) as f:
      _check_pins(json.load(f), pins, work)
    return _finish(work, output_dir)
  settings_path = os.path.join(work, "settings.json")
  if os.path.exists(settings_path):
    _check_settings(settings_path, settings, work)
  else:
    os.makedirs(work, exist_ok=True)
    with records.written_atomically(settings_path) as tmp, open(tmp, "w") as f:
      json.dump(settings, f, indent=1)
  debs_dir = debs_dir or output_dir.rstrip("/") + ".debs"
  packages = [convert_package(s, debs_dir, work, bad_lines, sample_fraction, pins.get(s.package))
              for s in sources]
  _check_pins({"packages": packages}, pins, work)
  text_paths = split_documents(work, [s.package for s in sources], eval_fraction, shards,
                               split_by)
  tokenizer = tokenizer_for(work, text_paths["train"], vocab_size)
  files = tokenize_shards(tokenizer, text_paths, os.path.join(work, "tokens"), vocab_size)
  manifest = _manifest(settings, packages, text_paths, files)
  with records.written_atomically(os.path.join(work, MANIFEST)) as tmp, open(tmp, "w") as f:
    json.dump(manifest, f, indent=1)
  return _finish(work, output_dir)


def _finish(work: str, output_dir: str) -> dict:
  """Stage 5's end (repeatable): the build's leftovers removed, ``work`` renamed to
  ``output_dir``; the finished corpus's manifest."""
  for leftover in ("docs", "extracted", "debs"):
    shutil.rmtree(os.path.join(work, leftover), ignore_errors=True)
  for leftover in ("settings.json", os.path.join("text", ".done")):
    if os.path.exists(os.path.join(work, leftover)):
      os.remove(os.path.join(work, leftover))
  if os.path.exists(output_dir):
    os.rmdir(output_dir)
  os.rename(work, output_dir)
  return read_manifest(output_dir)


def _pins(sources: Sequence[Source], manifest: Optional[Mapping]) -> Dict[str, Dict[str, str]]:
  """Per package, the version and sha256 ``manifest`` records (every source must be there)."""
  if manifest is None:
    return {}
  recorded = {p["package"]: {"version": p["version"], "sha256": p["sha256"]}
              for p in manifest["packages"]}
  missing = [s.package for s in sources if s.package not in recorded]
  if missing:
    raise records.DataError(f"the recorded manifest the corpus is pinned to has no {missing} "
                            f"(it records {sorted(recorded)})")
  return recorded


def _check_pins(manifest: Mapping, pins: Mapping[str, Mapping[str, str]], directory: str) -> None:
  """DataError unless every package of ``manifest`` is the build ``pins`` names."""
  for p in manifest["packages"]:
    pin = pins.get(p["package"])
    if pin and (p["version"], p["sha256"]) != (pin["version"], pin["sha256"]):
      raise records.DataError(f"{directory} holds {p['package']} {p['version']} (sha256 "
                              f"{p['sha256'][:12]}), not the recorded {pin['version']} (sha256 "
                              f"{pin['sha256'][:12]}): remove it to rebuild from the recorded "
                              f"packages")


def _manifest(settings: dict, packages: Sequence[dict], text_paths: Dict[str, List[str]],
              files: Dict[str, List[dict]]) -> dict:
  import tokenizers  # pylint: disable=g-import-not-at-top
  splits = {}
  for split in SPLITS:
    words = sum(len(t.split()) for t in _texts(text_paths[split]))
    splits[split] = {"documents": sum(f["documents"] for f in files[split]), "words": words,
                     "tokens": sum(f["tokens"] for f in files[split]), "files": files[split]}
  return {"settings": settings, "packages": list(packages), "splits": splits,
          "tokenizer": {"file": f"tokens/{token_lm.TOKENIZER_FILE}",
                        "kind": f"byte-level BPE (tokenizers {tokenizers.__version__})",
                        "vocab_size": settings["vocab_size"], "eos_id": token_lm.EOS_ID},
          "token_files": {split: f"tokens/{split}-*.tfrecord" for split in SPLITS}}


def read_manifest(corpus_dir: str) -> dict:
  """The manifest of a finished corpus (a directory without one is not a corpus)."""
  path = os.path.join(corpus_dir, MANIFEST)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{corpus_dir} is not a finished corpus (no {MANIFEST}): build it "
                            "with `python -m data_pipelines.debian_text "
                            f"--output_dir={corpus_dir}`")
  with open(path) as f:
    return json.load(f)


def fingerprint(manifest: dict) -> str:
  """What determines a corpus (its settings and each package's version and .deb sha256), hashed:
  two builds with the same fingerprint hold the same documents, tokenizer and shards."""
  packages = [(p["package"], p["version"], p["sha256"]) for p in manifest["packages"]]
  blob = json.dumps({"settings": manifest["settings"], "packages": packages}, sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def share_tokens(manifest: dict, shard_index: int = 0, num_shards: int = 1) -> int:
  """Training tokens in the shards a group's pipeline reads (token_lm.make_dataset's split)."""
  files = sorted(manifest["splits"]["train"]["files"], key=lambda f: f["file"])
  return sum(f["tokens"] for f in files[shard_index::num_shards])


def describe(manifest: dict) -> str:
  """Two lines about a corpus: its splits' sizes and packages."""
  s = manifest["splits"]
  return (f"train: {s['train']['documents']} documents, {s['train']['words']} words, "
          f"{s['train']['tokens']} tokens; eval: {s['eval']['documents']} documents, "
          f"{s['eval']['tokens']} tokens\npackages: "
          + ", ".join(f"{p['package']} {p['version']}" for p in manifest["packages"]))
