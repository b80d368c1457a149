"""int8 teachers: quantized copies predict like their float model, load from real peer versions,
and hold under a third of its bytes."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill import losses
from tf_codistill.exchange import directory as exchange
from tf_codistill.exchange.config import Exchange
from tf_codistill.models import ctr
from tf_codistill.teachers import pool as teachers
from tf_codistill.teachers import quantization
from tf_codistill.teachers.spec import TeacherSpec
from tf_codistill.training.model import CodistillModel

from testing_utils import project_model
from testing_utils import restored_lm_teacher

# Stated tolerance: int8 codes keep a relative error of at most 1/254 of each row's largest
# weight (times 1 + 2^-8: a scale is rounded to a bfloat16 value); through a small model,
# probabilities stay within 0.03 and their mean within 0.005.
MAX_ABS_PROB_DIFF = 0.03
MEAN_ABS_PROB_DIFF = 0.005


def _bytes(model):
  return sum(int(np.prod(w.shape)) * w.dtype.size for w in model.weights)


@pytest.mark.parametrize("name", ["lm", "resnet", "ctr"])
def test_an_int8_copy_predicts_like_its_float_model(name):
  model, output, x = project_model(name)
  reference = losses.probabilities(model(x, training=False), output).numpy()
  teacher = quantization.int8_copy(model)
  teacher(x, training=False)
  quantization.assign_float_weights(teacher, model.get_weights())
  quantized = [layer for layer in teacher.layers if isinstance(layer, quantization.Int8Layer)]
  assert quantized and all(layer.codes.dtype == tf.int8 for layer in quantized)
  probs = losses.probabilities(teacher(x, training=False), output).numpy()
  diff = np.abs(probs - reference)
  assert diff.max() < MAX_ABS_PROB_DIFF and diff.mean() < MEAN_ABS_PROB_DIFF, (
      diff.max(), diff.mean())
  for got, want in zip(quantization.float_weights(teacher), model.get_weights()):
    np.testing.assert_allclose(got, want, atol=np.abs(want).max() / 254 * (1 + 2 ** -8) + 1e-7)


def test_an_int8_ctr_teacher_holds_under_a_third_of_the_float_bytes():
  # 16-wide embedding rows: 16 one-byte codes and a 4-byte scale against 64 bytes.
  model = ctr.ctr_model(num_buckets=1000, embedding_dim=16, hidden_units=(16,), seed=0)
  teacher = quantization.int8_copy(model)
  teacher(project_model("ctr")[2], training=False)
  assert _bytes(teacher) < 0.33 * _bytes(model), (_bytes(teacher), _bytes(model))


def test_int8_dense_scales_its_kernel_rows_for_inputs_that_come_as_codes():
  # Inputs 0-2 arrive as codes (value / scale), input 3 as a value: the layer's output is the
  # float layer's on the values, each scale applied to its kernel row instead of to the input.
  kernel = np.array([[0.5, -1.0], [0.25, 2.0], [-0.75, 0.125], [1.0, 1.0]], np.float32)
  layer = quantization.Int8Dense(2, "relu", dtype="bfloat16")
  layer(tf.zeros([1, 4]))
  layer.assign_float([kernel, np.array([0.5, -0.25], np.float32)])
  values = np.array([[0.3, -0.6, 1.2, 2.0], [-0.9, 0.15, 0.6, -1.0]], np.float32)
  scales = np.array([0.3, 0.15, 0.6], np.float32)
  codes = values.copy()
  codes[:, :3] /= scales
  got = layer(tf.constant(codes), input_scales=tf.constant(scales))
  want = layer(tf.constant(values))
  # bfloat16 sums of terms up to 2: within 2^-7 of each other.
  np.testing.assert_allclose(tf.cast(got, tf.float32), tf.cast(want, tf.float32), atol=2 ** -7)
  np.testing.assert_allclose(tf.cast(want, tf.float32),
                             np.maximum(values @ kernel + [0.5, -0.25], 0), rtol=0.02, atol=0.02)
  assert float(tf.reduce_max(tf.abs(tf.cast(got, tf.float32)))) > 0


def test_assign_float_weights_refuses_values_that_do_not_fit_naming_the_shape():
  model, _, x = project_model("ctr")
  teacher = quantization.int8_copy(model)
  teacher(x, training=False)
  weights = model.get_weights()
  with pytest.raises(ValueError, match="arrays for a model with"):
    quantization.assign_float_weights(teacher, weights[:-1])
  with pytest.raises(ValueError, match=r"shape \(3,\)"):
    quantization.assign_float_weights(teacher, weights[:-1] + [np.zeros(3, np.float32)])


def test_an_int8_teacher_is_restored_from_a_float32_peer_version(tmp_path):
  peer, output, x, model, teacher = restored_lm_teacher(tmp_path, "int8", probe=True)
  assert quantization.is_quantized(teacher)
  reference = losses.probabilities(peer(x, training=False), output).numpy()
  diff = np.abs(model.teacher_target(x).numpy() - reference)
  assert diff.max() < MAX_ABS_PROB_DIFF and diff.mean() < MEAN_ABS_PROB_DIFF, (
      diff.max(), diff.mean())


def test_a_codistill_model_with_an_int8_teacher_trains(tmp_path):
  student, _, x = project_model("ctr")
  model = CodistillModel(student, exchange=Exchange(str(tmp_path), 0),
                         teachers=TeacherSpec(precision="int8"))
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  model(x)
  model.set_teacher_weights(0, ctr.ctr_model(num_buckets=100, embedding_dim=4, hidden_units=(16,),
                                             seed=3).get_weights(), step=1)
  logs = model.train_on_batch(x, tf.ones([8, 1]), return_dict=True)
  assert np.isfinite(logs["distill_loss"]) and logs["distill_loss"] > 0
  with pytest.raises(ValueError, match="teacher 0: 1 arrays"):
    model.set_teacher_weights(0, student.get_weights()[:1], step=2)


def test_a_stacked_ctr_teacher_is_restored_from_a_float32_peer_version(tmp_path):
  peer, output, x = project_model("ctr")
  spec = {"dense": tf.TensorSpec([None, 13], tf.float32),
          "categorical": tf.TensorSpec([None, 26], tf.int64)}
  exchange.publish(peer, str(tmp_path), 1, 40, spec)
  student, _, _ = project_model("ctr")
  model = CodistillModel(student, exchange=Exchange(str(tmp_path), group=0),
                         teachers=TeacherSpec(factory=lambda: ctr.ctr_teacher(student)))
  model(x)
  assert quantization.is_converted(model.inactive_teacher(0))
  assert not quantization.is_converted(model.copy_student())  # exports keep the student's form
  pool = teachers.TeacherPool(str(tmp_path), [1], model, spec, [None, 1], probe=x)
  assert pool.poll_once() == 1 and pool.rejections == 0
  model.activate_teacher(0, 40)
  reference = losses.probabilities(peer(x, training=False), output).numpy()
  np.testing.assert_allclose(model.teacher_target(x).numpy(), reference, atol=1e-6)
