"""Codistillation and label-smoothing losses, all computed stably from logits.

Conventions: models output *logits*. ``output='sigmoid'`` means independent binary outputs (CTR),
``output='softmax'`` means a distribution over the last axis (classes, tokens). Every loss is a mean
over all non-class axes (examples, and time steps for sequences).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Optional, Sequence

import gin
import tensorflow as tf
import tf_keras as keras

from tf_codistill.errors import ConfigurationError

DISTILL_KINDS = ("xent", "mse_logits")
OUTPUTS = ("sigmoid", "softmax")


def _check(name: str, value: str, allowed: Sequence[str]) -> None:
  if value not in allowed:
    raise ValueError(f"{name}={value!r} is not one of {tuple(allowed)}")


def probabilities(logits: tf.Tensor, output: str, temperature: float = 1.0) -> tf.Tensor:
  """Turns logits into probabilities (sigmoid or softmax over the last axis) at a temperature."""
  _check("output", output, OUTPUTS)
  scaled = logits / temperature
  return tf.sigmoid(scaled) if output == "sigmoid" else tf.nn.softmax(scaled, axis=-1)


def average_teacher_target(teacher_logits: tf.Tensor, weights: tf.Tensor, *, output: str,
                           kind: str = "xent", temperature: float = 1.0) -> tf.Tensor:
  """Weighted mean over teachers (axis 0) of their probabilities, or of their logits for MSE.

  ``weights`` has one entry per teacher (0 for a teacher that is not loaded or not a neighbour);
  they are normalised here, so the target is the average over the teachers that count.
  """
  _check("kind", kind, DISTILL_KINDS)
  values = teacher_logits if kind == "mse_logits" else probabilities(teacher_logits, output,
                                                                     temperature)
  weights = tf.cast(weights, values.dtype)
  weights = weights / tf.maximum(tf.reduce_sum(weights), 1e-12)
  weights = tf.reshape(weights, [-1] + [1] * (values.shape.rank - 1))
  return tf.reduce_sum(weights * values, axis=0)


def distillation_loss(student_logits: tf.Tensor, target: tf.Tensor, *, output: str,
                      kind: str = "xent", temperature: float = 1.0,
                      sample_weight: Optional[tf.Tensor] = None) -> tf.Tensor:
  """Distillation term D(student, teachers' average) as a scalar.

  ``xent``: cross-entropy of the student's tempered distribution against the averaged teacher
  probabilities, scaled by temperature**2 so gradient magnitudes do not shrink with the
  temperature (Hinton et al. 2015). ``mse_logits``: mean squared error to the averaged logits.
  ``sample_weight`` (per example, or per token of a sequence) weighs each item's term as Keras
  weighs the task loss: the weighted sum over the items' count, so an item of weight 0 (a padded
  token) is pulled toward no teacher.
  """
  _check("kind", kind, DISTILL_KINDS)
  _check("output", output, OUTPUTS)
  target = tf.stop_gradient(tf.cast(target, student_logits.dtype))
  if kind == "mse_logits":
    per_item = tf.reduce_mean(tf.math.squared_difference(student_logits, target), axis=-1)
    scale = 1.0
  else:
    scaled = student_logits / temperature
    scale = temperature**2
    if output == "sigmoid":
      per_item = tf.nn.sigmoid_cross_entropy_with_logits(labels=target, logits=scaled)
    else:
      per_item = tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=scaled, axis=-1)
  if sample_weight is None:
    return tf.reduce_mean(per_item) * scale
  weighted = per_item * _like_items(tf.cast(sample_weight, per_item.dtype), per_item.shape.rank)
  return tf.reduce_sum(weighted) / tf.cast(tf.size(weighted), per_item.dtype) * scale


def _like_items(weight: tf.Tensor, rank: Optional[int]) -> tf.Tensor:
  """``weight`` with the items' rank (as Keras matches sample weights to losses): trailing
  axes of size 1 dropped or added, so a weight per example covers its tokens or outputs."""
  if rank is None or weight.shape.rank is None:
    return weight
  while weight.shape.rank > rank and weight.shape[-1] == 1:
    weight = tf.squeeze(weight, -1)
  while weight.shape.rank < rank:
    weight = weight[..., tf.newaxis]
  return weight


@gin.configurable(module="tfc")
@dataclasses.dataclass(frozen=True)
class Distillation:
  """CodistillModel's distillation term: its weight, when it starts and its loss
  (``tfc.Distillation.*``).

  Attributes:
    alpha: weight of the term once ``burn_in_steps`` optimizer steps have run and a teacher is
      loaded (0 before: the step is the student's own).
    burn_in_steps: steps trained on the task loss alone first.
    kind: ``xent`` (cross-entropy to the teachers' averaged probabilities) or ``mse_logits``
      (squared error to their averaged logits).
    temperature: of the student's and the teachers' distributions (``xent``).

  Raises:
    ConfigurationError: a value that cannot work, named by its binding.
  """
  alpha: float = 1.0
  burn_in_steps: int = 0
  kind: str = "xent"
  temperature: float = 1.0

  def __post_init__(self) -> None:
    for name, kind in (("alpha", float), ("burn_in_steps", int), ("temperature", float)):
      value = getattr(self, name)
      if (isinstance(value, bool) or not isinstance(value, numbers.Real)
          or (kind is int and not float(value).is_integer())):
        raise ConfigurationError(f"tfc.Distillation.{name}={value!r} must be "
                                 f"{'a whole number' if kind is int else 'a number'}")
      object.__setattr__(self, name, int(float(value)) if kind is int else float(value))
    if self.alpha < 0:
      raise ConfigurationError(f"tfc.Distillation.alpha={self.alpha} must be >= 0")
    if self.burn_in_steps < 0:
      raise ConfigurationError(f"tfc.Distillation.burn_in_steps={self.burn_in_steps} must be >= 0")
    if self.kind not in DISTILL_KINDS:
      raise ConfigurationError(f"tfc.Distillation.kind={self.kind!r} is not one of "
                               f"{list(DISTILL_KINDS)}")
    if self.temperature <= 0:
      raise ConfigurationError(f"tfc.Distillation.temperature={self.temperature} must be > 0")

  def target(self, teacher_logits: tf.Tensor, weights: tf.Tensor, output: str) -> tf.Tensor:
    """The teachers' weighted average this term pulls the student toward."""
    return average_teacher_target(teacher_logits, weights, output=output, kind=self.kind,
                                  temperature=self.temperature)

  def loss(self, student_logits: tf.Tensor, target: tf.Tensor, output: str,
           sample_weight: Optional[tf.Tensor] = None) -> tf.Tensor:
    """The term (before alpha) of ``student_logits`` toward ``target``, each item weighed by
    ``sample_weight`` where given."""
    return distillation_loss(student_logits, target, output=output, kind=self.kind,
                             sample_weight=sample_weight,
                             temperature=self.temperature)


@gin.configurable(module="losses")
class SmoothedBinaryCrossentropy(keras.losses.Loss):
  """Binary cross-entropy from logits with the label smoothed toward a prior positive rate.

  ``prior=0.5`` is smoothing toward the uniform distribution (same as Keras' own
  ``label_smoothing``); the positive rate of the training data is the unigram (class prior)
  baseline.
  """

  def __init__(self, smoothing: float = 0.0, prior: float = 0.5, name: str = "smoothed_bce",
               **kwargs):
    super().__init__(name=name, **kwargs)
    if not 0.0 <= smoothing <= 1.0:
      raise ValueError(f"smoothing={smoothing} must be in [0, 1]")
    if not 0.0 <= prior <= 1.0:
      raise ValueError(f"prior={prior} must be in [0, 1]")
    self.smoothing = float(smoothing)
    self.prior = float(prior)

  def call(self, y_true, y_pred):
    y_true = tf.cast(y_true, y_pred.dtype)
    target = (1.0 - self.smoothing) * y_true + self.smoothing * self.prior
    return tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=target, logits=y_pred), axis=-1)

  def get_config(self):
    return {**super().get_config(), "smoothing": self.smoothing, "prior": self.prior}


