"""Language-modeling data: plain-text files -> tokens -> fixed-length next-token windows (tf.data).

Tokens (``tokenize``, one TF implementation used both to build the vocabulary and in the
pipeline, so the two never disagree):
  * ``level='word'``: the line lower-cased; every character other than ``a-z``, ``0-9``, ``'`` and
    whitespace becomes a token of its own (punctuation); words split on whitespace;
  * ``level='char'``: every character of the line (runs of whitespace become one space);
  * each line ends with the token ``<eos>``.

Vocabulary (``build_vocab``; built once from the training files and saved as
``vocab-<level>-<vocab_size>.tsv`` next to them, then reused): ``<unk>`` (id 0), ``<eos>`` (id 1),
then the ``vocab_size - 2`` most frequent tokens (count descending, then alphabetically). Each
line is ``token<TAB>count`` with the token's count in the training files (``<unk>``: the number
of tokens outside the vocabulary), so ``unigram_prior`` gives the corpus token frequencies.

Windows (``make_dataset``): each shard's token stream (its lines in file order) is cut into
windows of ``sequence_length + 1`` tokens that overlap by one, so every token but the first is a
target exactly once: features ``{'tokens': int32 [B, T]}`` and labels int32 [B, T] (the same
window shifted by one). Shards are disjoint: by file when there are at least ``num_shards``
files, else by line within every file. A line with non-UTF-8 bytes and an empty file fail,
naming the file (and line), or are skipped and counted (``bad_lines``).

Corpus (``prepare``): the King James Bible from Debian's ``bible-kjv-text`` package (read with
the ``bible`` program of ``bible-kjv``), or any plain-text files (``--text_files``); see
data_pipelines/README.md for provenance and licence.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import gin
import numpy as np
import tensorflow as tf
from absl import app
from absl import flags
from absl import logging

from data_pipelines import records

UNK = "<unk>"
EOS = "<eos>"
LEVELS = ("word", "char")
KJV_PACKAGES = ("bible-kjv-text", "bible-kjv")
KJV_INSTALL = f"apt-get install -y {' '.join(KJV_PACKAGES)}"
KJV_VERSES = 31_102
BLOCK_LINES = 100   # the split: blocks of 100 consecutive lines,
EVAL_EVERY = 20     # every 20th block (5%) is evaluation text
_BATCH_LINES = 1024
_MESSAGE_PREFIX = "malformed text line "
_PUNCT = r"([^a-z0-9'\s])"
_VERSE_REF = re.compile(r"^\S+?\d+:\d+ ")


def vocab_name(level: str, vocab_size: int) -> str:
  """File name of the saved vocabulary for ``level`` and ``vocab_size``."""
  return f"vocab-{level}-{vocab_size}.tsv"


def _check_level(level: str) -> None:
  if level not in LEVELS:
    raise ValueError(f"level={level!r} is not one of {LEVELS}")


def tokenize(lines: tf.Tensor, level: str = "word") -> tf.RaggedTensor:
  """Token strings of a batch of lines ([N] string -> ragged [N, None]), ``<eos>`` ending each."""
  _check_level(level)
  lines = tf.convert_to_tensor(lines, tf.string)
  if level == "word":
    spaced = tf.strings.regex_replace(tf.strings.lower(lines), _PUNCT, r" \1 ")
    tokens = tf.strings.split(spaced)
  else:
    squeezed = tf.strings.strip(tf.strings.regex_replace(lines, r"\s+", " "))
    tokens = tf.strings.unicode_split(squeezed, "UTF-8")
  eos = tf.fill(tf.stack([tf.shape(lines)[0], 1]), EOS)
  return tf.concat([tokens, tf.RaggedTensor.from_tensor(eos)], axis=1)


def _numbered_lines(files: Sequence[str]) -> tf.data.Dataset:
  """``(file id, 1-based line number, line)`` of every line of ``files``, file after file."""

  def read(file_id: tf.Tensor, path: tf.Tensor) -> tf.data.Dataset:
    return tf.data.TextLineDataset(path).enumerate(start=1).map(
        lambda number, line: (file_id, number, line))

  ids = tf.range(len(files), dtype=tf.int64)
  return tf.data.Dataset.from_tensor_slices((ids, list(files))).flat_map(read)


def _utf8_lines(numbered: tf.data.Dataset, files: Sequence[str], bad_lines: str,
                counter: Optional[records.BadLineCounter]) -> tf.data.Dataset:
  """Batches of the lines of ``numbered`` (from ``files``), non-UTF-8 ones failing or skipped."""

  def check(file_ids: tf.Tensor, numbers: tf.Tensor, lines: tf.Tensor) -> tf.Tensor:
    ok = tf.equal(records.valid_utf8(lines), lines)
    describe = lambda i: tf.strings.join(["non-UTF-8 bytes in the line", records.shown(lines[i])])
    [lines] = records.enforce(ok, describe, [lines],
                              where=records.locator(files, file_ids, numbers),
                              prefix=_MESSAGE_PREFIX, policy=bad_lines, counter=counter)
    return lines

  return numbered.batch(_BATCH_LINES).map(check)


def _count_tokens(files: Sequence[str], level: str, bad_lines: str) -> collections.Counter:
  counts: collections.Counter = collections.Counter()
  files = records.drop_empty_files(files, "skip", list(files))
  skipped = records.BadLineCounter()
  lines = _utf8_lines(_numbered_lines(files), files, bad_lines, skipped)
  for batch in lines.map(lambda b: tokenize(b, level).flat_values):
    counts.update(batch.numpy().tolist())
  if skipped.count:
    logging.warning("vocabulary: skipped %d lines with non-UTF-8 bytes (bad_lines='skip')",
                    skipped.count)
  return counts


def build_vocab(files: Sequence[str], vocab_size: int, level: str = "word",
                bad_lines: str = "error") -> List[Tuple[str, int]]:
  """(token, count) for ``<unk>``, ``<eos>`` and the most frequent tokens of ``files``.

  Empty files are skipped with a warning. A line with non-UTF-8 bytes fails (InvalidArgumentError
  naming file and line) under ``bad_lines='error'`` and is skipped under ``'skip'``.
  """
  _check_level(level)
  records.check_choice("bad_lines", bad_lines, records.BAD_LINE_POLICIES)
  if vocab_size < 3:
    raise ValueError(f"vocab_size={vocab_size} must be >= 3 (<unk>, <eos> and a token)")
  counts = _count_tokens(files, level, bad_lines)
  eos = counts.pop(EOS.encode(), 0)
  counts.pop(UNK.encode(), None)
  ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
  if len(ranked) < vocab_size - 2:
    raise ValueError(f"{list(files)} hold only {len(ranked)} distinct tokens besides {EOS}: "
                     f"vocab_size={vocab_size} must be <= {len(ranked) + 2}")
  kept = ranked[:vocab_size - 2]
  unknown = sum(c for _, c in ranked[vocab_size - 2:])
  return [(UNK, unknown), (EOS, eos)] + [(t.decode("utf-8"), c) for t, c in kept]


def write_vocab(vocab: Sequence[Tuple[str, int]], path: str) -> None:
  """Writes ``token<TAB>count`` lines atomically."""
  with records.written_atomically(path) as tmp, tf.io.gfile.GFile(tmp, "w") as f:
    for token, count in vocab:
      f.write(f"{token}\t{count}\n")


def read_vocab(path: str) -> List[Tuple[str, int]]:
  """The (token, count) lines of a saved vocabulary, checked."""
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(
        f"vocabulary {path} is missing: build it once with `python -m data_pipelines.text_lm "
        f"--output_dir={os.path.dirname(path)} ...` with the same --vocab_size and --level")
  vocab = []
  with tf.io.gfile.GFile(path, "r") as f:
    for number, line in enumerate(f, 1):
      line = line.rstrip("\n")
      token, sep, count = line.rpartition("\t")
      if not sep or not count.isdigit():
        raise ValueError(f"{path}:{number}: expected 'token<TAB>count', got {line!r}")
      vocab.append((token, int(count)))
  if len(vocab) < 3 or vocab[0][0] != UNK or vocab[1][0] != EOS:
    raise ValueError(f"{path}: must start with {UNK} and {EOS} and hold at least one more token")
  return vocab


def vocab_path(file_pattern, vocab_size: int, level: str,
               vocab_file: Optional[str] = None) -> str:
  """``vocab_file``, or the saved vocabulary next to the first file of ``file_pattern``."""
  if vocab_file:
    return vocab_file
  first = records.resolve_files(file_pattern, "text")[0]
  return os.path.join(os.path.dirname(first), vocab_name(level, vocab_size))


@gin.configurable(module="text_lm")
def unigram_prior(train_files: Sequence[str], vocab_size: int = gin.REQUIRED,
                  level: str = "word", vocab_file: Optional[str] = None) -> np.ndarray:
  """Token frequencies of the training corpus (the saved vocabulary's counts), normalised."""
  counts = np.asarray([c for _, c in _load(train_files, vocab_size, level, vocab_file)], np.float64)
  return counts / counts.sum()


def _load(file_pattern, vocab_size: int, level: str, vocab_file: Optional[str]
          ) -> List[Tuple[str, int]]:
  path = vocab_path(file_pattern, vocab_size, level, vocab_file)
  vocab = read_vocab(path)
  if len(vocab) != vocab_size:
    raise ValueError(f"{path} has {len(vocab)} tokens but text_lm.make_dataset.vocab_size = "
                     f"{vocab_size}: bind the vocabulary's size (and the model's)")
  return vocab


def lookup_table(vocab: Sequence[Tuple[str, int]]) -> tf.lookup.StaticHashTable:
  """token -> id (its line number); anything else -> 0 (``<unk>``)."""
  tokens = tf.constant([t for t, _ in vocab])
  ids = tf.range(len(vocab), dtype=tf.int32)
  return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(tokens, ids),
                                   default_value=0)


