"""Reduced-precision teachers: a bfloat16 copy of a trained-like model predicts within tolerance."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill import losses
from tf_codistill.teachers.spec import TeacherSpec
from tf_codistill.training.model import CodistillModel
from tf_codistill.training.model import clone_architecture

from testing_utils import project_model
from testing_utils import restored_lm_teacher

# Stated tolerance: bfloat16 keeps 8 bits of mantissa (relative error ~0.4% per operation), so
# teacher probabilities stay within 0.02 (absolute) of float32 and the mean difference under 0.005.
MAX_ABS_PROB_DIFF = 0.02
MEAN_ABS_PROB_DIFF = 0.005


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "bfloat16"])
@pytest.mark.parametrize("name", ["lm", "resnet", "ctr"])
def test_bfloat16_teacher_predictions_within_tolerance(name, policy):
  model, output, x = project_model(name)
  reference = losses.probabilities(model(x, training=False), output).numpy()
  teacher = clone_architecture(model, dtype_policy=policy)
  teacher(x, training=False)
  # Kernels and embeddings follow the policy (BatchNormalization keeps float32 variables).
  kernels = {w.dtype for w in teacher.weights if "kernel" in w.name or "embeddings" in w.name}
  assert kernels == {tf.float32 if policy == "mixed_bfloat16" else tf.bfloat16}
  teacher.set_weights([value.astype(w.dtype.as_numpy_dtype)
                       for w, value in zip(teacher.weights, model.get_weights())])
  logits = teacher(x, training=False)
  assert logits.dtype == tf.bfloat16
  probs = losses.probabilities(tf.cast(logits, tf.float32), output).numpy()
  diff = np.abs(probs - reference)
  assert diff.max() < MAX_ABS_PROB_DIFF and diff.mean() < MEAN_ABS_PROB_DIFF, (
      diff.max(), diff.mean())


def test_codistill_model_with_bfloat16_teachers_trains_in_float32():
  model, _, x = project_model("lm")
  wrapped = CodistillModel(model, 1, output="softmax",
                           teachers=TeacherSpec(
                               factory=lambda: clone_architecture(model, "mixed_bfloat16")))
  wrapped.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  wrapped(x)
  wrapped.set_teacher_weights(0, model.get_weights(), step=1)
  y = tf.zeros([8, 20], tf.int32)
  logs = wrapped.train_on_batch(x, y, return_dict=True)
  assert np.isfinite(logs["distill_loss"]) and logs["distill_loss"] > 0
  assert wrapped.teacher_target(x).dtype == tf.float32


def test_pure_bfloat16_teacher_is_restored_from_a_float32_peer_version(tmp_path):
  # A peer publishes its float32 model as usual; the pool reads its float32 values by key and
  # casts them into the bfloat16 teacher (a checkpoint restores only into its saved dtype).
  peer, output, x, model, teacher = restored_lm_teacher(tmp_path, "bfloat16")
  assert {w.dtype for w in teacher.weights} == {tf.bfloat16}  # an LSTM LM has no BatchNorm
  for restored, original in zip(teacher.get_weights(), peer.get_weights()):
    np.testing.assert_allclose(restored.astype(np.float32), original, rtol=1e-2, atol=1e-6)
  reference = losses.probabilities(peer(x, training=False), output).numpy()
  diff = np.abs(model.teacher_target(x).numpy() - reference)
  assert diff.max() < MAX_ABS_PROB_DIFF and diff.mean() < MEAN_ABS_PROB_DIFF, (
      diff.max(), diff.mean())
