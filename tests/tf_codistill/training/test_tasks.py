"""Tests of the task objects: losses, metrics, results keys and unigram priors per kind of label."""

import math

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill.training import tasks


def _evaluate(task, y, logits, loss):
  metrics = task.metrics()
  for metric in metrics:
    metric.update_state(y, logits)
  final = {m.name: float(m.result()) for m in metrics}
  final["loss"] = float(tf.reduce_mean(loss.call(y, logits)))
  return task.results(final)


def test_binary_task_keeps_the_ctr_keys_and_prior():
  task = tasks.BinaryTask()
  assert task.output == "sigmoid"
  y = tf.constant([[1.0], [0.0], [0.0], [0.0]])
  logits = tf.constant([[2.0], [-1.0], [0.5], [-3.0]])
  results = _evaluate(task, y, logits, task.task_loss())
  assert set(results) == {"val_logloss", "val_auc", "val_loss"}
  assert results["val_logloss"] == pytest.approx(results["val_loss"], rel=1e-5)
  prior = task.estimate_prior([], tf.data.Dataset.from_tensor_slices((y, y)).batch(2))
  assert float(prior) == 0.25
  with pytest.raises(ValueError, match="positive rate"):
    task.task_loss(0.1, "unigram")


def test_multiclass_task_loss_metrics_and_class_prior():
  task = tasks.MulticlassTask(num_classes=3)
  assert task.output == "softmax"
  y = tf.constant([0, 2, 2, 1])
  logits = tf.constant([[2.0, 0.0, 0.0], [0.0, 0.0, 1.0], [3.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
  results = _evaluate(task, y, logits, task.task_loss())
  expected = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)
  assert results["val_loss"] == pytest.approx(float(expected), rel=1e-5)
  assert results["val_xent"] == pytest.approx(float(expected), rel=1e-5)
  assert results["val_accuracy"] == 0.75
  prior = task.estimate_prior([], tf.data.Dataset.from_tensor_slices((logits, y)).batch(2))
  np.testing.assert_allclose(prior, [0.25, 0.25, 0.5])
  # Smoothing toward the prior: the target is 0.9 * one-hot + 0.1 * prior.
  smoothed = task.task_loss(0.1, "unigram", prior)
  target = 0.9 * tf.one_hot(y, 3) + 0.1 * tf.constant(prior, tf.float32)
  np.testing.assert_allclose(
      smoothed.call(y, logits), tf.nn.softmax_cross_entropy_with_logits(target, logits), rtol=1e-5)


def test_language_model_task_is_per_token_and_reports_perplexity():
  task = tasks.LanguageModelTask(vocab_size=4, prior_fn=lambda files: np.array([1, 1, 2, 4]))
  y = tf.constant([[0, 1, 3], [2, 3, 3]])
  logits = tf.random.stateless_normal([2, 3, 4], seed=[1, 2])
  results = _evaluate(task, y, logits, task.task_loss())
  per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
  assert results["val_loss"] == pytest.approx(float(tf.reduce_mean(per_token)), rel=1e-5)
  assert results["val_perplexity"] == pytest.approx(math.exp(results["val_xent"]), rel=1e-5)
  np.testing.assert_allclose(task.estimate_prior(["f"], None), [0.125, 0.125, 0.25, 0.5])
  perplexity = tasks.Perplexity()
  perplexity.update_state(y, logits)
  assert float(perplexity.result()) == pytest.approx(results["val_perplexity"], rel=1e-5)


def test_bad_prior_and_smoothing_names_fail():
  with pytest.raises(ValueError, match="smoothing_prior='zipf'"):
    tasks.MulticlassTask(num_classes=3).task_loss(0.1, "zipf")
  with pytest.raises(ValueError, match=r"expected \(3,\)"):
    tasks.MulticlassTask(num_classes=3, prior_fn=lambda f: np.ones(4)).estimate_prior([], None)