def token_ids(lines: tf.Tensor, table: tf.lookup.StaticHashTable, level: str = "word"
              ) -> tf.Tensor:
  """Flat int32 ids of a batch of lines, in order."""
  return table.lookup(tokenize(lines, level).flat_values)


_FINGERPRINT_BUCKETS = (1 << 63) - 1


@gin.configurable(module="text_lm")
def raw_parser(vocab_file: str = gin.REQUIRED,
               level: str = "word") -> Callable[[tf.Tensor], Dict[str, tf.Tensor]]:
  """``parse(lines)``: raw text lines [B] -> ``{'tokens': int32 [B, T]}``, each line's ids as
  the pipeline computes them (``tokenize`` at ``level``, the vocabulary of ``vocab_file``,
  ``<eos>`` last), right-padded with ``<unk>`` (0) to the longest line; a causal model's outputs
  at a line's own positions do not depend on the padding. For a serving signature on raw text.

  The vocabulary is held as constants (64-bit token fingerprints, sorted), not a lookup table,
  so a SavedModel carries it with no resource to track. ``parse.token_stream(lines)``: the flat
  ids, what ``serving.check_raw_parser`` compares with the pipeline's windows.
  """
  _check_level(level)
  tokens = [t for t, _ in read_vocab(vocab_file)]
  keys = tf.strings.to_hash_bucket_fast(tf.constant(tokens), _FINGERPRINT_BUCKETS).numpy()
  order = np.argsort(keys, kind="stable")
  sorted_keys = keys[order]
  if np.any(sorted_keys[1:] == sorted_keys[:-1]):
    raise ValueError(f"{vocab_file}: two tokens share a 64-bit fingerprint")
  sorted_keys, sorted_ids = tf.constant(sorted_keys), tf.constant(order, tf.int32)

  def ragged_ids(lines: tf.Tensor) -> tf.RaggedTensor:
    split = tokenize(lines, level)
    found = tf.strings.to_hash_bucket_fast(split.flat_values, _FINGERPRINT_BUCKETS)
    at = tf.minimum(tf.searchsorted(sorted_keys, found), tf.size(sorted_keys) - 1)
    ids = tf.where(tf.equal(tf.gather(sorted_keys, at), found), tf.gather(sorted_ids, at), 0)
    return split.with_flat_values(ids)

  def parse(lines: tf.Tensor) -> Dict[str, tf.Tensor]:
    return {"tokens": ragged_ids(lines).to_tensor(default_value=0)}

  parse.token_stream = lambda lines: ragged_ids(lines).flat_values
  return parse


