"""Losses against values computed by hand (numpy), and their gradients."""

import math

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill import losses


def _sigmoid(z):
  return 1.0 / (1.0 + math.exp(-z))


def test_average_teacher_target_sigmoid_masks_unloaded_teachers():
  logits = tf.constant([[[0.0], [2.0]], [[1.0], [-1.0]], [[50.0], [50.0]]])  # 3 teachers, B=2
  target = losses.average_teacher_target(logits, [1.0, 1.0, 0.0], output="sigmoid")
  expected = [[(_sigmoid(0.0) + _sigmoid(1.0)) / 2], [(_sigmoid(2.0) + _sigmoid(-1.0)) / 2]]
  np.testing.assert_allclose(target.numpy(), expected, rtol=1e-6)


def test_average_teacher_target_softmax_with_temperature():
  logits = tf.constant([[[2.0, 0.0]], [[0.0, 0.0]]])  # 2 teachers, B=1, 2 classes
  target = losses.average_teacher_target(logits, [1.0, 1.0], output="softmax", temperature=2.0)
  p0 = math.exp(1.0) / (math.exp(1.0) + 1.0)
  np.testing.assert_allclose(target.numpy(), [[(p0 + 0.5) / 2, (1 - p0 + 0.5) / 2]], rtol=1e-6)


def test_average_teacher_target_mse_averages_logits():
  logits = tf.constant([[[2.0, 0.0]], [[0.0, 4.0]]])
  target = losses.average_teacher_target(logits, [1.0, 1.0], output="softmax", kind="mse_logits")
  np.testing.assert_allclose(target.numpy(), [[1.0, 2.0]])


def test_sigmoid_distillation_matches_hand_computed_cross_entropy():
  z, q = 0.7, 0.2
  loss = losses.distillation_loss(tf.constant([[z]]), tf.constant([[q]]), output="sigmoid")
  p = _sigmoid(z)
  expected = -(q * math.log(p) + (1 - q) * math.log(1 - p))
  assert loss.numpy() == pytest.approx(expected, rel=1e-6)


def test_softmax_distillation_with_temperature_scales_by_t_squared():
  z = [1.0, 3.0, -1.0]
  q = [0.2, 0.5, 0.3]
  t = 2.0
  loss = losses.distillation_loss(tf.constant([z]), tf.constant([q]), output="softmax",
                                  temperature=t)
  scaled = [v / t for v in z]
  log_norm = math.log(sum(math.exp(v) for v in scaled))
  expected = -sum(qi * (si - log_norm) for qi, si in zip(q, scaled)) * t * t
  assert loss.numpy() == pytest.approx(expected, rel=1e-6)


def test_distillation_is_stable_for_huge_logits():
  loss = losses.distillation_loss(tf.constant([[1000.0], [-1000.0]]), tf.constant([[0.0], [1.0]]),
                                  output="sigmoid")
  assert np.isfinite(loss.numpy()) and loss.numpy() == pytest.approx(1000.0)


def test_mse_logits_value():
  loss = losses.distillation_loss(tf.constant([[1.0, 2.0]]), tf.constant([[0.0, 4.0]]),
                                  output="softmax", kind="mse_logits")
  assert loss.numpy() == pytest.approx((1.0 + 4.0) / 2)


@pytest.mark.parametrize("output, kind", [("sigmoid", "xent"), ("softmax", "xent"),
                                          ("softmax", "mse_logits")])
def test_sample_weights_weigh_each_items_term_as_keras_weighs_the_task_loss(output, kind):
  rng = np.random.default_rng(0)
  # 4 sequences of 3 tokens over 5 classes (sigmoid: one output per token).
  width = 1 if output == "sigmoid" else 5
  z = tf.constant(rng.normal(size=(4, 3, width)), tf.float32)
  t = rng.uniform(size=(4, 3, width)).astype("float32")
  target = tf.constant(t if output == "sigmoid" else t / t.sum(-1, keepdims=True))

  def term(weight=None):
    return float(losses.distillation_loss(z, target, output=output, kind=kind, temperature=2.0,
                                          sample_weight=weight))
  unweighted = term()
  assert term(tf.ones([4])) == pytest.approx(unweighted, rel=1e-6)
  # Keras' rule: the weighted sum over the number of items; weight 0 drops an item's pull.
  per_token = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0], [2, 1, 1]], "float32")
  items = np.array([[float(losses.distillation_loss(  # each item's own term, alone
      z[b:b + 1, i:i + 1], target[b:b + 1, i:i + 1], output=output, kind=kind, temperature=2.0))
                     for i in range(3)] for b in range(4)])
  assert term(tf.constant(per_token)) == pytest.approx((items * per_token).sum() / 12, rel=1e-5)
  # A weight per sequence covers its tokens, as a (batch,) or (batch, 1) tensor.
  per_sequence = np.array([0, 1, 2, 0], "float32")
  want = (items * per_sequence[:, None]).sum() / 12
  assert term(tf.constant(per_sequence)) == pytest.approx(want, rel=1e-5)
  assert term(tf.constant(per_sequence[:, None])) == pytest.approx(want, rel=1e-5)
  assert term(tf.zeros([4])) == 0.0


