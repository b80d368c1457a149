"""Prediction churn on fixed predictions, and through real SavedModels."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill import metrics
from tf_codistill.exchange import directory as exchange


def test_churn_known_values_sigmoid():
  a = np.array([[0.1], [0.6], [0.9], [0.4]])
  b = np.array([[0.3], [0.4], [0.9], [0.45]])
  result = metrics.churn(a, b)
  assert result["mean_abs_diff"] == pytest.approx((0.2 + 0.2 + 0.0 + 0.05) / 4)
  assert result["disagreement"] == pytest.approx(1 / 4)  # only 0.6 vs 0.4 crosses 0.5


def test_churn_known_values_softmax():
  a = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
  b = np.array([[0.3, 0.6, 0.1], [0.2, 0.0, 0.8]])
  result = metrics.churn(a, b, output="softmax")
  assert result["mean_abs_diff"] == pytest.approx((0.4 + 0.4 + 0 + 0.1 + 0.1 + 0) / 6)
  assert result["disagreement"] == pytest.approx(0.5)
  # Total variation per distribution: 0.5 * (0.4 + 0.4) and 0.5 * (0.1 + 0.1).
  assert result["total_variation"] == pytest.approx((0.4 + 0.1) / 2)


def test_next_token_distributions_churn_per_position():
  a = np.array([[[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]])  # [batch 1, 2 positions, vocabulary 3]
  b = np.array([[[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]])
  result = metrics.churn(a, b, output="softmax")
  assert result["total_variation"] == pytest.approx(0.25)
  assert result["disagreement"] == pytest.approx(0.5)  # argmax 0 vs 1, then 0 vs 0


def test_identical_predictions_have_zero_churn_and_shapes_must_match():
  a = np.random.default_rng(0).uniform(size=(10, 1))
  assert metrics.churn(a, a) == {"mean_abs_diff": 0.0, "total_variation": 0.0,
                                 "disagreement": 0.0}
  with pytest.raises(ValueError, match="shapes differ"):
    metrics.churn(a, a[:5])


def test_pairwise_churn_through_saved_models(tmp_path):
  spec = tf.TensorSpec([None, 3], tf.float32)
  paths = []
  for seed in range(3):
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(
        1, kernel_initializer=keras.initializers.GlorotUniform(seed))(inputs))
    paths.append(exchange.publish(model, str(tmp_path), seed, 1, spec))
  x = np.random.default_rng(1).normal(size=(50, 3)).astype("float32")
  data = tf.data.Dataset.from_tensor_slices((x, np.zeros((50, 1), "float32"))).batch(16)
  preds = [metrics.predict_probabilities(p, data) for p in paths]
  assert preds[0].shape == (50, 1)
  pairs = metrics.pairwise_churn(preds)
  assert [(p["a"], p["b"]) for p in pairs] == [(0, 1), (0, 2), (1, 2)]
  expected = np.mean(np.abs(preds[0] - preds[1]))
  assert pairs[0]["mean_abs_diff"] == pytest.approx(expected)
  assert pairs[0]["mean_abs_diff"] > 0


def test_log_loss_known_values_and_model_probabilities_keep_order():
  assert metrics.log_loss(np.array([0.5, 0.5]), np.array([0, 1])) == pytest.approx(np.log(2))
  assert metrics.log_loss(np.array([[0.9], [0.2]]), np.array([[1.0], [0.0]])) == pytest.approx(
      -(np.log(0.9) + np.log(0.8)) / 2)
  inputs = keras.Input((2,))
  model = keras.Model(inputs, keras.layers.Dense(1, kernel_initializer="ones",
                                                 bias_initializer="zeros")(inputs))
  x = np.array([[0.0, 0.0], [1.0, 1.0], [-1.0, 0.0]], np.float32)
  y = np.array([[0.0], [1.0], [1.0]], np.float32)
  probs, labels = metrics.model_probabilities(
      model, tf.data.Dataset.from_tensor_slices((x, y)).batch(2))
  np.testing.assert_allclose(probs[:, 0], 1 / (1 + np.exp(-np.array([0.0, 2.0, -1.0]))), rtol=1e-6)
  np.testing.assert_array_equal(labels, y)


def test_categorical_scores_per_example_and_per_token():
  probs = np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]])
  scores = metrics.categorical_scores(probs, np.array([0, 1]))
  assert scores["val_xent"] == pytest.approx(-(np.log(0.5) + np.log(0.1)) / 2)
  assert scores["val_accuracy"] == 0.5
  assert scores["val_perplexity"] == pytest.approx(np.exp(scores["val_xent"]))
  tokens = metrics.categorical_scores(probs[None], np.array([[0, 2]]))  # [1 sequence, 2 tokens]
  assert tokens["val_accuracy"] == 1.0


def _linear(weight):
  inputs = keras.Input((2,))
  return keras.Model(inputs, keras.layers.Dense(
      1, kernel_initializer=keras.initializers.Constant(weight), bias_initializer="zeros")(inputs))


def test_prediction_churn_of_two_models_on_a_dataset():
  x = np.array([[1.0, 0.0], [-1.0, 0.0], [0.5, 0.5], [0.0, -2.0]], np.float32)
  a, b = _linear(1.0), _linear(-1.0)
  labelled = tf.data.Dataset.from_tensor_slices((x, np.zeros([4, 1], np.float32))).batch(3)
  churn = metrics.prediction_churn(a, b, labelled)
  pa = 1 / (1 + np.exp(-x.sum(axis=1)))
  assert churn["mean_abs_diff"] == pytest.approx(np.mean(np.abs(pa - (1 - pa))), rel=1e-5)
  assert churn["disagreement"] == 1.0
  # Features alone work too, and a model against itself has no churn.
  same = metrics.prediction_churn(a, a, tf.data.Dataset.from_tensor_slices(x).batch(2))
  assert same == {"mean_abs_diff": 0.0, "total_variation": 0.0, "disagreement": 0.0}
  with pytest.raises(ValueError, match="dataset is empty"):
    metrics.prediction_churn(a, b, tf.data.Dataset.from_tensor_slices(x).take(0).batch(2))
  with pytest.raises(ValueError, match="output='probit'"):
    metrics.prediction_churn(a, b, labelled, output="probit")


def _published(tmp_path, outputs, seeds, shape):
  spec = tf.TensorSpec([None, *shape], tf.float32)
  paths = []
  for seed in seeds:
    inputs = keras.Input(shape)
    model = keras.Model(inputs, keras.layers.Dense(
        outputs, kernel_initializer=keras.initializers.GlorotUniform(seed))(inputs))
    paths.append(exchange.publish(model, str(tmp_path), seed, 1, spec))
  return paths


def test_ensemble_scores_stream_the_scores_of_the_whole_data_softmax(tmp_path):
  # Next-token-like labels [batch, time]: every token counts once, whatever the batching.
  paths = _published(tmp_path, 5, [0, 1], (4, 3))
  rng = np.random.default_rng(2)
  x = rng.normal(size=(23, 4, 3)).astype("float32")
  y = rng.integers(0, 5, size=(23, 4))
  data = tf.data.Dataset.from_tensor_slices((x, y)).batch(6)
  scores = metrics.ensemble_scores(paths, data, "softmax")
  preds = [metrics.predict_probabilities(p, data, "softmax") for p in paths]
  assert scores["examples"] == 23 * 4
  for member, p in zip(scores["members"], preds):
    assert member == pytest.approx(metrics.categorical_scores(p, y))
  mean = metrics.categorical_scores(np.mean(preds, axis=0), y)
  assert scores["ensemble"] == pytest.approx(mean)
  # Averaging probabilities never scores worse than the members' mean log loss (Jensen).
  assert scores["ensemble"]["val_xent"] <= np.mean([m["val_xent"] for m in scores["members"]])
  assert "probs" not in scores
  kept = metrics.ensemble_scores(paths, data, "softmax", keep_batches=2)
  np.testing.assert_allclose(kept["probs"], np.mean(preds, axis=0)[:12], rtol=1e-6)
  np.testing.assert_array_equal(kept["labels"], y[:12])


def test_ensemble_scores_sigmoid_and_bad_input(tmp_path):
  paths = _published(tmp_path, 1, [3, 4, 5], (3,))
  rng = np.random.default_rng(3)
  x = rng.normal(size=(40, 3)).astype("float32")
  y = (rng.random((40, 1)) < 0.5).astype("float32")
  data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
  scores = metrics.ensemble_scores(paths, data)
  preds = [metrics.predict_probabilities(p, data) for p in paths]
  assert scores["examples"] == 40 and len(scores["members"]) == 3
  assert scores["members"][1]["val_logloss"] == pytest.approx(metrics.log_loss(preds[1], y))
  assert scores["ensemble"]["val_logloss"] == pytest.approx(
      metrics.log_loss(np.mean(preds, axis=0), y))
  auc = keras.metrics.AUC()
  auc.update_state(y, np.mean(preds, axis=0))
  assert scores["ensemble"]["val_auc"] == pytest.approx(float(auc.result().numpy()))
  with pytest.raises(ValueError, match="dataset is empty"):
    metrics.ensemble_scores(paths, data.take(0))
  with pytest.raises(ValueError, match="at least one SavedModel"):
    metrics.ensemble_scores([], data)
