"""Tests of the Criteo input pipeline on small hand-written files (malformed input:
tests/reliability)."""

import importlib.util
import re

import gin
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from data_pipelines import criteo
from data_pipelines import parquet
from data_pipelines import records

from testing_utils import CRITEO_ROWS
from testing_utils import GOOD_LINES
from testing_utils import collect
from testing_utils import tsv_line
from testing_utils import write_lines as write

NUM_BUCKETS = 1000

ROWS = CRITEO_ROWS


def expected(rows, num_buckets=NUM_BUCKETS):
  """Features the pipeline must produce, computed independently of it."""
  ints = np.array([[int(v) if v else 0 for v in row[1]] for row in rows], dtype=np.int64)
  dense = np.log1p(np.maximum(ints, 0).astype(np.float32))
  cats = tf.strings.to_hash_bucket_fast([[v.lower() for v in row[2]] for row in rows],
                                        num_buckets).numpy()
  labels = np.array([[float(row[0])] for row in rows], dtype=np.float32)
  return dense, cats, labels


def test_parses_exact_values(tmp_path):
  path = write(tmp_path / "day.tsv", GOOD_LINES)
  dense, cats, labels = collect(criteo.make_dataset(path, 2, num_buckets=NUM_BUCKETS))
  want_dense, want_cats, want_labels = expected(ROWS)
  np.testing.assert_allclose(dense, want_dense, rtol=1e-6)
  np.testing.assert_array_equal(cats, want_cats)
  np.testing.assert_array_equal(labels, want_labels)
  assert dense.dtype == np.float32 and cats.dtype == np.int64 and labels.dtype == np.float32
  assert dense[0, 1] == 0.0 and dense[2, 0] == 0.0  # negative integers clip to 0
  assert cats[0, 3] == tf.strings.to_hash_bucket_fast("deadbeef", NUM_BUCKETS).numpy()


def test_element_spec_matches_feature_spec(tmp_path):
  path = write(tmp_path / "day.tsv", GOOD_LINES)
  features, label = criteo.make_dataset(path, 2).element_spec
  for name, spec in criteo.feature_spec().items():
    assert features[name].shape.as_list() == spec.shape.as_list() == [None, spec.shape[1]]
    assert features[name].dtype == spec.dtype
  assert label.shape.as_list() == [None, 1] and label.dtype == tf.float32


def test_drop_remainder_gives_static_batch(tmp_path):
  path = write(tmp_path / "day.tsv", GOOD_LINES)
  dataset = criteo.make_dataset(path, 2, drop_remainder=True)
  assert dataset.element_spec[1].shape.as_list() == [2, 1]
  assert len(list(dataset)) == 1


@pytest.mark.parametrize("kwargs,name", [
    (dict(bad_lines="ignore"), "ignore"),
    (dict(file_format="csv"), "csv"),
    (dict(shard_index=2, num_shards=2), "shard_index=2"),
    (dict(shard_index=-1, num_shards=2), "num_shards=2"),
])
def test_bad_arguments_raise_value_error(tmp_path, kwargs, name):
  path = write(tmp_path / "day.tsv", GOOD_LINES)
  with pytest.raises(ValueError, match=name):
    criteo.make_dataset(path, 2, **kwargs)


def numbered_lines(start, count):
  """Lines whose I1 is a unique row id, so rows can be told apart after parsing."""
  return [tsv_line("0", [str(i)] + [""] * 12, [""] * 26) for i in range(start, start + count)]


def row_ids(dataset):
  dense, _, _ = collect(dataset)
  return np.rint(np.expm1(dense[:, 0].astype(np.float64))).astype(int).tolist()


@pytest.mark.parametrize("num_files,num_shards", [(4, 2), (2, 3)])  # by file, by line
def test_shards_are_disjoint_and_complete(tmp_path, num_files, num_shards):
  paths = [write(tmp_path / f"part-{i}.tsv", numbered_lines(100 * i, 7 + i))
           for i in range(num_files)]
  everything = [100 * i + j for i in range(num_files) for j in range(7 + i)]
  shards = [row_ids(criteo.make_dataset(paths, 4, shard_index=i, num_shards=num_shards))
            for i in range(num_shards)]
  assert sorted(sum(shards, [])) == everything  # disjoint and complete
  assert all(shards)


def test_glob_reads_all_files_in_order(tmp_path):
  for i in (1, 0):
    write(tmp_path / f"part-{i}.tsv", numbered_lines(100 * i, 3))
  # Files are interleaved in blocks of up to 1024 lines, so small files come whole, in name order.
  assert row_ids(criteo.make_dataset(str(tmp_path / "part-*.tsv"), 2)) == [0, 1, 2, 100, 101, 102]


def test_shuffle_is_seeded_and_repeat_repeats(tmp_path):
  path = write(tmp_path / "day.tsv", numbered_lines(0, 50))
  first, again = (
      row_ids(criteo.make_dataset(path, 8, shuffle_buffer=50, seed=3, repeat=True).take(15))
      for _ in range(2))
  assert first == again and len(first) == 120  # 2.4 epochs
  assert first[:50] != sorted(first[:50]) and sorted(first[:50]) == list(range(50))


def test_gin_configures_make_dataset(tmp_path):
  path = write(tmp_path / "day.tsv", GOOD_LINES)
  with gin.unlock_config():
    gin.parse_config("criteo.make_dataset.num_buckets = 3")
  try:
    _, cats, _ = collect(criteo.make_dataset(path, 2))
  finally:
    gin.clear_config()
  np.testing.assert_array_equal(cats, expected(ROWS, num_buckets=3)[1])


