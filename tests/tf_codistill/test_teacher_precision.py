"""Reduced-precision teachers: a bfloat16 copy of a trained-like model predicts within tolerance."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill import losses
from tf_codistill.model import CodistillModel, clone_architecture
from tf_codistill.models import ctr
from tf_codistill.models import lm
from tf_codistill.models import resnet

# Stated tolerance: bfloat16 keeps 8 bits of mantissa (relative error ~0.4% per operation), so
# teacher probabilities stay within 0.02 (absolute) of float32 and the mean difference under 0.005.
MAX_ABS_PROB_DIFF = 0.02
MEAN_ABS_PROB_DIFF = 0.005


def _inputs(name):
  if name == "lm":
    return lm.lstm_lm(200, 32, (64,), seed=0), "softmax", {
        "tokens": tf.random.stateless_uniform([8, 20], [1, 2], 0, 200, tf.int32)}
  if name == "resnet":
    return resnet.resnet(10, widths=(8, 16), seed=0), "softmax", {
        "image": tf.random.stateless_uniform([8, 28, 28, 1], [1, 2])}
  return ctr.ctr_model(num_buckets=100, embedding_dim=4, hidden_units=(16,), seed=0), "sigmoid", {
      "dense": tf.random.stateless_uniform([8, 13], [1, 2]),
      "categorical": tf.random.stateless_uniform([8, 26], [1, 2], 0, 100, tf.int64)}


@pytest.mark.parametrize("name", ["lm", "resnet", "ctr"])
def test_bfloat16_teacher_predictions_within_tolerance(name):
  model, output, x = _inputs(name)
  reference = losses.probabilities(model(x, training=False), output).numpy()
  teacher = clone_architecture(model, dtype_policy="mixed_bfloat16")
  teacher(x, training=False)
  teacher.set_weights(model.get_weights())  # float32 variables: the same checkpoint loads
  assert all(w.dtype == tf.float32 for w in teacher.weights)
  logits = teacher(x, training=False)
  assert logits.dtype == tf.bfloat16
  probs = losses.probabilities(tf.cast(logits, tf.float32), output).numpy()
  diff = np.abs(probs - reference)
  assert diff.max() < MAX_ABS_PROB_DIFF and diff.mean() < MEAN_ABS_PROB_DIFF, (diff.max(), diff.mean())


def test_codistill_model_with_bfloat16_teachers_trains_in_float32():
  model, _, x = _inputs("lm")
  wrapped = CodistillModel(model, 1, output="softmax",
                           teacher_factory=lambda: clone_architecture(model, "mixed_bfloat16"))
  wrapped.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  wrapped(x)
  wrapped.set_teacher_weights(0, model.get_weights(), step=1)
  y = tf.zeros([8, 20], tf.int32)
  logs = wrapped.train_on_batch(x, y, return_dict=True)
  assert np.isfinite(logs["distill_loss"]) and logs["distill_loss"] > 0
  assert wrapped.teacher_target(x).dtype == tf.float32
