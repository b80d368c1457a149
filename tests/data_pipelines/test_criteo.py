"""Tests of the Criteo input pipeline on small hand-written files."""

import re

import gin
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from data_pipelines import criteo

NUM_BUCKETS = 1000

# (label, 13 integer fields, 26 categorical fields); '' is a missing value.
ROWS = [
    ("0", ["1", "-5", "", "0", "12", "", "3", "", "100", "7", "", "2", "999999999"],
     ["68fd1e64", "80E51FF9", "", "deadBEEF", "a", "0123456789abcdef"] + ["05db9164"] * 20),
    ("1", [""] * 13, [""] * 26),
    ("1", ["-2", "0", "5"] + ["1"] * 9 + ["123456789012345678"],
     ["ABCDEF01"] * 13 + ["fffffff"] * 13),
]


def tsv_line(label, ints, cats):
  return "\t".join([label, *ints, *cats])


GOOD_LINES = [tsv_line(*row) for row in ROWS]


def expected(rows, num_buckets=NUM_BUCKETS):
  """Features the pipeline must produce, computed independently of it."""
  ints = np.array([[int(v) if v else 0 for v in row[1]] for row in rows], dtype=np.int64)
  dense = np.log1p(np.maximum(ints, 0).astype(np.float32))
  cats = tf.strings.to_hash_bucket_fast([[v.lower() for v in row[2]] for row in rows], num_buckets).numpy()
  labels = np.array([[float(row[0])] for row in rows], dtype=np.float32)
  return dense, cats, labels


def write(path, lines, trailing_newline=True):
  path.write_text("\n".join(lines) + ("\n" if trailing_newline else ""))
  return str(path)


def collect(dataset):
  dense, cats, labels = [], [], []
  for features, label in dataset:
    dense.append(features["dense"].numpy())
    cats.append(features["categorical"].numpy())
    labels.append(label.numpy())
  return np.concatenate(dense), np.concatenate(cats), np.concatenate(labels)


def error_message(dataset):
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    for _ in dataset:
      pass
  return str(info.value)


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


BAD_LINES = [
    (tsv_line(*ROWS[0])[:-(len(ROWS[0][2][-1]) + 1)], "expected 40 tab-separated fields, got 39"),
    (GOOD_LINES[0] + "\tabc", "expected 40 tab-separated fields, got 41"),
    (tsv_line("1", ["1", "12a"] + [""] * 11, [""] * 26), "non-numeric integer field I2"),
    (tsv_line("1", [""] * 12 + ["1.5"], [""] * 26), "non-numeric integer field I13"),
    (tsv_line("0", [""] * 13, ["abc"] * 25 + ["xyz1"]), "non-hex categorical field C26"),
    (tsv_line("0", [""] * 13, ["0123456789abcdef0"] + [""] * 25), "non-hex categorical field C1"),
    (tsv_line("2", [""] * 13, [""] * 26), "label not in {0,1}"),
    (tsv_line("", [""] * 13, [""] * 26), "label not in {0,1}"),
    ("", "expected 40 tab-separated fields, got 1"),
]


