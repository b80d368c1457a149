"""Bytes per step as TF's ring collectives send them, and what a codistillation group publishes."""

import pytest
import tensorflow as tf
import tf_keras as keras

from benchmarks import traffic


def _model():
  ids = keras.Input((2,), dtype=tf.int64, name="ids")
  num = keras.Input((3,), name="num")
  emb = keras.layers.Flatten()(keras.layers.Embedding(100, 4)(ids))
  h = keras.layers.Dense(5)(keras.layers.Concatenate()([emb, num]))
  return keras.Model({"ids": ids, "num": num}, keras.layers.Dense(1)(h))


def _batch(n=8):
  return {"ids": tf.zeros([n, 2], tf.int64), "num": tf.zeros([n, 3])}


def test_gradient_infos_see_the_embedding_gradient_as_rows():
  infos = traffic.gradient_infos(_model(), _batch())
  assert [(g.elements, g.sparse_rows) for g in infos] == [
      (16 * 4, 16), (11 * 5, None), (5, None), (5, None), (1, None)]


@pytest.mark.parametrize("dtype,workers,expected", [
    # dense 66 floats; sparse 16 rows x 4 values + 16 int64 indices + the row count
    ("float32", 2, 66 * 4 + (16 * 4 * 4 + 16 * 8 + 4)),
    ("float32", 4, 1.5 * 66 * 4 + 3 * (16 * 4 * 4 + 16 * 8 + 4)),
    ("float16", 4, 1.5 * 66 * 2 + 3 * (16 * 4 * 2 + 16 * 8 + 4) + 3 * 5 * 4),
    ("bfloat16", 4, 3 * 66 * 2 + 3 * (16 * 4 * 2 + 16 * 8 + 4)),
])
def test_allreduce_bytes_per_worker(dtype, workers, expected):
  infos = traffic.gradient_infos(_model(), _batch())
  result = traffic.allreduce_bytes(infos, workers, dtype)
  assert result["bytes_per_step"] == pytest.approx(expected)


def test_packing_changes_the_number_of_collectives_not_the_bytes():
  infos = traffic.gradient_infos(_model(), _batch())
  one_pack = traffic.allreduce_bytes(infos, 2, "float32", bytes_per_pack=0)
  per_tensor = traffic.allreduce_bytes(infos, 2, "float32", bytes_per_pack=1)
  assert one_pack["bytes_per_step"] == per_tensor["bytes_per_step"]
  # 1 or 4 dense packs, plus 3 all-gathers (row count, values, indices) for the embedding.
  assert (one_pack["collectives"], per_tensor["collectives"]) == (1 + 3, 4 + 3)


def test_codistill_bytes_is_the_saved_model_over_the_interval():
  model = _model()
  spec = {"ids": tf.TensorSpec([None, 2], tf.int64), "num": tf.TensorSpec([None, 3])}
  result = traffic.codistill_bytes(model, spec, publish_every_steps=100)
  weights = sum(w.size * 4 for w in model.get_weights())
  assert weights < result["saved_model_bytes"] < weights + 2_000_000
  assert result["bytes_per_step"] == result["saved_model_bytes"] / 100
