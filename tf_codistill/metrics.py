"""Prediction churn between models: how much two retrains of the same model disagree."""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tf_codistill import losses
from tf_codistill import serving
from tf_codistill.exchange import directory as exchange


def churn(probs_a: np.ndarray, probs_b: np.ndarray, output: str = "sigmoid") -> Dict[str, float]:
  """Mean absolute difference of predicted probabilities, mean total variation distance between
  the predicted distributions, and fraction of differing predictions.

  For ``sigmoid`` the predicted class is ``p > 0.5`` per output and the distribution a
  Bernoulli (total variation ``|p_a - p_b|``); for ``softmax`` the class is the argmax over the
  last axis (the absolute difference is averaged over classes too, and the total variation is
  half the sum over classes: for a language model, per next-token distribution).
  """
  a, b = np.asarray(probs_a, np.float64), np.asarray(probs_b, np.float64)
  if a.shape != b.shape:
    raise ValueError(f"prediction shapes differ: {a.shape} vs {b.shape}")
  if output == "sigmoid":
    disagree = (a > 0.5) != (b > 0.5)
    variation = np.abs(a - b)
  elif output == "softmax":
    disagree = np.argmax(a, axis=-1) != np.argmax(b, axis=-1)
    variation = 0.5 * np.sum(np.abs(a - b), axis=-1)
  else:
    raise ValueError(f"output={output!r} is not one of {losses.OUTPUTS}")
  return {"mean_abs_diff": float(np.mean(np.abs(a - b))),
          "total_variation": float(np.mean(variation)),
          "disagreement": float(np.mean(disagree))}


def prediction_churn(model_a, model_b, dataset: tf.data.Dataset, output: str = "sigmoid"
                     ) -> Dict[str, float]:
  """Churn between two models on the same inputs: ``mean_abs_diff`` of their predicted
  probabilities and ``disagreement`` (the fraction of differing predicted classes).

  Args:
    model_a, model_b: tf_keras models (a CodistillModel counts as its student) mapping the
      features of ``dataset`` to logits of the same shape.
    dataset: a finite ``tf.data.Dataset`` of features or ``(features, labels, ...)``, read once
      per model (so it must yield the same elements in the same order each time).
    output: ``sigmoid`` or ``softmax``: how logits become probabilities.

  Raises:
    ValueError: an empty dataset, predictions of different shapes, or an unknown ``output``.
  """
  losses._check("output", output, losses.OUTPUTS)
  features = dataset.map(lambda *element: element[0])  # (features, labels, ...) or features
  probs = []
  for model in (model_a, model_b):
    batches = [losses.probabilities(model(x, training=False), output).numpy() for x in features]
    if not batches:
      raise ValueError("prediction_churn: the dataset is empty")
    probs.append(np.concatenate(batches, axis=0))
  return churn(probs[0], probs[1], output)


def predict_probabilities(saved_model_path: str, dataset: tf.data.Dataset,
                          output: str = "sigmoid") -> np.ndarray:
  """Runs a published/exported SavedModel's serving signature over ``dataset`` (features, ...);
  a dataset of string batches (raw lines, ``serving.raw_lines``) goes through ``serving_raw``."""
  raw = dataset.element_spec == tf.TensorSpec([None], tf.string)
  serve = _signature(saved_model_path, serving.RAW_SIGNATURE_KEY if raw
                     else exchange.SIGNATURE_KEY)
  batches = []
  for element in dataset:
    features = element[0] if isinstance(element, tuple) else element
    if raw:
      kwargs = {serving.RAW_INPUT_KEY: features}
    else:
      kwargs = features if isinstance(features, dict) else {"inputs": features}
    logits = serve(**kwargs)[exchange.OUTPUT_KEY]
    batches.append(losses.probabilities(logits, output).numpy())
  if not batches:
    raise ValueError("the churn dataset is empty")
  return np.concatenate(batches, axis=0)


def model_probabilities(model, dataset: tf.data.Dataset, output: str = "sigmoid"
                        ) -> Tuple[np.ndarray, np.ndarray]:
  """Probabilities of a Keras model and the labels over a (features, labels) dataset, in order."""
  probs, labels = [], []
  for features, y in dataset:
    probs.append(losses.probabilities(model(features, training=False), output).numpy())
    labels.append(np.asarray(y))
  if not probs:
    raise ValueError("the evaluation dataset is empty")
  return np.concatenate(probs, axis=0), np.concatenate(labels, axis=0)


