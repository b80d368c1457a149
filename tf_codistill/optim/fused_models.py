"""Optimizer fusion for tf_keras models and ``fit``: patching a plain model's train step
(``fuse``), flushing pending forward-fusion updates at epoch ends (``FusionFlush``) and before
every backup (``BackupAndRestore``). The fused kernels and their schedule are fusion.py.
"""

from __future__ import annotations

import functools
from typing import Callable

import tensorflow as tf
import tf_keras as keras

from tf_codistill.optim.fusion import OptimizerFusion
from tf_codistill.optim.fusion import check_supported
from tf_codistill.optim.fusion import minimize
from tf_codistill.optim.fusion import probe_gradients


class FusionFlush(keras.callbacks.Callback):
  """Flushes pending forward-fusion updates at epoch ends (before later callbacks save), at the
  end of training and before evaluation/prediction. Put it first in the callback list."""

  def __init__(self, fusion: OptimizerFusion):
    super().__init__()
    self.fusion = fusion

  def on_epoch_end(self, epoch, logs=None):
    self.fusion.flush()

  def on_train_end(self, logs=None):
    self.fusion.flush()

  def on_test_begin(self, logs=None):
    self.fusion.flush()

  def on_predict_begin(self, logs=None):
    self.fusion.flush()


class BackupAndRestore(keras.callbacks.BackupAndRestore):
  """tf_keras' BackupAndRestore that flushes pending fused updates before every backup."""

  def __init__(self, backup_dir: str, flush: Callable[[], None], **kwargs):
    super().__init__(backup_dir, **kwargs)
    self._flush = flush

  def _backup(self, epoch, batch=0):
    self._flush()
    super()._backup(epoch, batch)


def fuse(model: keras.Model, mode: str, *, reducer=None) -> keras.Model:
  """Makes a compiled plain tf_keras model train with optimizer fusion ``mode``.

  Replaces the model's default ``train_step`` by the same step with fused updates and makes its
  ``fit`` flush pending updates (``FusionFlush``); returns the model. Models with their own
  ``train_step`` call ``minimize(...)`` and ``OptimizerFusion.forward`` themselves.
  """
  if model.optimizer is None:
    raise ValueError("fuse() needs a compiled model (call model.compile first)")
  check_supported(model.optimizer, mode, "fusion", model.distribute_strategy)
  if mode == "none":
    return model
  fusion = OptimizerFusion(model.optimizer, mode, jit_compile=bool(model.jit_compile))

  def train_step(data):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    if not fusion.built:
      fusion.build(model.trainable_variables,
                   probe_gradients(model, x) if mode == "forward" else None)
    with tf.GradientTape() as tape:
      with fusion.forward(model, tape):
        y_pred = model(x, training=True)
      loss = model.compute_loss(x, y, y_pred, sample_weight)
    model._validate_target_and_loss(y, loss)
    minimize(model.optimizer, loss, tape, model.trainable_variables, fusion, reducer)
    return model.compute_metrics(x, y, y_pred, sample_weight)

  fit = model.fit

  @functools.wraps(fit)
  def fused_fit(*args, callbacks=None, **kwargs):
    return fit(*args, callbacks=[FusionFlush(fusion)] + list(callbacks or []), **kwargs)

  model.__dict__["train_step"] = train_step
  model.__dict__["fit"] = fused_fit
  model.__dict__["fusion"] = fusion
  model.train_function = None
  return model
