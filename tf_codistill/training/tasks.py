"""Tasks: what a group's labels are and how it is scored (loss, metrics, results keys).

A ``Task`` is bound in gin as ``trainer.train.task`` and decides everything in the trainer that
depends on the kind of labels:

* ``BinaryTask`` (CTR, the default): one logit per example, sigmoid; binary cross-entropy; metrics
  ``logloss`` and ``auc``; results ``val_logloss``, ``val_auc``, ``val_loss``.
* ``MulticlassTask(num_classes)`` (images): one logit per class, softmax; sparse categorical
  cross-entropy; metrics ``xent`` and ``accuracy``; results ``val_loss``, ``val_accuracy``.
* ``LanguageModelTask(vocab_size)``: logits [B, T, V], softmax per token; the loss and ``xent`` are
  means per token; results also ``val_perplexity`` (exp of the per-token cross-entropy).

Label smoothing goes toward the uniform distribution or the unigram prior: the training positive
rate (binary), the class frequencies (multi-class) or the corpus token frequencies (LM).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence

import gin
import numpy as np
import tensorflow as tf
import tf_keras as keras

from tf_codistill import losses

SMOOTHING_PRIORS = ("uniform", "unigram")


class Perplexity(keras.metrics.SparseCategoricalCrossentropy):
  """exp of the mean sparse cross-entropy (per token for sequences)."""

  def __init__(self, name: str = "perplexity", **kwargs):
    super().__init__(name=name, from_logits=True, **kwargs)

  def result(self):
    return tf.exp(super().result())


class Task:
  """Base class: a kind of labels, its loss, metrics and results keys."""

  output = "sigmoid"

  def task_loss(self, label_smoothing: float = 0.0, smoothing_prior: str = "uniform",
                prior: Optional[np.ndarray] = None) -> keras.losses.Loss:
    """The training loss, label-smoothed toward ``smoothing_prior`` (``prior`` for unigram)."""
    raise NotImplementedError

  def metrics(self) -> List[keras.metrics.Metric]:
    """Fresh metric objects for training and evaluation."""
    raise NotImplementedError

  def results(self, final: Dict[str, float]) -> Dict[str, float]:
    """results.json keys (``val_*``) from a final evaluation (``loss`` + metric names)."""
    raise NotImplementedError

  def estimate_prior(self, train_files: Sequence[str], dataset: tf.data.Dataset) -> np.ndarray:
    """The unigram prior for label smoothing, from the training files or data."""
    raise NotImplementedError


@gin.configurable(module="tasks")
class BinaryTask(Task):
  """Binary labels (CTR): a single logit, sigmoid, log loss and AUC."""

  output = "sigmoid"

  def __init__(self, prior_batches: int = 20):
    self.prior_batches = prior_batches

  def task_loss(self, label_smoothing=0.0, smoothing_prior="uniform", prior=None):
    _check_prior(smoothing_prior)
    rate = 0.5 if smoothing_prior == "uniform" else prior
    if rate is None:
      raise ValueError("smoothing_prior='unigram' needs the training positive rate")
    return losses.SmoothedBinaryCrossentropy(smoothing=label_smoothing, prior=float(rate))

  def metrics(self):
    return [keras.metrics.BinaryCrossentropy(from_logits=True, name="logloss"),
            keras.metrics.AUC(from_logits=True, name="auc")]

  def results(self, final):
    return {"val_logloss": final["logloss"], "val_auc": final["auc"], "val_loss": final["loss"]}

  def estimate_prior(self, train_files, dataset):
    total = positives = 0.0
    for _, labels in dataset.take(self.prior_batches):
      positives += float(tf.reduce_sum(labels))
      total += float(tf.size(labels))
    if total == 0:
      raise ValueError("cannot estimate the class prior: the training data is empty")
    return np.asarray(positives / total)


@gin.configurable(module="tasks")
class MulticlassTask(Task):
  """One of ``num_classes`` classes per example: softmax, cross-entropy, accuracy.

  The unigram prior is the class frequencies of the first ``prior_batches`` training batches, or
  ``prior_fn(train_files)`` when bound (e.g. counts a data pipeline saved).
  """

  output = "softmax"

  def __init__(self, num_classes: int = gin.REQUIRED, prior_batches: int = 50,
               prior_fn: Optional[Callable[[Sequence[str]], np.ndarray]] = None):
    if num_classes < 2:
      raise ValueError(f"num_classes={num_classes} must be >= 2")
    self.num_classes = int(num_classes)
    self.prior_batches = prior_batches
    self.prior_fn = prior_fn

  def task_loss(self, label_smoothing=0.0, smoothing_prior="uniform", prior=None):
    _check_prior(smoothing_prior)
    if smoothing_prior == "unigram" and prior is None:
      raise ValueError("smoothing_prior='unigram' needs the class (token) frequencies")
    return losses.SmoothedSparseCategoricalCrossentropy(
        smoothing=label_smoothing,
        prior=None if smoothing_prior == "uniform" else np.asarray(prior).tolist())

  def metrics(self):
    return [keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent"),
            keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

  def results(self, final):
    return {"val_loss": final["loss"], "val_xent": final["xent"],
            "val_accuracy": final["accuracy"]}

  def estimate_prior(self, train_files, dataset):
    if self.prior_fn is not None:
      prior = np.asarray(self.prior_fn(train_files), np.float64)
    else:
      counts = np.zeros([self.num_classes], np.float64)
      for _, labels in dataset.take(self.prior_batches):
        counts += np.bincount(np.asarray(labels).reshape(-1), minlength=self.num_classes)
      prior = counts
    if prior.shape != (self.num_classes,) or prior.sum() <= 0:
      raise ValueError(f"the unigram prior has shape {prior.shape} (sum {prior.sum()}); "
                       f"expected ({self.num_classes},) with a positive sum")
    return prior / prior.sum()


@gin.configurable(module="tasks")
class LanguageModelTask(MulticlassTask):
  """Next-token prediction: logits [B, T, vocab_size]; per-token cross-entropy and perplexity."""

  def __init__(self, vocab_size: int = gin.REQUIRED, prior_batches: int = 50,
               prior_fn: Optional[Callable[[Sequence[str]], np.ndarray]] = None):
    super().__init__(vocab_size, prior_batches=prior_batches, prior_fn=prior_fn)

  def metrics(self):
    return super().metrics() + [Perplexity(name="perplexity")]

  def results(self, final):
    return {**super().results(final), "val_perplexity": math.exp(final["xent"])}


def _check_prior(smoothing_prior: str) -> None:
  if smoothing_prior not in SMOOTHING_PRIORS:
    raise ValueError(f"smoothing_prior={smoothing_prior!r} is not one of {SMOOTHING_PRIORS}")
