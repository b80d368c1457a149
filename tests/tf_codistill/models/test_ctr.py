"""The CTR model: shapes, where its initial weights come from, and its stacked teacher form."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill.exchange import weight_codecs
from tf_codistill.models import ctr
from tf_codistill.teachers import quantization
from tf_codistill.teachers.spec import TeacherSpec


def _weights(seed=None, global_seed=None):
  if global_seed is not None:
    keras.utils.set_random_seed(global_seed)
  model = ctr.ctr_model(num_dense=3, num_categorical=2, num_buckets=50, embedding_dim=4,
                        hidden_units=(8,), seed=seed)
  return model, np.concatenate([w.ravel() for w in model.get_weights()])


def test_logits_shape_from_dense_and_categorical_inputs():
  model, _ = _weights(seed=1)
  logits = model({"dense": tf.zeros([5, 3]), "categorical": tf.constant([[1, 2]] * 5, tf.int64)})
  assert logits.shape == (5, 1)


def test_unseeded_weights_follow_the_global_seed_so_retrains_differ():
  _, a = _weights(global_seed=1)
  _, b = _weights(global_seed=1)
  _, c = _weights(global_seed=2)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)


def test_explicit_seed_fixes_the_weights_whatever_the_global_seed():
  _, a = _weights(seed=3, global_seed=1)
  _, b = _weights(seed=3, global_seed=2)
  np.testing.assert_array_equal(a, b)


def _batch(num_categorical=26, buckets=100):
  return {"dense": tf.random.stateless_uniform([8, 13], [1, 2]),
          "categorical": tf.random.stateless_uniform([8, num_categorical], [3, 4], 0, buckets,
                                                     tf.int64)}


@pytest.mark.parametrize("policy,tolerance", [(None, 0.0), ("bfloat16", 0.02),
                                              ("mixed_bfloat16", 0.02)])
def test_a_stacked_teacher_predicts_like_its_student(policy, tolerance):
  student = ctr.ctr_model(num_buckets=100, embedding_dim=4, hidden_units=(16, 8), seed=0)
  x = _batch()
  teacher = ctr.ctr_teacher(student, dtype_policy=policy)
  teacher(x)
  quantization.assign_float_weights(teacher, student.get_weights())
  assert len(teacher.get_layer("stacked_embeddings").weights) == 1
  got = tf.cast(teacher(x), tf.float32).numpy()
  if policy is None:  # the same values in the same order into the same matmuls
    np.testing.assert_array_equal(got, student(x).numpy())
  np.testing.assert_allclose(got, student(x).numpy(), atol=tolerance)
  if policy is None:  # the stacked table gives back each student table as it is
    for back, want in zip(quantization.float_weights(teacher), student.get_weights()):
      np.testing.assert_array_equal(back, want)


def test_an_int8_stacked_teacher_codes_each_table_column_and_predicts_like_its_student():
  student = ctr.ctr_model(num_buckets=100, embedding_dim=4, hidden_units=(16, 8), seed=0)
  x = _batch()
  teacher = ctr.ctr_teacher(student, dtype_policy="int8")
  teacher(x)
  quantization.assign_float_weights(teacher, student.get_weights())
  assert quantization.is_quantized(teacher)
  block = teacher.get_layer("stacked_input")
  stacked, first = block.tables, block.dense
  assert stacked.codes.dtype == tf.int8 and stacked.codes.shape == (26 * 100, 4)
  assert stacked.column_scales.shape == (26 * 4,) and first.codes.shape == (26 * 4 + 13, 16)
  # int8 weights (float32 scales and biases), computing in bfloat16 from the lookup on.
  computing = [block, stacked, first] + [teacher.get_layer(name) for name in ("hidden_1", "logits")]
  assert [layer.compute_dtype for layer in computing] == ["bfloat16"] * 5
  assert {v.dtype for v in teacher.weights} == {tf.int8, tf.float32}
  assert teacher(x).dtype == tf.bfloat16
  # Each table's codes are the int8 codec's for its columns: the largest value of a column is
  # code +-127, and the lookup returns codes, unscaled.
  tables = [w for w in student.get_weights() if w.shape == (100, 4)]
  encoded = [weight_codecs.encode(table.T, "int8") for table in tables]
  np.testing.assert_array_equal(stacked.codes.numpy(),
                                np.concatenate([e.values.T for e in encoded]))
  np.testing.assert_array_equal(stacked.column_scales.numpy(),
                                np.concatenate([e.scales for e in encoded]))
  np.testing.assert_array_equal(np.abs(stacked.codes.numpy()).reshape(26, 100, 4).max(axis=1), 127)
  rows = stacked(x["categorical"]).numpy().reshape(8, 26, 4)
  ids = x["categorical"].numpy() + np.arange(26) * 100
  np.testing.assert_array_equal(rows, stacked.codes.numpy()[ids])
  # The column scales go into the first kernel's rows: its output is the float layer's.
  np.testing.assert_allclose(teacher(x).numpy(), student(x).numpy(), atol=0.02)
  for back, want in zip(quantization.float_weights(teacher), student.get_weights()):
    assert back.shape == want.shape
    if want.shape == (100, 4):  # a table: one scale per column
      limit = np.abs(want).max(axis=0) * weight_codecs.INT8_ROW_ERROR
    elif want.ndim == 2:  # a kernel: one scale per input row
      limit = np.abs(want).max(axis=1, keepdims=True) * weight_codecs.INT8_ROW_ERROR
    else:  # a bias, kept in float32
      limit = 0.0
    assert np.all(np.abs(back - want) <= limit + 1e-7)


def test_a_stacked_lookup_reads_each_column_from_its_own_table():
  student = ctr.ctr_model(num_dense=2, num_categorical=3, num_buckets=5, embedding_dim=2,
                          hidden_units=(), seed=0)
  teacher = ctr.ctr_teacher(student)
  x = {"dense": tf.zeros([1, 2]), "categorical": tf.constant([[4, 0, 2]], tf.int64)}
  teacher(x)
  weights = [np.full([5, 2], float(t)) + np.arange(5)[:, None] / 10 for t in range(3)]
  quantization.assign_float_weights(teacher, weights + student.get_weights()[3:])
  rows = teacher.get_layer("stacked_embeddings")(x["categorical"]).numpy()
  np.testing.assert_allclose(rows, [[0.4, 0.4, 1.0, 1.0, 2.2, 2.2]], rtol=1e-6)


class _Unbuilt(keras.Model):

  def call(self, inputs):
    return inputs


def test_ctr_teacher_refuses_a_model_that_is_not_a_ctr_model():
  other = keras.Sequential([keras.layers.Dense(1, input_shape=(4,))])
  with pytest.raises(ValueError, match="is not a models.ctr_model"):
    ctr.ctr_teacher(other)
  for unbuilt in (_Unbuilt(), _Unbuilt(name="ctr_model")):  # no inputs to read yet
    with pytest.raises(ValueError, match="is not a models.ctr_model"):
      ctr.ctr_teacher(unbuilt)


def test_an_unbuilt_stacked_teacher_is_already_a_converted_model():
  teacher = ctr.ctr_teacher(ctr.ctr_model(num_buckets=10, embedding_dim=2, hidden_units=()))
  assert quantization.is_converted(teacher)


@pytest.mark.parametrize("saved_stacked", [False, True])
def test_a_run_resumed_with_the_other_teacher_form_restores_no_teacher(tmp_path, saved_stacked):
  # Clone and stacked teachers are keyed apart in a checkpoint: the clone's first table would
  # otherwise restore into the stacked table's key, or the stacked one be left at zeros while
  # teacher_steps said it was loaded.
  from tf_codistill.training.model import CodistillModel

  def codistill(stacked, seed):
    student = ctr.ctr_model(num_buckets=100, embedding_dim=4, hidden_units=(16, 8), seed=seed)
    factory = (lambda: ctr.ctr_teacher(student)) if stacked else None
    model = CodistillModel(student, 1, teachers=TeacherSpec(factory=factory))
    model(_batch())
    return model

  peer = ctr.ctr_model(num_buckets=100, embedding_dim=4, hidden_units=(16, 8), seed=2)
  model = codistill(saved_stacked, seed=0)
  model.set_teacher_weights(0, peer.get_weights(), step=7)
  path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
  fresh = codistill(not saved_stacked, seed=1)
  assert not np.array_equal(fresh.student(_batch()), model.student(_batch()))
  tf.train.Checkpoint(model=fresh).read(path).expect_partial()
  np.testing.assert_array_equal(fresh.student(_batch()), model.student(_batch()))
  assert fresh.teacher_steps.numpy().tolist() == [-1]
  again = codistill(saved_stacked, seed=1)
  tf.train.Checkpoint(model=again).read(path).assert_existing_objects_matched()
  assert again.teacher_steps.numpy().tolist() == [7]
  assert again.active_slot.numpy().tolist() == [1]
  np.testing.assert_array_equal(again.active_teacher(0)(_batch()), peer(_batch()))
