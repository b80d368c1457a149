"""Work between training steps under every strategy, and what ends training.

Periodic work is a ``StepHook``, run after each batch (``BatchDriver``) or, under parameter
servers where tf_keras allows no batch-level callbacks, from a polling thread (``ThreadDriver``).
``NonFiniteGuard`` stops at the first NaN/Inf loss, ``StepLimit`` after exactly the steps asked
for, ``WallClockLimit`` after a wall-clock budget.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Dict, Optional, Sequence

import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from tf_codistill import errors

LOSS_KEYS = ("loss", "task_loss", "distill_loss")


def current_step(model: keras.Model) -> int:
  return int(model.optimizer.iterations.numpy())


class StepHook:
  """Work done every few steps; driven by batch callbacks or, under parameter servers, a thread.

  ``reads_logs``: whether ``on_step`` reads ``logs``. Under parameter servers every value in them
  is a remote read per poll, so a driver whose hooks all leave them alone hands them ``{}``.
  """

  reads_logs = True

  def on_begin(self, model: keras.Model, step: int) -> None:
    pass

  def on_step(self, model: keras.Model, step: int, logs: Dict[str, float]) -> None:
    pass

  def on_end(self, model: keras.Model, step: int) -> None:
    pass


class BatchDriver(keras.callbacks.Callback):
  """Runs StepHooks after every training batch (all strategies but parameter servers)."""

  def __init__(self, hooks: Sequence[StepHook]):
    super().__init__()
    self.hooks = list(hooks)

  def on_train_begin(self, logs=None):
    for hook in self.hooks:
      hook.on_begin(self.model, current_step(self.model))

  def on_train_batch_end(self, batch, logs=None):
    step = current_step(self.model)
    values = scalar_logs(logs) if any(hook.reads_logs for hook in self.hooks) else {}
    for hook in self.hooks:
      hook.on_step(self.model, step, values)

  def on_train_end(self, logs=None):
    for hook in self.hooks:
      hook.on_end(self.model, current_step(self.model))


class ThreadDriver(keras.callbacks.Callback):
  """Runs StepHooks from a thread polling the step: tf_keras refuses batch-level callbacks under
  ParameterServerStrategy, and with asynchronous workers there is no single "between steps"."""

  def __init__(self, hooks: Sequence[StepHook], poll_seconds: float = 0.2):
    super().__init__()
    self.hooks = list(hooks)
    self.poll_seconds = poll_seconds
    self.error: Optional[errors.NonFiniteLossError] = None  # re-raised by the trainer after fit
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def on_train_begin(self, logs=None):
    for hook in self.hooks:
      hook.on_begin(self.model, current_step(self.model))
    self._stop.clear()
    self._thread = threading.Thread(target=self._run, name="step-hooks", daemon=True)
    self._thread.start()

  def _run(self):
    while not self._stop.wait(self.poll_seconds):
      try:
        step = current_step(self.model)
        logs = self._logs() if any(hook.reads_logs for hook in self.hooks) else {}
        for hook in self.hooks:
          hook.on_step(self.model, step, logs)
      except errors.NonFiniteLossError as e:
        # Stop scheduling steps and run no more hooks (no publish, no summaries of NaNs).
        self.error = e
        self.model.stop_training = True
        return
      except Exception:  # A failing hook must not kill training; it is logged loudly.
        logging.exception("step hooks failed")

  def _logs(self) -> Dict[str, float]:
    """The losses, alpha and teacher staleness, read from the variables behind them."""
    logs = {m.name: float(m.result().numpy()) for m in self.model.metrics[:3]}
    logs["alpha"] = float(self.model._effective_alpha().numpy())
    logs["teacher_staleness"] = float(self.model.teacher_staleness().numpy())
    return logs

  def on_train_end(self, logs=None):
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    for hook in self.hooks:
      hook.on_end(self.model, current_step(self.model))


def driver_for(strategy: tf.distribute.Strategy,
               hooks: Sequence[StepHook]) -> keras.callbacks.Callback:
  """The one driver of ``hooks`` under ``strategy``: a polling thread under parameter servers
  (tf_keras allows no batch-level callbacks there), batch callbacks otherwise."""
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    return ThreadDriver(hooks)
  return BatchDriver(hooks)


class StepLimit(keras.callbacks.Callback):
  """Ends ``fit`` after exactly ``total_steps`` steps, also when that is not a whole number of
  epochs (the last epoch is cut short; its epoch-end callbacks still run). ``offset``: the steps
  taken before ``fit``'s first epoch began beyond its whole epochs (a parameter-server run
  resumed from a checkpoint taken mid-epoch starts that epoch over, ``offset`` steps ahead)."""

  def __init__(self, total_steps: int, steps_per_epoch: int, offset: int = 0):
    super().__init__()
    self._supports_tf_logs = True  # reads no logs: ParameterServerStrategy allows its batch hook
    self.total_steps = total_steps
    self.steps_per_epoch = steps_per_epoch
    self.offset = offset
    self._epoch = 0

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch = epoch

  def on_train_batch_end(self, batch, logs=None):
    # ``batch`` is the index in this epoch of the last step run (with parameter servers:
    # scheduled).
    if self._epoch * self.steps_per_epoch + batch + 1 + self.offset >= self.total_steps:
      self.model.stop_training = True


def non_finite_losses(logs: Optional[Dict[str, Any]]) -> Dict[str, float]:
  """The loss values in ``logs`` that are NaN or infinite."""
  values = scalar_logs({k: v for k, v in (logs or {}).items() if k in LOSS_KEYS})
  return {k: v for k, v in values.items() if not math.isfinite(v)}


class NonFiniteGuard(keras.callbacks.Callback, StepHook):
  """Stops training at the first step whose loss is NaN/Inf by raising NonFiniteLossError.

  As a batch callback it must come first in ``fit``'s callback list, so no checkpoint and no
  publish of that step happens after it; as the first StepHook of a ThreadDriver (parameter
  servers) it makes the driver stop training and run no further hooks.
  """

  def __init__(self):
    super().__init__()
    self.step: Optional[int] = None

  def check(self, step: int, logs: Optional[Dict[str, Any]]) -> None:
    bad = non_finite_losses(logs)
    if bad:
      self.step = step
      shown = ", ".join(f"{k}={v}" for k, v in sorted(bad.items()))
      raise errors.NonFiniteLossError(f"non-finite loss at step {step} ({shown})", step)

  def on_train_batch_end(self, batch, logs=None):
    self.check(current_step(self.model), logs)

  def on_step(self, model, step, logs):
    self.check(step, logs)


class WallClockLimit(StepHook):
  """Ends training (as if its last step was reached) once it has run ``seconds``."""

  reads_logs = False

  def __init__(self, seconds: float):
    self.seconds = seconds
    self._start = time.monotonic()
    self.reached_at: Optional[int] = None

  def on_begin(self, model, step):
    self._start = time.monotonic()

  def on_step(self, model, step, logs):
    if self.reached_at is None and time.monotonic() - self._start >= self.seconds:
      self.reached_at = step
      logging.info("trainer.train.max_wall_seconds=%s reached at step %d: ending training",
                   self.seconds, step)
      model.stop_training = True


def scalar_logs(logs) -> Dict[str, float]:
  """Scalar logs as floats (parameter-server fit hands out RemoteValues)."""
  values = {}
  for key, value in (logs or {}).items():
    if hasattr(value, "fetch"):
      value = value.fetch()
    try:
      values[key] = float(np.asarray(value))
    except (TypeError, ValueError):
      continue
  return values