def windows(ids: tf.data.Dataset, sequence_length: int) -> tf.data.Dataset:
  """A stream of scalar ids -> (inputs [T], targets [T]) windows of T + 1 tokens overlapping by
  1."""
  # Chunks of T tokens (the last may be shorter); window k is chunk k plus chunk k+1's first token.
  chunks = ids.batch(sequence_length)
  empty = tf.zeros([0], tf.int32)
  pairs = chunks.scan(empty, lambda prev, chunk: (chunk, (prev, chunk)))
  full = pairs.filter(lambda prev, chunk: tf.shape(prev)[0] == sequence_length)
  shape = [sequence_length]
  return full.map(lambda prev, chunk: (tf.ensure_shape(prev, shape), tf.ensure_shape(
      tf.concat([prev[1:], chunk[:1]], axis=0), shape)))


@gin.configurable(module="text_lm")
def make_dataset(file_pattern, batch_size: int, *, sequence_length: int = 32,
                 vocab_size: int = gin.REQUIRED, level: str = "word",
                 vocab_file: Optional[str] = None, shard_index: int = 0, num_shards: int = 1,
                 repeat: bool = False, shuffle_buffer: int = 0, seed: Optional[int] = None,
                 drop_remainder: Optional[bool] = None, bad_lines: str = "error",
                 bad_line_counter: Optional[records.BadLineCounter] = None
                 ) -> tf.data.Dataset:
  """Batches of ``({'tokens': int32 [B, T]}, int32 [B, T])`` next-token windows.

  ``bad_lines='error'`` raises DataError here for an empty (0-byte) file and fails iteration
  naming the file and 1-based line number of a line with non-UTF-8 bytes; ``'skip'`` skips empty
  files with a warning and drops such lines, adding their number to ``bad_line_counter``.
  ``drop_remainder`` defaults to ``repeat`` (training batches are full, evaluation keeps all).
  """
  _check_level(level)
  records.check_choice("bad_lines", bad_lines, records.BAD_LINE_POLICIES)
  if sequence_length < 1:
    raise ValueError(f"sequence_length={sequence_length} must be >= 1")
  if not 0 <= shard_index < num_shards:
    raise ValueError(f"shard_index={shard_index} is out of range for num_shards={num_shards}")
  files = records.drop_empty_files(records.resolve_files(file_pattern, "text"), bad_lines,
                                   file_pattern, binding="text_lm.make_dataset.bad_lines")
  table = lookup_table(_load(files, vocab_size, level, vocab_file))
  by_file = len(files) >= num_shards
  if by_file:
    files = files[shard_index::num_shards]
  lines = _numbered_lines(files)
  if not by_file:
    lines = lines.shard(num_shards, shard_index)
  lines = _utf8_lines(lines, files, bad_lines, bad_line_counter)
  ids = lines.map(lambda b: token_ids(b, table, level)).unbatch()
  data = windows(ids, sequence_length)
  if repeat:
    data = data.repeat()
  if shuffle_buffer:
    data = data.shuffle(shuffle_buffer, seed=seed)
  data = data.map(lambda x, y: ({"tokens": x}, y))
  drop = repeat if drop_remainder is None else drop_remainder
  return data.batch(batch_size, drop_remainder=drop).prefetch(tf.data.AUTOTUNE)


