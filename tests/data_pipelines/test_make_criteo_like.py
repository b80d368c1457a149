"""Tests of the Criteo-format data generator and its planted ground truth."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_pipelines import criteo
from data_pipelines import make_criteo_like as gen

NUM_ROWS = 20_000


@pytest.fixture(scope="module")
def tsv_files(tmp_path_factory):
  return gen.generate(str(tmp_path_factory.mktemp("tsv")), NUM_ROWS, 2, seed=11)


@pytest.fixture(scope="module")
def tsv_rows(tsv_files):
  return read_tsv(tsv_files)


def read_tsv(paths):
  """(labels, ints with '' -> None, categorical strings) parsed with plain Python."""
  rows = [line.split("\t") for path in paths for line in open(path).read().splitlines()]
  assert all(len(row) == criteo.NUM_FIELDS for row in rows)
  labels = np.array([int(row[0]) for row in rows])
  ints = [[int(v) if v else None for v in row[1:1 + criteo.NUM_INT]] for row in rows]
  cats = np.array([row[1 + criteo.NUM_INT:] for row in rows])
  return labels, ints, cats


def auc(scores, labels):
  ranks = np.empty(len(scores))
  ranks[np.argsort(scores)] = np.arange(1, len(scores) + 1)
  positives = labels.sum()
  negatives = len(labels) - positives
  return (ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)


def test_same_seed_same_bytes_and_layout(tmp_path):
  first = gen.generate(str(tmp_path / "a"), 1001, 3, seed=7)
  again = gen.generate(str(tmp_path / "b"), 1001, 3, seed=7)
  other = gen.generate(str(tmp_path / "c"), 1001, 3, seed=8)
  assert [os.path.basename(p) for p in first] == [f"part-0000{i}-of-00003.tsv" for i in range(3)]
  # No temporaries left.
  assert sorted(os.listdir(tmp_path / "a")) == [os.path.basename(p) for p in first]
  for a, b, c in zip(first, again, other):
    assert open(a, "rb").read() == open(b, "rb").read() != open(c, "rb").read()
  assert [len(open(p).read().splitlines()) for p in first] == [334, 334, 333]


def test_files_parse_with_no_bad_lines(tsv_files):
  counter = criteo.BadLineCounter()
  dataset = criteo.make_dataset(tsv_files, 4096, bad_lines="skip", bad_line_counter=counter)
  assert sum(label.shape[0] for _, label in dataset) == NUM_ROWS
  assert counter.count == 0


def test_positive_rate_missing_rate_and_heavy_tail(tsv_rows):
  labels, ints, cats = tsv_rows
  assert abs(labels.mean() - 0.25) < 0.02
  missing = (np.mean([v is None for row in ints for v in row]) + np.mean(cats == "")) / 2
  assert abs(missing - 0.02) < 0.005
  assert any(v < 0 for row in ints for v in row if v is not None)  # like real Criteo's I2
  _, counts = np.unique(cats[:, 0][cats[:, 0] != ""], return_counts=True)
  assert counts.max() > 100 * np.median(counts)


def test_labels_follow_the_planted_model(tsv_rows):
  labels, ints, cats = tsv_rows
  model = gen.planted_model()
  ids = np.empty(cats.shape, dtype=np.int64)
  for k in range(criteo.NUM_CAT):
    id_of = {hex_id: i for i, hex_id in enumerate(model.cat_hex[k])}  # '' maps to vocab_size
    ids[:, k] = [id_of[v] for v in cats[:, k]]
  values = np.array([[v or 0 for v in row] for row in ints])
  logits = model.logit(values, ids)
  assert auc(logits, labels) > 0.8
  assert abs((1 / (1 + np.exp(-logits))).mean() - labels.mean()) < 0.02
  # Interactions carry signal beyond the per-feature (linear) part.
  assert auc(logits, labels) > auc(model.logit(values, ids, interactions=False), labels) + 0.02


def test_base_rate_is_calibrated(tmp_path):
  labels, _, _ = read_tsv(gen.generate(str(tmp_path), 10_000, seed=3, base_rate=0.1))
  assert abs(labels.mean() - 0.1) < 0.015


def test_row_seeds_share_the_ground_truth(tmp_path):

  def top_id(paths):
    values, counts = np.unique(read_tsv(paths)[2][:, 0], return_counts=True)
    return values[np.argmax(counts)]

  train = gen.generate(str(tmp_path / "train"), 2000, seed=1)
  valid = gen.generate(str(tmp_path / "valid"), 2000, seed=2)
  other = gen.generate(str(tmp_path / "other"), 2000, seed=1, model_seed=99)
  assert top_id(train) == top_id(valid) != top_id(other)


def test_parquet_holds_the_same_rows_as_tsv(tmp_path):
  tsv = gen.generate(str(tmp_path), 3000, 2, seed=5)
  parquet = gen.generate(str(tmp_path), 3000, 2, seed=5, file_format="parquet")
  assert [p.replace(".tsv", ".parquet") for p in tsv] == parquet
  labels, ints, cats = read_tsv(tsv)
  table = pa.concat_tables([pq.read_table(p) for p in parquet])
  assert table.column_names == [criteo.LABEL_COLUMN, *criteo.INT_COLUMNS, *criteo.CAT_COLUMNS]
  assert table.column("C1").type == "string" and table.column("I1").type == "int64"
  assert all(column.null_count == 0 for column in table.columns)
  np.testing.assert_array_equal(table.column("label").to_numpy(), labels)
  np.testing.assert_array_equal(
      np.stack([table.column(n).to_numpy() for n in criteo.INT_COLUMNS], 1),
      np.array([[v or 0 for v in row] for row in ints]))
  np.testing.assert_array_equal(
      np.stack([table.column(n).to_numpy(zero_copy_only=False) for n in criteo.CAT_COLUMNS], 1),
      cats)


def test_unknown_format_raises(tmp_path):
  with pytest.raises(ValueError, match="csv"):
    gen.generate(str(tmp_path), 10, file_format="csv")