@gin.configurable(module="losses")
class SmoothedSparseCategoricalCrossentropy(keras.losses.Loss):
  """Sparse softmax cross-entropy from logits with the one-hot label smoothed toward a prior.

  ``prior=None`` smooths toward the uniform distribution; a vector of class (or token)
  frequencies gives the unigram label-smoothing baseline.
  """

  def __init__(self, smoothing: float = 0.0, prior: Optional[Sequence[float]] = None,
               name: str = "smoothed_sparse_cce", **kwargs):
    super().__init__(name=name, **kwargs)
    if not 0.0 <= smoothing <= 1.0:
      raise ValueError(f"smoothing={smoothing} must be in [0, 1]")
    self.smoothing = float(smoothing)
    self.prior = None if prior is None else [float(p) for p in prior]

  def call(self, y_true, y_pred):
    num_classes = tf.shape(y_pred)[-1]
    labels = tf.cast(y_true, tf.int32)
    if labels.shape.rank == y_pred.shape.rank:
      labels = tf.squeeze(labels, axis=-1)
    one_hot = tf.one_hot(labels, num_classes, dtype=y_pred.dtype)
    if self.prior is None:
      prior = tf.ones([num_classes], y_pred.dtype) / tf.cast(num_classes, y_pred.dtype)
    else:
      prior = tf.constant(self.prior, y_pred.dtype)
      prior = prior / tf.reduce_sum(prior)
    target = (1.0 - self.smoothing) * one_hot + self.smoothing * prior
    return tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=y_pred, axis=-1)

  def get_config(self):
    return {**super().get_config(), "smoothing": self.smoothing, "prior": self.prior}