def feature_spec() -> Dict[str, tf.TensorSpec]:
  """Batched feature spec (batch and time dimensions None)."""
  return {"tokens": tf.TensorSpec([None, None], tf.int32)}


# ----------------------------------------------------------------------------------------------
# Preparing a corpus.


def kjv_lines() -> List[str]:
  """The 31,102 verses of the King James Bible, in order, from Debian's bible-kjv-text."""
  program = shutil.which("bible")
  if program is None:
    raise FileNotFoundError(
        "the King James Bible comes from Debian's bible-kjv-text (read with the `bible` program of "
        f"bible-kjv), which is not installed: run `{KJV_INSTALL}` (`make data` does, as root)")
  out = subprocess.run([program, "-f", "gen1:1-rev22:21"], capture_output=True, text=True,
                       check=True, env={**os.environ, "COLUMNS": "100000"}).stdout
  verses = [_VERSE_REF.sub("", line).strip() for line in out.splitlines() if line.strip()]
  if len(verses) != KJV_VERSES or not verses[0].startswith("In the beginning God created"):
    raise ValueError(f"`{program} -f gen1:1-rev22:21` gave {len(verses)} verses, expected "
                     f"{KJV_VERSES} starting with Genesis 1:1; is bible-kjv-text complete?")
  return verses


