"""What a group's chief reports while it trains: heartbeat, evaluation, summaries, progress.

Evaluation and prediction history read the student through a ``publishing.LocalCopy``, so no
collective or parameter-server traffic is needed beyond reading the weights once.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from tf_codistill import metrics as metrics_lib
from tf_codistill.exchange import directory as exchange
from tf_codistill.exchange.publishing import LocalCopy
from tf_codistill.step_hooks import StepHook
from tf_codistill.step_hooks import current_step
from tf_codistill.step_hooks import scalar_logs


class Heartbeat(StepHook):
  """Writes ``path`` (JSON: step, start step, time, pid, phase, pulses) at most every
  ``every_seconds``: shows that a task is alive and progressing (steps, or ``pulse``s of an
  evaluation or export between them), and from which step a restarted task resumed."""

  reads_logs = False

  def __init__(self, path: str, every_seconds: float = 5.0, task: str = "chief:0"):
    self.path = path
    self.every_seconds = every_seconds
    self.task = task
    self.start_step: Optional[int] = None
    self._last = -math.inf
    self._step = 0
    self._beats = 0  # pulses between steps (evaluating, exporting): progress the launcher sees
    self._phase = "training"

  def _write(self, step: int, phase: str = "training") -> None:
    self._step, self._phase = int(step), phase
    record = {"step": int(step), "start_step": self.start_step, "time": time.time(),
              "pid": os.getpid(), "task": self.task, "phase": phase, "beats": self._beats}
    try:
      exchange.write_atomically(self.path, json.dumps(record))
    except (tf.errors.OpError, OSError) as e:  # monitoring only: never stops training
      logging.warning("heartbeat: cannot write %s: %s", self.path, e)
    self._last = time.monotonic()

  def on_begin(self, model, step):
    self.start_step = int(step)
    logging.info("%s starts training at step %d%s", self.task, step,
                 " (resumed from a checkpoint)" if step else "")
    self._write(step)

  def on_step(self, model, step, logs):
    if time.monotonic() - self._last >= self.every_seconds:
      self._write(step)

  def on_end(self, model, step):
    self._write(step)

  def pulse(self, phase: str) -> None:
    """Progress between steps (a batch evaluated, an export begun): the launcher's stall
    watchdog counts it as progress, so a long evaluation or the run's end is not a hang."""
    self._beats += 1
    if phase != self._phase or time.monotonic() - self._last >= self.every_seconds:
      self._write(self._step, phase)  # a new phase at once: its clock starts now


class LocalEvaluation(keras.callbacks.Callback):
  """Evaluates the student on the chief at each epoch end and adds ``val_*`` to the logs.

  A plain loop over the local copy rather than ``Model.evaluate``, which under a
  parameter-server strategy would ship the evaluation to the workers.
  """

  def __init__(self, local: LocalCopy, dataset: tf.data.Dataset, task_loss: keras.losses.Loss,
               metrics: Callable[[], List[keras.metrics.Metric]], steps: Optional[int] = None):
    super().__init__()
    self.local = local
    self.dataset = dataset if steps is None else dataset.take(steps)
    self.task_loss = task_loss
    self.metrics = [keras.metrics.Mean(name="loss")] + metrics()
    self.last: Dict[str, float] = {}
    self.pulse: Optional[Callable[[str], None]] = None  # Heartbeat.pulse, on the chief

    @tf.function
    def update(x, y):
      logits = self.local.model(x, training=False)
      # Per-example values through Loss.call: reductions are refused inside a strategy's scope.
      self.metrics[0].update_state(tf.reduce_mean(self.task_loss.call(y, logits)),
                                   sample_weight=tf.shape(y)[0])
      for metric in self.metrics[1:]:
        metric.update_state(y, logits)

    self._update = update

  def evaluate(self) -> Dict[str, float]:
    with self.local.at_step(current_step(self.model)):
      for metric in self.metrics:
        metric.reset_state()
      for x, y in self.dataset:
        self._update(x, y)
        if self.pulse is not None:
          self.pulse("evaluating")
      self.last = {m.name: float(m.result().numpy()) for m in self.metrics}
    return self.last

  def on_epoch_end(self, epoch, logs=None):
    results = self.evaluate()
    if logs is not None:
      logs.update({f"val_{k}": v for k, v in results.items()})