def test_distillation_gradient_is_student_prob_minus_target_and_stops_at_target():
  z = tf.Variable([[0.3], [-1.2]])
  q = tf.Variable([[0.9], [0.1]])
  with tf.GradientTape(persistent=True) as tape:
    loss = losses.distillation_loss(z, q, output="sigmoid")
  grad = tape.gradient(loss, z).numpy()
  expected = (tf.sigmoid(z).numpy() - q.numpy()) / 2  # mean over 2 examples
  np.testing.assert_allclose(grad, expected, rtol=1e-5)
  assert tape.gradient(loss, q) is None


def test_bad_kind_and_output_are_refused():
  with pytest.raises(ValueError, match="kind='kl'"):
    losses.distillation_loss(tf.zeros([1, 1]), tf.zeros([1, 1]), output="sigmoid", kind="kl")
  with pytest.raises(ValueError, match="output='tanh'"):
    losses.probabilities(tf.zeros([1]), "tanh")


def test_distillation_computes_the_loss_functions_with_its_kind_and_temperature():
  term = losses.Distillation(alpha=0.5, kind="xent", temperature=2.0)
  teachers = tf.constant([[[1.0, -1.0]], [[0.0, 2.0]]])
  target = term.target(teachers, tf.constant([1.0, 3.0]), "softmax")
  np.testing.assert_allclose(target, losses.average_teacher_target(
      teachers, tf.constant([1.0, 3.0]), output="softmax", temperature=2.0))
  student = tf.constant([[0.3, 0.1]])
  np.testing.assert_allclose(term.loss(student, target, "softmax"), losses.distillation_loss(
      student, target, output="softmax", temperature=2.0))
  assert losses.Distillation(burn_in_steps=100.0).burn_in_steps == 100  # an int for the step
  mse = losses.Distillation(kind="mse_logits")
  np.testing.assert_allclose(mse.loss(student, tf.constant([[1.3, 0.1]]), "softmax"), 0.5,
                             rtol=1e-6)


@pytest.mark.parametrize("settings, message", [
    ({"alpha": -1.0}, r"tfc\.Distillation\.alpha=-1\.0 must be >= 0"),
    ({"burn_in_steps": -5}, r"tfc\.Distillation\.burn_in_steps=-5 must be >= 0"),
    ({"kind": "kl"}, r"tfc\.Distillation\.kind='kl' is not one of \['xent', 'mse_logits'\]"),
    ({"temperature": 0.0}, r"tfc\.Distillation\.temperature=0\.0 must be > 0"),
    ({"burn_in_steps": 2.5}, r"tfc\.Distillation\.burn_in_steps=2\.5 must be a whole number"),
    ({"alpha": "1"}, r"tfc\.Distillation\.alpha='1' must be a number"),
])
def test_distillation_settings_that_cannot_work_are_refused_by_name(settings, message):
  with pytest.raises(losses.ConfigurationError, match=message):
    losses.Distillation(**settings)


def test_uniform_smoothing_matches_keras_builtin():
  y = tf.constant([[1.0], [0.0], [1.0]])
  z = tf.constant([[2.0], [-0.5], [-1.0]])
  ours = losses.SmoothedBinaryCrossentropy(smoothing=0.1, prior=0.5)(y, z)
  builtin = keras.losses.BinaryCrossentropy(from_logits=True, label_smoothing=0.1)(y, z)
  assert ours.numpy() == pytest.approx(builtin.numpy(), rel=1e-6)


def test_unigram_binary_smoothing_value():
  s, prior, z = 0.2, 0.1, 0.4
  loss = losses.SmoothedBinaryCrossentropy(smoothing=s, prior=prior)(tf.constant([[1.0]]),
                                                                     tf.constant([[z]]))
  t = (1 - s) * 1.0 + s * prior
  p = _sigmoid(z)
  assert loss.numpy() == pytest.approx(-(t * math.log(p) + (1 - t) * math.log(1 - p)), rel=1e-6)


def test_unigram_categorical_smoothing_value_and_uniform_default():
  z = [0.5, -1.0, 2.0]
  log_norm = math.log(sum(math.exp(v) for v in z))
  logp = [v - log_norm for v in z]
  prior = [0.5, 0.3, 0.2]
  s = 0.3
  target = [(1 - s) * (1.0 if i == 2 else 0.0) + s * prior[i] for i in range(3)]
  loss = losses.SmoothedSparseCategoricalCrossentropy(smoothing=s, prior=prior)(
      tf.constant([2]), tf.constant([z]))
  assert loss.numpy() == pytest.approx(-sum(t * lp for t, lp in zip(target, logp)), rel=1e-6)
  uniform = losses.SmoothedSparseCategoricalCrossentropy(smoothing=s)(tf.constant([2]),
                                                                    tf.constant([z]))
  builtin = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=s)(
      tf.constant([[0.0, 0.0, 1.0]]), tf.constant([z]))
  assert uniform.numpy() == pytest.approx(builtin.numpy(), rel=1e-6)


def test_smoothing_out_of_range_is_refused():
  with pytest.raises(ValueError, match="smoothing=1.5"):
    losses.SmoothedBinaryCrossentropy(smoothing=1.5)