def split_lines(lines: Sequence[str]) -> Tuple[List[str], List[str]]:
  """(train, eval): blocks of BLOCK_LINES consecutive lines, every EVAL_EVERY-th block eval."""
  train, evaluation = [], []
  for start in range(0, len(lines), BLOCK_LINES):
    block = lines[start:start + BLOCK_LINES]
    (evaluation if (start // BLOCK_LINES) % EVAL_EVERY == EVAL_EVERY - 1 else train).extend(block)
  return train, evaluation


def _write_lines(lines: Sequence[str], path: str) -> None:
  with records.written_atomically(path) as tmp, tf.io.gfile.GFile(tmp, "w") as f:
    f.write("".join(line + "\n" for line in lines))


def prepare(output_dir: str, vocab_size: int = 8000, level: str = "word",
            num_train_files: int = 8, text_files: Sequence[str] = ()
            ) -> Tuple[List[str], List[str], str]:
  """Writes train/eval text files and the vocabulary once (kept when there); returns their paths.

  The text is ``text_files`` (plain text, one paragraph or verse a line) or, by default, the King
  James Bible; the split is ``split_lines``; the vocabulary is built from the training files.
  """
  _check_level(level)
  train_paths = [os.path.join(output_dir, f"train-{i:05d}-of-{num_train_files:05d}.txt")
                 for i in range(num_train_files)]
  eval_paths = [os.path.join(output_dir, "eval-00000-of-00001.txt")]
  if not all(tf.io.gfile.exists(p) for p in train_paths + eval_paths):
    if text_files:
      lines = []
      for path in records.resolve_files(text_files, "text"):
        with tf.io.gfile.GFile(path, "r") as f:
          lines += [line.strip() for line in f if line.strip()]
    else:
      lines = kjv_lines()
    train, evaluation = split_lines(lines)
    tf.io.gfile.makedirs(output_dir)
    per_file = -(-len(train) // num_train_files)
    for index, path in enumerate(train_paths):
      _write_lines(train[index * per_file:(index + 1) * per_file], path)
    _write_lines(evaluation, eval_paths[0])
  vocab = os.path.join(output_dir, vocab_name(level, vocab_size))
  if not tf.io.gfile.exists(vocab):
    write_vocab(build_vocab(train_paths, vocab_size, level), vocab)
    logging.info("wrote vocabulary %s", vocab)
  return train_paths, eval_paths, vocab


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  train, evaluation, vocab = prepare(FLAGS.output_dir, FLAGS.vocab_size, FLAGS.level,
                                     FLAGS.num_train_files, FLAGS.text_files)
  print(f"train: {len(train)} files, eval: {evaluation[0]}, vocabulary: {vocab}")


if __name__ == "__main__":
  flags.DEFINE_string("output_dir", None, "Where to write the text files and vocabulary.",
                      required=True)
  flags.DEFINE_integer("vocab_size", 8000, "Tokens in the vocabulary, <unk> and <eos> included.")
  flags.DEFINE_enum("level", "word", list(LEVELS), "Word or character tokens.")
  flags.DEFINE_integer("num_train_files", 8, "Training text files (shards).")
  flags.DEFINE_multi_string("text_files", [], "Plain-text files to use instead of the King "
                            "James Bible (glob patterns).")
  FLAGS = flags.FLAGS
  app.run(main)