def test_error_names_file_line_and_reason(tmp_path):
  lines = [GOOD_LINES[0]]
  for bad_line, _ in BAD_LINES:
    lines += [bad_line, GOOD_LINES[1]]
  path = write(tmp_path / "bad.tsv", lines)
  batches = iter(criteo.make_dataset(path, 1))
  outcomes = []
  for _ in lines:  # tf.data goes on after an element fails, so one pass checks every bad line
    try:
      next(batches)
      outcomes.append("ok")
    except tf.errors.InvalidArgumentError as error:
      outcomes.append(str(error))
  for line_number, (line, outcome) in enumerate(zip(lines, outcomes), start=1):
    if line == GOOD_LINES[0] or line == GOOD_LINES[1]:
      assert outcome == "ok"
    else:
      reason = BAD_LINES[line_number // 2 - 1][1]
      assert f"{path}:{line_number}: {reason}" in outcome


def test_error_on_truncated_last_line_without_newline(tmp_path):
  path = write(tmp_path / "cut.tsv", GOOD_LINES + [GOOD_LINES[0][:30]], trailing_newline=False)
  message = error_message(criteo.make_dataset(path, 100))
  assert f"{path}:4: expected 40 tab-separated fields, got " in message


def test_error_line_number_beyond_first_read_block(tmp_path):
  lines = GOOD_LINES * 700  # 2100 lines, more than one read block
  lines[1776] = tsv_line("7", [""] * 13, [""] * 26)
  path = write(tmp_path / "long.tsv", lines)
  message = error_message(criteo.make_dataset(path, 256))
  assert f"{path}:1777: label not in {{0,1}}" in message


def test_skip_drops_bad_lines_and_counts_them(tmp_path):
  bad = [line for line, _ in BAD_LINES]
  lines = [GOOD_LINES[0], bad[0], bad[2], GOOD_LINES[1], *bad[3:], GOOD_LINES[2], bad[1][:30]]
  path = write(tmp_path / "mixed.tsv", lines, trailing_newline=False)
  counter = criteo.BadLineCounter()
  dense, cats, labels = collect(
      criteo.make_dataset(path, 3, num_buckets=NUM_BUCKETS, bad_lines="skip", bad_line_counter=counter))
  want_dense, want_cats, want_labels = expected(ROWS)
  np.testing.assert_allclose(dense, want_dense, rtol=1e-6)
  np.testing.assert_array_equal(cats, want_cats)
  np.testing.assert_array_equal(labels, want_labels)
  assert counter.count == len(lines) - len(GOOD_LINES)


def test_skip_drops_batches_that_become_empty(tmp_path):
  bad = BAD_LINES[6][0]
  path = write(tmp_path / "mixed.tsv", [bad, bad, GOOD_LINES[0], bad, bad])
  counter = criteo.BadLineCounter()
  dataset = criteo.make_dataset(path, 2, bad_lines="skip", bad_line_counter=counter)
  sizes = [label.shape[0] for _, label in dataset]
  assert sizes == [1] and counter.count == 4


def test_missing_files_raise_naming_the_pattern(tmp_path):
  pattern = str(tmp_path / "nothing-*.tsv")
  with pytest.raises(FileNotFoundError, match="nothing-"):
    criteo.make_dataset(pattern, 2)
  present = write(tmp_path / "day.tsv", GOOD_LINES)
  with pytest.raises(FileNotFoundError, match="nothing-") as info:
    criteo.make_dataset([present, pattern], 2)
  assert present not in str(info.value)


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
  paths = [write(tmp_path / f"part-{i}.tsv", numbered_lines(100 * i, 7 + i)) for i in range(num_files)]
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
  first, again = (row_ids(criteo.make_dataset(path, 8, shuffle_buffer=50, seed=3, repeat=True).take(15))
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


def write_parquet(path, rows):
  """Parquet in the documented convention: no nulls, missing int 0, missing categorical ''."""
  columns = {"label": pa.array([int(r[0]) for r in rows], pa.int64())}
  for j, name in enumerate(criteo.INT_COLUMNS):
    columns[name] = pa.array([int(r[1][j]) if r[1][j] else 0 for r in rows], pa.int64())
  for k, name in enumerate(criteo.CAT_COLUMNS):
    columns[name] = pa.array([r[2][k] for r in rows], pa.string())
  pq.write_table(pa.table(columns), str(path))
  return str(path)


def test_parquet_gives_the_same_features_as_tsv_and_names_bad_rows(tmp_path):
  # One dataset for both checks: tensorflow-io makes building a Parquet pipeline slow (seconds).
  path = write_parquet(tmp_path / "day.parquet", ROWS + [("2", *ROWS[2][1:])])
  batches = iter(criteo.make_dataset(path, len(ROWS), num_buckets=NUM_BUCKETS, file_format="parquet"))
  features, labels = next(batches)
  want_dense, want_cats, want_labels = expected(ROWS)
  np.testing.assert_allclose(features["dense"].numpy(), want_dense, rtol=1e-6)
  np.testing.assert_array_equal(features["categorical"].numpy(), want_cats)
  np.testing.assert_array_equal(labels.numpy(), want_labels)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=re.escape(f"{path}:4: label not in {{0,1}} (got: 2)")):
    next(batches)
