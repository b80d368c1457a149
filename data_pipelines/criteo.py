"""tf.data pipeline for Criteo Display Advertising Challenge data (TSV or Parquet).

TSV format: one example per line, ``label \\t I1..I13 \\t C1..C26`` (40 tab-separated fields):
  * label: ``0`` or ``1``;
  * I1..I13: integers, possibly negative, at most 18 digits;
  * C1..C26: hexadecimal ids of 1..16 characters, any case (real data: 8 lowercase characters).
Any of the 39 feature fields may be empty, meaning missing.

Parquet format: columns ``label``, ``I1``..``I13`` (int64) and ``C1``..``C26`` (string) with NO nulls:
a missing integer is written as 0 and a missing categorical as ''. The convention exists because
tensorflow-io 0.37.1's Parquet reader returns garbage for null values instead of failing.

Features, identical for both formats:
  * ``dense``: float32 [B, 13], log1p(max(x, 0)); a missing integer counts as 0.
  * ``categorical``: int64 [B, 26], ``tf.strings.to_hash_bucket_fast`` of the lowercased hex string
    into ``num_buckets``; a missing value hashes the empty string, so "missing" shares one bucket
    per field with whatever real id collides with it.
  * label: float32 [B, 1].

Parsing runs on whole batches of lines (split, regex validation, hashing), which keeps it vectorized.
Every line carries its file and 1-based line number so a malformed one can be reported precisely.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence

import gin
import tensorflow as tf
from absl import logging

NUM_INT = 13
NUM_CAT = 26
NUM_FIELDS = 1 + NUM_INT + NUM_CAT
LABEL_COLUMN = "label"
INT_COLUMNS = tuple(f"I{i}" for i in range(1, NUM_INT + 1))
CAT_COLUMNS = tuple(f"C{i}" for i in range(1, NUM_CAT + 1))
BAD_LINE_POLICIES = ("error", "skip")
FILE_FORMATS = ("tsv", "parquet")

_LABEL_RE = "0|1"
_INT_RE = "(-?[0-9]{1,18})?"  # 18 digits always fit in int64
_HEX_RE = "[0-9a-fA-F]{0,16}"
# The longest valid line: a label, 13 integers of up to 19 characters, 26 ids of up to 16, 39 tabs.
MAX_LINE_BYTES = 1 + NUM_INT * 19 + NUM_CAT * 16 + (NUM_FIELDS - 1)
_MAX_SHOWN_CHARS = 32
_MAX_CYCLE_LENGTH = 4
# Files are read and interleaved in blocks of lines: tf.data's parallel interleave costs ~10 us per
# element, which per line would cap throughput near 80k lines/s.
_READ_BLOCK = 1024
_MESSAGE_PREFIX = {"tsv": "malformed Criteo TSV line ", "parquet": "malformed Criteo Parquet row "}

Tensors = list[tf.Tensor]
EnforceFn = Callable[[tf.Tensor, Callable[[tf.Tensor], tf.Tensor], Tensors], Tensors]


class DataError(ValueError):
  """Input data that cannot be used (an empty file, a malformed line under bad_lines='error');
  the message names the file (and line) and what to do."""


class BadLineCounter:
  """Counts records dropped under bad_lines='skip'; a tf.Variable so dataset functions can add to it.

  Create it outside any distribution strategy scope: it is a plain local (host) variable.
  """

  def __init__(self) -> None:
    self._variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="criteo_bad_lines")

  @property
  def count(self) -> int:
    """Records dropped so far."""
    return int(self._variable.numpy())

  def add(self, n: tf.Tensor | int) -> tf.Operation | tf.Tensor:
    """Adds n dropped records; usable inside Dataset.map."""
    return self._variable.assign_add(tf.cast(n, tf.int64))

  def reset(self) -> None:
    """Sets the count back to zero."""
    self._variable.assign(0)


def feature_spec(num_int: int = NUM_INT, num_cat: int = NUM_CAT) -> dict[str, tf.TensorSpec]:
  """Batched feature spec (batch dimension None), e.g. for SavedModel serving signatures."""
  return {
      "dense": tf.TensorSpec([None, num_int], tf.float32, name="dense"),
      "categorical": tf.TensorSpec([None, num_cat], tf.int64, name="categorical"),
  }


def resolve_files(file_pattern: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
  """Sorted files matching a glob or a list of globs/paths; FileNotFoundError if one matches nothing."""
  if isinstance(file_pattern, (str, bytes, os.PathLike)):
    patterns = [file_pattern]
  else:
    patterns = list(file_pattern)
  patterns = [os.fsdecode(p) for p in patterns]
  if not patterns:
    raise FileNotFoundError("no Criteo file pattern given")
  files: set[str] = set()
  unmatched = []
  for pattern in patterns:
    matched = tf.io.gfile.glob(pattern)
    if not matched:
      unmatched.append(pattern)
    files.update(matched)
  if unmatched:
    raise FileNotFoundError(f'no Criteo files match {", ".join(map(repr, unmatched))}')
  return sorted(files)


@gin.configurable(module="criteo")
def make_dataset(
    file_pattern: str | Sequence[str],
    batch_size: int,
    *,
    num_buckets: int = 100_000,
    shard_index: int = 0,
    num_shards: int = 1,
    repeat: bool = False,
    shuffle_buffer: int = 0,
    seed: int | None = None,
    bad_lines: str = "error",
    file_format: str = "tsv",
    deterministic: bool = True,
    drop_remainder: bool = False,
    bad_line_counter: BadLineCounter | None = None,
) -> tf.data.Dataset:
  """Batches of ``(features, label)`` parsed from Criteo files, shard ``shard_index`` of ``num_shards``.

  Shards are disjoint: by file when there are at least ``num_shards`` files, else by line within
  every file. ``bad_lines='error'`` fails iteration naming the file, line and reason of the first
  malformed record (wrong field count, non-numeric integer, non-hex id, label not in {0,1}, a line
  longer than ``MAX_LINE_BYTES``, non-UTF-8 bytes) and raises DataError here for an empty file;
  ``'skip'`` drops malformed records (batches may come out smaller), adds their number to
  ``bad_line_counter`` and skips empty files with a warning.
  """
  _check_choice("bad_lines", bad_lines, BAD_LINE_POLICIES)
  _check_choice("file_format", file_format, FILE_FORMATS)
  if not 0 <= shard_index < num_shards:
    raise ValueError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  if num_buckets < 1:
    raise ValueError(f"num_buckets must be positive, got {num_buckets}")

  files = drop_empty_files(resolve_files(file_pattern), bad_lines, file_pattern)
  shard_by_file = len(files) >= num_shards
  if shard_by_file:
    files = files[shard_index::num_shards]
  line_shard = None if shard_by_file else (num_shards, shard_index)
  file_names = tf.constant(files)

  if file_format == "tsv":
    open_file, parse_batch = tf.data.TextLineDataset, _parse_tsv_batch
  else:
    open_file, parse_batch = _parquet_reader(), _parse_parquet_batch

  def read_file(file_id: tf.Tensor) -> tf.data.Dataset:
    blocks = open_file(file_names[file_id]).batch(_READ_BLOCK).enumerate()
    return blocks.map(lambda index, records: _tag_block(file_id, index, records, line_shard))

  dataset = tf.data.Dataset.range(len(files))
  if shuffle_buffer > 0:
    dataset = dataset.shuffle(len(files), seed=seed)
  dataset = dataset.interleave(
      read_file,
      cycle_length=min(len(files), _MAX_CYCLE_LENGTH),
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=deterministic,
  ).unbatch()
  if shuffle_buffer > 0:
    dataset = dataset.shuffle(shuffle_buffer, seed=seed)
  if repeat:
    dataset = dataset.repeat()
  dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)

  def parse(file_ids: tf.Tensor, line_numbers: tf.Tensor, records):

    def where(i: tf.Tensor) -> tf.Tensor:
      return tf.strings.join([file_names[file_ids[i]], ":", tf.strings.as_string(line_numbers[i])])

    enforce = functools.partial(_enforce, where=where, prefix=_MESSAGE_PREFIX[file_format],
                                policy=bad_lines, counter=bad_line_counter)
    label, ints, cats = parse_batch(records, enforce)
    features, label = _features(label, ints, cats, num_buckets)
    if bad_lines == "error":
      # Keep a static batch size (drop_remainder=True) through the string splitting.
      for tensor in (features["dense"], features["categorical"], label):
        tensor.set_shape(file_ids.shape[:1].concatenate(tensor.shape[1:]))
    return features, label

  dataset = dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
  if bad_lines == "skip":
    dataset = dataset.filter(lambda features, label: tf.shape(label)[0] > 0)
  return dataset.prefetch(tf.data.AUTOTUNE)


def drop_empty_files(files: Sequence[str], bad_lines: str, pattern) -> list[str]:
  """``files`` without empty (0-byte) ones: an error naming the file under bad_lines='error', a
  warning under 'skip'; an error if nothing is left."""
  kept = []
  for path in files:
    if tf.io.gfile.stat(path).length > 0:
      kept.append(path)
    elif bad_lines == "error":
      raise DataError(f"{path}: empty file (0 bytes); remove it, or bind "
                      "criteo.make_dataset.bad_lines = 'skip' to skip empty files and bad lines")
    else:
      logging.warning("%s: empty file (0 bytes), skipped (bad_lines='skip')", path)
  if not kept:
    raise DataError(f"every file matching {pattern!r} is empty")
  return kept


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
  if value not in allowed:
    raise ValueError(f'{name}={value!r} is not one of {", ".join(map(repr, allowed))}')


def _tag_block(file_id: tf.Tensor, block_index: tf.Tensor, records, line_shard: tuple[int, int] | None):
  """Tags a block of one file's records with file and 1-based line numbers; keeps this shard's lines."""
  size = tf.shape(tf.nest.flatten(records)[0], out_type=tf.int64)[0]
  line_numbers = block_index * _READ_BLOCK + tf.range(1, size + 1, dtype=tf.int64)
  block = (tf.fill([size], file_id), line_numbers, records)
  if line_shard is not None:
    # Sharding within every file keeps shards disjoint whatever order interleave produces.
    num_shards, shard_index = line_shard
    keep = tf.equal((line_numbers - 1) % num_shards, shard_index)
    block = tf.nest.map_structure(lambda t: tf.boolean_mask(t, keep), block)
  return block


def _parquet_reader() -> Callable[[tf.Tensor], tf.data.Dataset]:
  import tensorflow_io as tfio  # slow to import, so only when Parquet is asked for

  columns = {LABEL_COLUMN: tf.TensorSpec([], tf.int64)}
  columns.update({name: tf.TensorSpec([], tf.int64) for name in INT_COLUMNS})
  columns.update({name: tf.TensorSpec([], tf.string) for name in CAT_COLUMNS})
  return lambda path: tfio.IODataset.from_parquet(path, columns=columns)


def _parse_tsv_batch(lines: tf.Tensor, enforce: EnforceFn) -> Tensors:
  """Validates a batch of TSV lines; returns label (bool), ints (int64) and categorical strings."""
  fields = tf.strings.split(lines, "\t")
  num_fields = fields.row_lengths()
  table = fields.to_tensor(default_value="", shape=[None, NUM_FIELDS])
  label, ints, cats = table[:, 0], table[:, 1:1 + NUM_INT], table[:, 1 + NUM_INT:]
  length = tf.strings.length(lines)

  length_ok = length <= MAX_LINE_BYTES
  count_ok = tf.equal(num_fields, NUM_FIELDS)
  label_ok = tf.strings.regex_full_match(label, _LABEL_RE)
  int_ok = tf.strings.regex_full_match(ints, _INT_RE)
  cat_ok = tf.strings.regex_full_match(cats, _HEX_RE)
  ok = (length_ok & count_ok & label_ok & tf.reduce_all(int_ok, axis=1)
        & tf.reduce_all(cat_ok, axis=1))

  def describe(i: tf.Tensor) -> tf.Tensor:
    got = tf.strings.as_string(num_fields[i])
    # Every valid field is ASCII, so a line with invalid UTF-8 is always malformed; only the
    # message of a failing line pays for this check.
    utf8_ok = tf.equal(_valid_utf8(lines[i]), lines[i])
    return _first_reason([
        (~length_ok[i], tf.strings.join([
            "line of ", tf.strings.as_string(length[i]),
            f" bytes is longer than any valid Criteo line ({MAX_LINE_BYTES} bytes)"])),
        (~utf8_ok, tf.constant("non-UTF-8 bytes in the line")),
        (~count_ok[i], tf.strings.join([f"expected {NUM_FIELDS} tab-separated fields, got ", got])),
        (~label_ok[i], tf.strings.join(["label not in {0,1}", _shown(label[i])])),
        _column_reason("non-numeric integer field I", int_ok[i], ints[i]),
        _column_reason("non-hex categorical field C", cat_ok[i], cats[i]),
    ])

  label, ints, cats = enforce(ok, describe, [label, ints, cats])
  ints = tf.strings.to_number(tf.where(tf.equal(ints, ""), "0", ints), out_type=tf.int64)
  return [tf.equal(label, "1"), ints, cats]


def _parse_parquet_batch(columns: dict[str, tf.Tensor], enforce: EnforceFn) -> Tensors:
  """Validates a batch of Parquet rows; returns label (bool), ints (int64) and categorical strings."""
  label = columns[LABEL_COLUMN]
  ints = tf.stack([columns[name] for name in INT_COLUMNS], axis=1)
  cats = tf.stack([columns[name] for name in CAT_COLUMNS], axis=1)

  label_ok = tf.equal(label, 0) | tf.equal(label, 1)
  cat_ok = tf.strings.regex_full_match(cats, _HEX_RE)
  ok = label_ok & tf.reduce_all(cat_ok, axis=1)

  def describe(i: tf.Tensor) -> tf.Tensor:
    return _first_reason([
        (~label_ok[i], tf.strings.join(["label not in {0,1}", _shown(tf.strings.as_string(label[i]))])),
        _column_reason("non-hex categorical field C", cat_ok[i], cats[i]),
    ])

  label, ints, cats = enforce(ok, describe, [label, ints, cats])
  return [tf.equal(label, 1), ints, cats]


def _enforce(ok: tf.Tensor, describe: Callable[[tf.Tensor], tf.Tensor], tensors: Tensors, *,
             where: Callable[[tf.Tensor], tf.Tensor], prefix: str, policy: str,
             counter: BadLineCounter | None) -> Tensors:
  """Applies the bad-line policy to a batch: fail on the first bad record, or mask bad records out."""
  if policy == "skip":
    if counter is not None:
      counter.add(tf.size(ok, out_type=tf.int64) - tf.math.count_nonzero(ok, dtype=tf.int64))
    return [tf.boolean_mask(t, ok) for t in tensors]

  all_ok = tf.reduce_all(ok)

  def fail() -> tf.Tensor:
    i = tf.argmin(tf.cast(ok, tf.int32))
    message = tf.strings.join([prefix, where(i), ": ", describe(i)])
    with tf.control_dependencies([tf.debugging.Assert(all_ok, [message])]):
      return tf.identity(all_ok)

  # The message is only built for a failing batch; parsing must wait for the check.
  checked = tf.cond(all_ok, lambda: tf.identity(all_ok), fail)
  with tf.control_dependencies([checked]):
    return [tf.identity(t) for t in tensors]


def _features(label: tf.Tensor, ints: tf.Tensor, cats: tf.Tensor,
              num_buckets: int) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
  dense = tf.math.log1p(tf.cast(tf.maximum(ints, 0), tf.float32))
  categorical = tf.strings.to_hash_bucket_fast(tf.strings.lower(cats), num_buckets)
  return {"dense": dense, "categorical": categorical}, tf.cast(label, tf.float32)[:, tf.newaxis]


def _valid_utf8(value: tf.Tensor) -> tf.Tensor:
  """``value`` with invalid UTF-8 bytes replaced by U+FFFD (equal to ``value`` iff it is valid)."""
  return tf.strings.unicode_transcode(value, "UTF-8", "UTF-8", errors="replace",
                                      replacement_char=0xFFFD)


def _shown(value: tf.Tensor) -> tf.Tensor:
  # No quotes: tf.debugging.Assert escapes them in its message. Invalid UTF-8 is replaced, or the
  # error message itself could not be decoded (a UnicodeDecodeError instead of the bad line).
  return tf.strings.join([" (got: ", _valid_utf8(tf.strings.substr(value, 0, _MAX_SHOWN_CHARS)),
                          ")"])


def _column_reason(what: str, column_ok: tf.Tensor, values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """(any bad, description of the first bad column) for one record's columns."""
  column = tf.argmin(tf.cast(column_ok, tf.int32))
  return ~tf.reduce_all(column_ok), tf.strings.join(
      [what, tf.strings.as_string(column + 1), _shown(values[column])])


def _first_reason(reasons: list[tuple[tf.Tensor, tf.Tensor]]) -> tf.Tensor:
  message = tf.constant("unknown reason")
  for bad, text in reversed(reasons):
    message = tf.where(bad, text, message)
  return message