def write_parquet(path, rows, nulls=False):
  """Parquet in the documented convention: no nulls, missing int 0, missing categorical ''
  (``nulls``: missing values as nulls instead)."""
  missing = (lambda value: None) if nulls else (lambda value: value)
  columns = {"label": pa.array([int(r[0]) for r in rows], pa.int64())}
  for j, name in enumerate(criteo.INT_COLUMNS):
    columns[name] = pa.array([int(r[1][j]) if r[1][j] else missing(0) for r in rows], pa.int64())
  for k, name in enumerate(criteo.CAT_COLUMNS):
    columns[name] = pa.array([r[2][k] or missing("") for r in rows], pa.string())
  pq.write_table(pa.table(columns), str(path))
  return str(path)


READERS = ["pyarrow", pytest.param("tensorflow_io", marks=pytest.mark.skipif(
    importlib.util.find_spec("tensorflow_io") is None, reason="tensorflow-io is not installed"))]


@pytest.mark.parametrize("reader", READERS)
def test_parquet_gives_the_same_features_as_tsv_and_names_bad_rows(tmp_path, reader):
  # One dataset for both checks: tensorflow-io makes building a Parquet pipeline slow (seconds).
  path = write_parquet(tmp_path / "day.parquet", ROWS + [("2", *ROWS[2][1:])])
  dataset = criteo.make_dataset(path, len(ROWS), num_buckets=NUM_BUCKETS, file_format="parquet",
                                parquet_reader=reader)
  spec, label_spec = dataset.element_spec  # static shapes, as from TSV (models are built on them)
  assert {k: v.shape.as_list() for k, v in spec.items()} == {
      k: v.shape.as_list() for k, v in criteo.feature_spec().items()}
  assert label_spec.shape.as_list() == [None, 1]
  batches = iter(dataset)
  features, labels = next(batches)
  want_dense, want_cats, want_labels = expected(ROWS)
  np.testing.assert_allclose(features["dense"].numpy(), want_dense, rtol=1e-6)
  np.testing.assert_array_equal(features["categorical"].numpy(), want_cats)
  np.testing.assert_array_equal(labels.numpy(), want_labels)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=re.escape(f"{path}:4: label not in {{0,1}} (got: 2)")):
    next(batches)


@pytest.mark.parametrize("reader", READERS)
def test_parquet_read_in_several_chunks_keeps_every_row_once_and_row_numbers(tmp_path, monkeypatch,
                                                                              reader):
  monkeypatch.setattr(parquet, "CHUNK", 2 * records.READ_BLOCK)  # 5 chunks, not 1
  rows = [ROWS[i % len(ROWS)] for i in range(9000)]
  good = write_parquet(tmp_path / "good.parquet", rows)
  dense, cats, labels = collect(criteo.make_dataset(good, 1000, num_buckets=NUM_BUCKETS,
                                                    file_format="parquet", parquet_reader=reader))
  want_dense, want_cats, want_labels = expected(rows)
  np.testing.assert_array_equal(labels, want_labels)
  np.testing.assert_array_equal(cats, want_cats)
  np.testing.assert_allclose(dense, want_dense, rtol=1e-6)
  rows[7777] = ("2", *rows[7777][1:])
  bad = write_parquet(tmp_path / "bad.parquet", rows)
  with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"{bad}:7778: label not in")):
    collect(criteo.make_dataset(bad, 1000, num_buckets=NUM_BUCKETS, file_format="parquet",
                                parquet_reader=reader))


def test_pyarrow_reads_parquet_nulls_as_missing_values(tmp_path):
  with_nulls = write_parquet(tmp_path / "nulls.parquet", ROWS, nulls=True)
  got = collect(criteo.make_dataset(with_nulls, len(ROWS), num_buckets=NUM_BUCKETS,
                                    file_format="parquet"))
  for array, want in zip(got, expected(ROWS)):
    np.testing.assert_allclose(array, want, rtol=1e-6)


def test_a_null_or_fractional_parquet_label_is_a_bad_row_not_a_negative_example(tmp_path):
  path = write_parquet(tmp_path / "labels.parquet", ROWS)
  table = pq.read_table(path)
  labels = [int(r[0]) for r in ROWS]
  labels[1] = None
  nulls = str(tmp_path / "null_label.parquet")
  pq.write_table(table.set_column(0, "label", pa.array(labels, pa.int64())), nulls)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=re.escape(f"{nulls}:2: label not in {{0,1}} (got: null)")):
    collect(criteo.make_dataset(nulls, len(ROWS), num_buckets=NUM_BUCKETS, file_format="parquet"))
  fractional = str(tmp_path / "fractional_label.parquet")
  pq.write_table(table.set_column(0, "label", pa.array([0.7] * len(ROWS), pa.float64())),
                 fractional)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=re.escape(f"{fractional}: unreadable Parquet file (")):
    collect(criteo.make_dataset(fractional, len(ROWS), num_buckets=NUM_BUCKETS,
                                file_format="parquet"))


def test_a_parquet_file_without_a_column_is_named_with_the_column(tmp_path):
  path = str(tmp_path / "short.parquet")
  pq.write_table(pa.table({"label": pa.array([0, 1], pa.int64())}), path)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=re.escape(f"{path}: unreadable Parquet file (no Parquet column C1, "
                                     "C10")):
    collect(criteo.make_dataset(path, 2, file_format="parquet"))
  garbage = tmp_path / "garbage.parquet"
  garbage.write_bytes(b"not a parquet file at all" * 10)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=re.escape(f"{garbage}: unreadable Parquet file (")):
    collect(criteo.make_dataset(str(garbage), 2, file_format="parquet"))
  with pytest.raises(ValueError, match="Parquet reader='arrow' is not one of"):
    criteo.make_dataset(path, 2, file_format="parquet", parquet_reader="arrow")