class PredictionHistory(keras.callbacks.Callback):
  """Saves the student's eval probabilities and labels at every epoch end, as
  ``directory/step_<n>.npz``: churn between retrains can then be compared at matched
  validation loss (benchmarks), not only at the end of training."""

  def __init__(self, local: LocalCopy, dataset: tf.data.Dataset, output: str, directory: str,
               save: Callable[..., None]):
    super().__init__()
    self.local, self.dataset, self.output = local, dataset, output
    self.directory, self.save = directory, save
    tf.io.gfile.makedirs(directory)

  def on_epoch_end(self, epoch, logs=None):
    step = current_step(self.model)
    with self.local.at_step(step):
      probs, labels = metrics_lib.model_probabilities(self.local.model, self.dataset, self.output)
    self.save(os.path.join(self.directory, f"step_{step}.npz"), probs=probs, labels=labels)


class StepSummaries(StepHook):
  """Writes step-level TensorBoard scalars: losses, alpha, teacher staleness, examples/sec, and
  ``counters`` (name -> function returning a count, e.g. skipped input lines), whose growth is
  also logged as a warning."""

  KEYS = ("loss", "task_loss", "distill_loss", "alpha", "teacher_staleness")

  def __init__(self, writer: tf.summary.SummaryWriter, batch_size: int, every_steps: int = 50,
               counters: Optional[Dict[str, Callable[[], float]]] = None):
    self.writer = writer
    self.batch_size = batch_size
    self.every_steps = max(1, every_steps)
    self.counters = dict(counters or {})
    self._counted = {name: 0 for name in self.counters}
    self._last_time = None
    self._last_step = None
    self.examples_per_sec: List[float] = []

  def on_begin(self, model, step):
    self._last_time = time.monotonic()
    self._last_step = step

  def on_step(self, model, step, logs):
    if step - self._last_step < self.every_steps:
      return
    now = time.monotonic()
    rate = (step - self._last_step) * self.batch_size / max(now - self._last_time, 1e-9)
    self.examples_per_sec.append(rate)
    self._last_time, self._last_step = now, step
    with self.writer.as_default(step=step):
      tf.summary.scalar("examples_per_sec", rate)
      for key in self.KEYS:
        if key in logs:
          tf.summary.scalar(key, logs[key])
      for name, count in self.counters.items():
        value = count()
        tf.summary.scalar(name, value)
        if value > self._counted[name]:
          logging.warning("%s: %d at step %d (+%d)", name, value, step,
                          value - self._counted[name])
          self._counted[name] = value


def _step_of(line: str, otherwise: int) -> int:
  """The step of a progress line; ``otherwise`` for a line cut short (not whole JSON, or
  without its newline)."""
  if not line.endswith("\n"):
    return otherwise
  try:
    return int(json.loads(line)["step"])
  except (ValueError, KeyError, TypeError):
    return otherwise


class ProgressLog(keras.callbacks.Callback):
  """Appends one JSON line per epoch (step, wall time, metrics) to ``path`` for launchers and
  benchmarks.

  ``rates`` is a list another hook appends examples/sec measurements to (StepSummaries); the
  median of those added during the epoch is logged as ``examples_per_sec``. A run resumed from
  the checkpoint of ``resume_step`` drops the lines of later steps (their steps run again) and a
  line a stop cut short, and counts its wall time on from that of the step it resumed at, so
  the file reads as one run (its wall time is the parts', each from its process's start: the
  time from a part's last evaluation to its stop is not in it).
  """

  def __init__(self, path: str, group: int, total_steps: int,
               rates: Optional[List[float]] = None, resume_step: int = 0):
    super().__init__()
    self.path = path
    self.group = group
    self.total_steps = total_steps
    self.rates = rates
    self.resume_step = resume_step
    self.resumed_wall_time_s = 0.0
    self._seen_rates = 0
    self._start = time.monotonic()

  def on_train_begin(self, logs=None):
    if not tf.io.gfile.exists(self.path):
      return
    with tf.io.gfile.GFile(self.path) as f:
      lines = [line for line in f if line.strip()]
    kept = [line for line in lines if _step_of(line, self.resume_step + 1) <= self.resume_step]
    if kept != lines:
      exchange.write_atomically(self.path, "".join(kept))
    if kept:
      self.resumed_wall_time_s = float(json.loads(kept[-1])["wall_time_s"])

  def on_epoch_end(self, epoch, logs=None):
    record = {"group": self.group, "epoch": epoch + 1, "step": current_step(self.model),
              "total_steps": self.total_steps,
              "wall_time_s": self.resumed_wall_time_s + time.monotonic() - self._start}
    record.update(scalar_logs(logs))
    if self.rates is not None and len(self.rates) > self._seen_rates:
      record["examples_per_sec"] = float(np.median(self.rates[self._seen_rates:]))
      self._seen_rates = len(self.rates)
    with tf.io.gfile.GFile(self.path, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")
