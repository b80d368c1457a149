"""tf.data pipeline for Criteo Display Advertising Challenge data (TSV or Parquet).

TSV format: one example per line, ``label \\t I1..I13 \\t C1..C26`` (40 tab-separated fields):
  * label: ``0`` or ``1``;
  * I1..I13: integers, possibly negative, at most 18 digits;
  * C1..C26: hexadecimal ids of 1..16 characters, any case (real data: 8 lowercase characters).
Any of the 39 feature fields may be empty, meaning missing.

Parquet format: columns ``label``, ``I1``..``I13`` (int64) and ``C1``..``C26`` (string); a null
feature is missing (read as 0 and ''), a null label makes the row malformed. The files written
here hold no nulls (a missing integer is written as 0 and a missing categorical as ''), so that
tensorflow-io 0.37.1's Parquet reader, which returns garbage for null values instead of failing,
reads them too (``parquet_reader='tensorflow_io'``).

Features, identical for both formats:
  * ``dense``: float32 [B, 13], log1p(max(x, 0)); a missing integer counts as 0.
  * ``categorical``: int64 [B, 26], ``tf.strings.to_hash_bucket_fast`` of the lowercased hex string
    into ``num_buckets``; a missing value hashes the empty string, so "missing" shares one bucket
    per field with whatever real id collides with it.
  * label: float32 [B, 1].

Parsing runs on whole batches of lines (split, regex validation, hashing), which keeps it
vectorized. Every line carries its file and 1-based line number so a malformed one can be reported
precisely.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from collections.abc import Sequence

import gin
import tensorflow as tf

from data_pipelines import parquet
from data_pipelines import records

NUM_INT = 13
NUM_CAT = 26
NUM_FIELDS = 1 + NUM_INT + NUM_CAT
LABEL_COLUMN = "label"
INT_COLUMNS = tuple(f"I{i}" for i in range(1, NUM_INT + 1))
CAT_COLUMNS = tuple(f"C{i}" for i in range(1, NUM_CAT + 1))
BAD_LINE_POLICIES = records.BAD_LINE_POLICIES
FILE_FORMATS = ("tsv", "parquet")

_LABEL_RE = "0|1"
_INT_RE = "(-?[0-9]{1,18})?"  # 18 digits always fit in int64
_HEX_RE = "[0-9a-fA-F]{0,16}"
# The longest valid line: a label, 13 integers of up to 19 characters, 26 ids of up to 16, 39 tabs.
MAX_LINE_BYTES = 1 + NUM_INT * 19 + NUM_CAT * 16 + (NUM_FIELDS - 1)
_MESSAGE_PREFIX = {"tsv": "malformed Criteo TSV line ", "parquet": "malformed Criteo Parquet row "}

Tensors = list[tf.Tensor]
EnforceFn = Callable[[tf.Tensor, Callable[[tf.Tensor], tf.Tensor], Tensors], Tensors]

# Re-exported: the trainer and users name them as criteo's.
DataError = records.DataError
BadLineCounter = records.BadLineCounter


def feature_spec(num_int: int = NUM_INT, num_cat: int = NUM_CAT) -> dict[str, tf.TensorSpec]:
  """Batched feature spec (batch dimension None), e.g. for SavedModel serving signatures."""
  return {
      "dense": tf.TensorSpec([None, num_int], tf.float32, name="dense"),
      "categorical": tf.TensorSpec([None, num_cat], tf.int64, name="categorical"),
  }


def resolve_files(file_pattern: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
  """Sorted files matching a glob or a list of globs/paths; FileNotFoundError if one matches
  nothing."""
  return records.resolve_files(file_pattern, "Criteo")


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
    parquet_reader: str = "pyarrow",
    deterministic: bool = True,
    drop_remainder: bool = False,
    bad_line_counter: BadLineCounter | None = None,
) -> tf.data.Dataset:
  """Batches of ``(features, label)`` parsed from Criteo files, shard ``shard_index`` of
  ``num_shards``.

  Shards are disjoint: by file when there are at least ``num_shards`` files, else by line within
  every file. ``bad_lines='error'`` fails iteration naming the file, line and reason of the first
  malformed record (wrong field count, non-numeric integer, non-hex id, label not in {0,1}, a line
  longer than ``MAX_LINE_BYTES``, non-UTF-8 bytes) and raises DataError here for an empty file;
  ``'skip'`` drops malformed records (batches may come out smaller), adds their number to
  ``bad_line_counter`` and skips empty files with a warning. ``parquet_reader``: ``pyarrow``
  (any TensorFlow) or ``tensorflow_io`` (where it loads), data_pipelines/parquet.py.
  """
  records.check_choice("bad_lines", bad_lines, BAD_LINE_POLICIES)
  records.check_choice("file_format", file_format, FILE_FORMATS)
  if num_buckets < 1:
    raise ValueError(f"num_buckets must be positive, got {num_buckets}")
  files = records.drop_empty_files(resolve_files(file_pattern), bad_lines, file_pattern)
  if file_format == "tsv":
    open_file, parse_batch = tf.data.TextLineDataset, _parse_tsv_batch
  else:
    open_file, parse_batch = _parquet_reader(parquet_reader), _parse_parquet_batch
  return records.parsed_batches(
      files, open_file, lambda batch, enforce: _features(*parse_batch(batch, enforce), num_buckets),
      batch_size, bad_lines=bad_lines, prefix=_MESSAGE_PREFIX[file_format],
      blocks=file_format == "parquet",
      counter=bad_line_counter, shard_index=shard_index, num_shards=num_shards, repeat=repeat,
      shuffle_buffer=shuffle_buffer, seed=seed, deterministic=deterministic,
      drop_remainder=drop_remainder)


def _parquet_reader(reader: str) -> Callable[[tf.Tensor], tf.data.Dataset]:
  return parquet.open_blocks({"label": (tf.int64, LABEL_COLUMN), "ints": (tf.int64, INT_COLUMNS),
                              "cats": (tf.string, CAT_COLUMNS)}, reader, required=["label"])


@gin.configurable(module="criteo")
def raw_parser(num_buckets: int = 100_000) -> Callable[[tf.Tensor], dict[str, tf.Tensor]]:
  """``parse(lines)``: the features of raw TSV lines exactly as ``make_dataset`` computes them,
  for a serving signature on raw input (no hashing or transform left to the server).

  A line holds the 39 feature fields, or all 40 with the label first (the label is then checked
  and ignored); a trailing newline is dropped. A malformed line fails the call with
  InvalidArgumentError naming its 0-based index in the batch and the reason. ``num_buckets``
  must be the pipeline's (gin: bind both to ``%NUM_BUCKETS``).
  """
  if num_buckets < 1:
    raise ValueError(f"num_buckets must be positive, got {num_buckets}")

  def parse(lines: tf.Tensor) -> dict[str, tf.Tensor]:
    lines = tf.strings.regex_replace(tf.convert_to_tensor(lines, tf.string), r"\r?\n$", "")
    fields = tf.strings.split(lines, "\t")
    unlabeled = tf.cast(tf.equal(fields.row_lengths(), NUM_FIELDS - 1), tf.int64)
    label = tf.RaggedTensor.from_row_lengths(tf.fill([tf.reduce_sum(unlabeled)], "0"), unlabeled)
    where = lambda i: tf.strings.as_string(i)  # noqa: E731
    checked = functools.partial(records.enforce, where=where, prefix="malformed raw Criteo line ",
                                policy="error", counter=None)
    parsed = _parse_tsv_batch(lines, checked, f"{NUM_FIELDS - 1} (or {NUM_FIELDS} with the "
                              "label first)", fields=tf.concat([label, fields], axis=1))
    return _features(*parsed, num_buckets)[0]

  return parse


def _parse_tsv_batch(lines: tf.Tensor, enforce: EnforceFn,
                     expected_fields: str = str(NUM_FIELDS),
                     fields: tf.RaggedTensor | None = None) -> Tensors:
  """Validates a batch of TSV lines; returns label (bool), ints (int64) and categorical strings.
  ``expected_fields``: how the field count is described when it is wrong; ``fields``: the lines
  already split on tabs, label first (raw serving input, whose label may be missing)."""
  fields = tf.strings.split(lines, "\t") if fields is None else fields
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
    utf8_ok = tf.equal(records.valid_utf8(lines[i]), lines[i])
    return _first_reason([
        (~length_ok[i], tf.strings.join([
            "line of ", tf.strings.as_string(length[i]),
            f" bytes is longer than any valid Criteo line ({MAX_LINE_BYTES} bytes)"])),
        (~utf8_ok, tf.constant("non-UTF-8 bytes in the line")),
        (~count_ok[i], tf.strings.join([f"expected {expected_fields} tab-separated fields, got ",
                                         got])),
        (~label_ok[i], tf.strings.join(["label not in {0,1}", records.shown(label[i])])),
        _column_reason("non-numeric integer field I", int_ok[i], ints[i]),
        _column_reason("non-hex categorical field C", cat_ok[i], cats[i]),
    ])

  label, ints, cats = enforce(ok, describe, [label, ints, cats])
  ints = tf.strings.to_number(tf.where(tf.equal(ints, ""), "0", ints), out_type=tf.int64)
  return [tf.equal(label, "1"), ints, cats]


def _parse_parquet_batch(columns: dict[str, tf.Tensor], enforce: EnforceFn) -> Tensors:
  """Validates a batch of Parquet rows; returns label (bool), ints (int64) and categorical
  strings."""
  label, ints, cats = columns["label"], columns["ints"], columns["cats"]

  label_ok = tf.equal(label, 0) | tf.equal(label, 1)
  cat_ok = tf.strings.regex_full_match(cats, _HEX_RE)
  ok = label_ok & tf.reduce_all(cat_ok, axis=1)

  def describe(i: tf.Tensor) -> tf.Tensor:
    return _first_reason([
        (~label_ok[i], tf.strings.join(["label not in {0,1}", parquet.shown_value(label[i])])),
        _column_reason("non-hex categorical field C", cat_ok[i], cats[i]),
    ])

  label, ints, cats = enforce(ok, describe, [label, ints, cats])
  return [tf.equal(label, 1), ints, cats]


def _features(label: tf.Tensor, ints: tf.Tensor, cats: tf.Tensor,
              num_buckets: int) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
  dense = tf.math.log1p(tf.cast(tf.maximum(ints, 0), tf.float32))
  categorical = tf.strings.to_hash_bucket_fast(tf.strings.lower(cats), num_buckets)
  return {"dense": dense, "categorical": categorical}, tf.cast(label, tf.float32)[:, tf.newaxis]


def _column_reason(what: str, column_ok: tf.Tensor,
                   values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """(any bad, description of the first bad column) for one record's columns."""
  column = tf.argmin(tf.cast(column_ok, tf.int32))
  return ~tf.reduce_all(column_ok), tf.strings.join(
      [what, tf.strings.as_string(column + 1), records.shown(values[column])])


def _first_reason(reasons: list[tuple[tf.Tensor, tf.Tensor]]) -> tf.Tensor:
  message = tf.constant("unknown reason")
  for bad, text in reversed(reasons):
    message = tf.where(bad, text, message)
  return message