def ensemble_scores(saved_model_paths: Sequence[str], dataset: tf.data.Dataset,
                    output: str = "sigmoid", keep_batches: int = 0) -> Dict[str, Any]:
  """Each SavedModel's scores and their ensemble's (the mean of their probabilities) over a
  ``(features, labels)`` dataset, streamed batch by batch, so that every score counts the same
  examples (next tokens, for a language model) and no more than a batch is held.

  Returns ``{"members": [scores, ...], "ensemble": scores, "examples": n}``, each ``scores`` as
  categorical_scores (``softmax``) or ``val_logloss`` and ``val_auc`` (``sigmoid``); with
  ``keep_batches`` also the ensemble's ``probs`` and the ``labels`` of the first batches.

  Raises:
    ValueError: an empty dataset, a model without the serving signature, or an unknown
      ``output``.
  """
  losses._check("output", output, losses.OUTPUTS)
  if not saved_model_paths:
    raise ValueError("ensemble_scores: give at least one SavedModel")
  serves = [_signature(path, exchange.SIGNATURE_KEY) for path in saved_model_paths]
  totals = [_ScoreSums(output) for _ in range(len(serves) + 1)]
  kept: List[Tuple[np.ndarray, np.ndarray]] = []
  for element in dataset:
    features, labels = element[0], np.asarray(element[1])
    kwargs = features if isinstance(features, dict) else {"inputs": features}
    probs = [losses.probabilities(serve(**kwargs)[exchange.OUTPUT_KEY], output).numpy()
             for serve in serves]
    probs.append(np.mean(probs, axis=0))
    for total, p in zip(totals, probs):
      total.add(p, labels)
    if len(kept) < keep_batches:
      kept.append((probs[-1].astype(np.float32), labels))
  if not totals[0].count:
    raise ValueError("ensemble_scores: the dataset is empty")
  scores = {"members": [t.scores() for t in totals[:-1]], "ensemble": totals[-1].scores(),
            "examples": totals[0].count}
  if kept:
    scores["probs"] = np.concatenate([p for p, _ in kept], axis=0)
    scores["labels"] = np.concatenate([y for _, y in kept], axis=0)
  return scores


class _ScoreSums:
  """Running sums of one model's log loss and accuracy (and AUC, for ``sigmoid``): each batch
  scored by categorical_scores or log_loss, weighted by its examples."""

  def __init__(self, output: str):
    self.loss, self.correct, self.count = 0.0, 0.0, 0
    self.auc = keras.metrics.AUC() if output == "sigmoid" else None

  def add(self, probs: np.ndarray, labels: np.ndarray) -> None:
    if self.auc is None:  # softmax: one prediction per position of every axis but the last
      n = int(np.prod(probs.shape[:-1]))
      batch = categorical_scores(probs, labels)
      self.loss += batch["val_xent"] * n
      self.correct += batch["val_accuracy"] * n
    else:
      n = int(np.size(probs))
      self.loss += log_loss(probs, labels) * n
      self.auc.update_state(np.reshape(labels, np.shape(probs)), probs)
    self.count += n

  def scores(self) -> Dict[str, float]:
    loss = self.loss / self.count
    if self.auc is None:
      return {"val_xent": loss, "val_accuracy": self.correct / self.count,
              "val_perplexity": float(np.exp(loss))}
    return {"val_logloss": loss, "val_auc": float(self.auc.result().numpy())}


def log_loss(probs: np.ndarray, labels: np.ndarray, eps: float = 1e-7) -> float:
  """Binary log loss of probabilities (e.g. an ensemble's averaged predictions)."""
  p = np.clip(np.asarray(probs, np.float64), eps, 1 - eps)
  y = np.asarray(labels, np.float64).reshape(p.shape)
  return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def categorical_scores(probs: np.ndarray, labels: np.ndarray, eps: float = 1e-7
                       ) -> Dict[str, float]:
  """Cross-entropy (per example or token) and accuracy of class probabilities [..., C] (e.g. an
  ensemble's averaged predictions) against integer labels [...]: val_xent, val_accuracy, and
  val_perplexity (exp of the cross-entropy)."""
  p = np.asarray(probs, np.float64)
  y = np.asarray(labels).astype(np.int64).reshape(p.shape[:-1])
  picked = np.take_along_axis(p, y[..., None], axis=-1)[..., 0]
  xent = float(-np.mean(np.log(np.clip(picked, eps, 1.0))))
  return {"val_xent": xent, "val_accuracy": float(np.mean(np.argmax(p, axis=-1) == y)),
          "val_perplexity": float(np.exp(xent))}


def pairwise_churn(predictions: Sequence[np.ndarray], output: str = "sigmoid"
                   ) -> List[Dict[str, float]]:
  """Churn for every pair (i < j) of models, each entry tagged with the pair's indices."""
  return [{"a": i, "b": j, **churn(predictions[i], predictions[j], output)}
          for i, j in itertools.combinations(range(len(predictions)), 2)]


def _signature(saved_model_path: str, key: str):
  """The SavedModel's signature ``key``; ValueError naming the model if it has none."""
  signatures = tf.saved_model.load(saved_model_path).signatures
  if key not in signatures:
    hint = (" (export it with tfc.Data.raw_parser bound, or tfc.export(raw_parser=...))"
            if key == serving.RAW_SIGNATURE_KEY else "")
    raise ValueError(f"{saved_model_path} has no {key!r} signature{hint}; it has "
                     f"{sorted(signatures)}")
  return signatures[key]
