"""Keras callbacks of a group's training: publishing, local evaluation, summaries, progress.

All of them work under every strategy: they read the student's values into a *local* copy of the
architecture (``LocalCopy``) where they need the model itself, so no collective or parameter-server
traffic is required beyond reading the weights once, and only the chief uses them. Periodic work
is a ``StepHook``, run after each batch (``BatchDriver``) or, under parameter servers where
tf_keras allows no batch-level callbacks, from a polling thread (``ThreadDriver``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from tf_codistill import errors
from tf_codistill import exchange
from tf_codistill import metrics as metrics_lib

LOSS_KEYS = ("loss", "task_loss", "distill_loss")


def current_step(model: keras.Model) -> int:
  return int(model.optimizer.iterations.numpy())


class LocalCopy:
  """A non-distributed copy of the student, refreshed from the (possibly distributed) student."""

  def __init__(self, student: keras.Model, local: keras.Model,
               before_snapshot: Optional[Callable[[], None]] = None):
    self.student = student
    self.model = local
    self.before_snapshot = before_snapshot  # e.g. flush pending fused optimizer updates
    self._synced_step = None
    self._lock = threading.Lock()

  def snapshot(self) -> List[np.ndarray]:
    """The student's current values (read between two steps for a consistent copy)."""
    if self.before_snapshot is not None:
      self.before_snapshot()
    return self.student.get_weights()

  @contextlib.contextmanager
  def at_step(self, step: int, weights: Optional[List[np.ndarray]] = None
              ) -> Iterator[keras.Model]:
    """The local copy holding the student's values of ``step`` (or ``weights``, a snapshot taken
    at that step), for exclusive use."""
    with self._lock:
      if self._synced_step != step:
        self.model.set_weights(self.snapshot() if weights is None else weights)
        self._synced_step = step
      yield self.model


class StepHook:
  """Work done every few steps; driven by batch callbacks or, under parameter servers, a thread."""

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
    values = _to_python(logs)
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
        logs = {m.name: float(m.result().numpy()) for m in self.model.metrics[:3]}
        logs["alpha"] = float(self.model._effective_alpha().numpy())
        logs["teacher_staleness"] = float(self.model.teacher_staleness().numpy())
        for hook in self.hooks:
          hook.on_step(self.model, step, logs)
      except errors.NonFiniteLossError as e:
        # Stop scheduling steps and run no more hooks (no publish, no summaries of NaNs).
        self.error = e
        self.model.stop_training = True
        return
      except Exception:  # A failing hook must not kill training; it is logged loudly.
        logging.exception("step hooks failed")

  def on_train_end(self, logs=None):
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    for hook in self.hooks:
      hook.on_end(self.model, current_step(self.model))


class EpochCheckpoint(keras.callbacks.Callback):
  """Checkpoints model and optimizer at every epoch end with a tf.train.CheckpointManager.

  For parameter-server groups, where tf_keras' BackupAndRestore is not supported: call
  ``restore()`` before ``fit`` and pass ``initial_epoch=restored_step // steps_per_epoch``.
  Saves are epoch-aligned, so a restart loses at most one epoch.
  """

  def __init__(self, directory: str, model: keras.Model, max_to_keep: int = 2,
               before_save: Optional[Callable[[], None]] = None):
    super().__init__()
    self.before_save = before_save  # e.g. flush pending fused optimizer updates
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    self.manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=max_to_keep)

  def restore(self) -> int:
    """Restores the newest checkpoint if there is one; returns the optimizer step."""
    path = self.manager.restore_or_initialize()
    step = current_step(self.manager.checkpoint.model)
    if path:
      logging.info("resumed from checkpoint %s at step %d", path, step)
    return step

  def on_epoch_end(self, epoch, logs=None):
    bad = non_finite_losses(logs)
    if bad:
      logging.error("not checkpointing step %d: non-finite %s; the previous checkpoint is kept",
                    current_step(self.model), bad)
      return
    if self.before_save is not None:
      self.before_save()
    self.manager.save(checkpoint_number=current_step(self.model))


def checkpoint_step(path: str) -> Optional[int]:
  """The optimizer step a checkpoint (BackupAndRestore's or EpochCheckpoint's) was taken at."""
  reader = tf.train.load_checkpoint(path)
  for key in sorted(reader.get_variable_to_shape_map()):
    if key.endswith("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"):
      return int(reader.get_tensor(key))
  return None


def non_finite_losses(logs: Optional[Dict[str, Any]]) -> Dict[str, float]:
  """The loss values in ``logs`` that are NaN or infinite."""
  values = _to_python({k: v for k, v in (logs or {}).items() if k in LOSS_KEYS})
  return {k: v for k, v in values.items() if not math.isfinite(v)}


def all_finite(arrays: Sequence[np.ndarray]) -> bool:
  """True if every floating-point array holds only finite values."""
  return all(np.isfinite(a).all() for a in arrays if np.issubdtype(np.asarray(a).dtype, np.floating))


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


class Heartbeat(StepHook):
  """Writes ``path`` (JSON: step, start step, time, pid) at most every ``every_seconds``: shows
  that a task is alive and progressing, and from which step a restarted task resumed."""

  def __init__(self, path: str, every_seconds: float = 5.0, task: str = "chief:0"):
    self.path = path
    self.every_seconds = every_seconds
    self.task = task
    self.start_step: Optional[int] = None
    self._last = -math.inf

  def _write(self, step: int) -> None:
    record = {"step": int(step), "start_step": self.start_step, "time": time.time(),
              "pid": os.getpid(), "task": self.task}
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


class WallClockLimit(StepHook):
  """Ends training (as if its last step was reached) once it has run ``seconds``."""

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


class ExchangePublisher(StepHook):
  """Publishes the student to the exchange directory every ``every_steps`` optimizer steps.

  The training loop only snapshots the weights (``get_weights``); writing the SavedModel happens
  on a background thread, one publish at a time (a publish due while one is in flight waits for
  the next step after it, and the cadence stays on multiples of ``every_steps``). Steps are
  compared by order, not equality: with ``steps_per_execution`` or asynchronous training not
  every step is seen. A version is named by the step whose weights it holds.
  """

  def __init__(self, local: LocalCopy, exchange_dir: str, group: int, every_steps: int,
               input_spec, *, keep_last: int = 2, probe=None):
    if every_steps < 1:
      raise ValueError(f"exchange_every_steps={every_steps} must be >= 1")
    self.probe = probe  # real inputs the published model must predict finite values on
    self.refused = 0  # snapshots not published because they were not finite
    self.local = local
    self.exchange_dir = exchange_dir
    self.group = group
    self.every_steps = every_steps
    self.input_spec = input_spec
    self.keep_last = keep_last
    self.last_published = 0
    self.failures = 0
    self.publish_seconds: List[float] = []
    self.windows: List[Tuple[float, float]] = []  # (snapshot taken, published), time.monotonic()
    self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="publisher")
    self._in_flight: Optional[concurrent.futures.Future] = None

  def _publish(self, step: int, weights: List[np.ndarray], start: float) -> None:
    try:
      with self.local.at_step(step, weights) as local:
        problem = finiteness_problem(local, weights, self.probe)
        if problem:
          self.refused += 1
          logging.error("exchange: not publishing step %d: %s; peers keep the previous version",
                        step, problem)
          return
        path = exchange.publish(local, self.exchange_dir, self.group, step, self.input_spec,
                                keep_last=self.keep_last)
    except (tf.errors.OpError, OSError) as e:
      # Peers keep the previous version; training goes on and the next interval retries.
      self.failures += 1
      logging.error("exchange: publishing step %d to %s failed, previous version kept: %s",
                    step, self.exchange_dir, e)
      return
    end = time.monotonic()
    self.publish_seconds.append(end - start)
    self.windows.append((start, end))
    logging.info("exchange: published step %d to %s (%.2fs, off the training loop)", step, path,
                 end - start)

  def _start(self, step: int) -> None:
    start = time.monotonic()
    self.last_published = step
    self._in_flight = self._executor.submit(self._publish, step, self.local.snapshot(), start)

  def on_begin(self, model, step):
    self.last_published = step - step % self.every_steps  # resumed runs keep the cadence

  def on_step(self, model, step, logs):
    if self._in_flight is not None and not self._in_flight.done():
      return
    if step >= (self.last_published // self.every_steps + 1) * self.every_steps:
      self._start(step)

  def on_end(self, model, step):
    if self._in_flight is not None:
      self._in_flight.result()
    if step != self.last_published:
      self._start(step)
      self._in_flight.result()
    self._executor.shutdown()

  def drain(self) -> None:
    """Finishes a publish in flight (of a snapshot taken earlier) and publishes nothing more."""
    if self._in_flight is not None:
      self._in_flight.result()
    self._executor.shutdown()


def finiteness_problem(model: keras.Model, weights: Sequence[np.ndarray], probe=None
                       ) -> Optional[str]:
  """Why ``model`` (holding ``weights``) must not be published or exported, or None."""
  if not all_finite(weights):
    return "its weights contain NaN/Inf"
  if probe is not None and not np.isfinite(model(probe, training=False).numpy()).all():
    return "its predictions on a probe batch of real inputs are NaN/Inf"
  return None


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


class StepTimer(StepHook):
  """Wall time per step as the training loop sees it (hooks included), split by what overlapped
  the step: named time windows (teacher refreshes, publishes) or an epoch end (evaluation,
  checkpoints).

  Under a ThreadDriver an interval spans every step the workers finished since the last poll;
  each such interval counts once, as its mean time per step.
  """

  def __init__(self, steps_per_epoch: int, skip_steps: int = 5):
    self.steps_per_epoch = steps_per_epoch
    self.skip_steps = skip_steps  # the first steps include tracing
    self.intervals: List[Tuple[float, float, int, bool]] = []  # (start, end, steps, epoch end)
    self._last: Optional[Tuple[float, int]] = None

  def on_begin(self, model, step):
    self._last = (time.monotonic(), step)
    self.skip_until = step + self.skip_steps

  def on_step(self, model, step, logs):
    now = time.monotonic()
    start, last_step = self._last
    if step > last_step and last_step >= self.skip_until:
      # Epoch-end callbacks run after the hooks of an epoch's last step, inside this interval.
      next_boundary = -(-last_step // self.steps_per_epoch) * self.steps_per_epoch
      self.intervals.append((start, now, step - last_step, next_boundary < step))
    self._last = (now, step)

  def timeline(self, windows: Dict[str, Sequence[Tuple[float, float]]]) -> Dict[str, object]:
    """The raw intervals and ``windows`` (JSON-ready), on time.monotonic(): CLOCK_MONOTONIC on
    Linux, one clock for every process of the host."""
    return {"clock": "time.monotonic",
            "intervals": [[round(s, 6), round(e, 6), n, bool(x)] for s, e, n, x in self.intervals],
            "windows": {name: [[round(s, 6), round(e, 6)] for s, e in spans]
                        for name, spans in windows.items()}}

  def quantiles_ms(self, windows: Dict[str, Sequence[Tuple[float, float]]]
                   ) -> Dict[str, Dict[str, float]]:
    """p50/p99/max step time (ms) per category: 'epoch_end', the names of the windows a step
    overlapped (joined by '+', e.g. 'refresh+publish'), or 'other'; and per category how many
    steps took more than 3x the median of 'other' (a plain step)."""
    values: Dict[str, List[float]] = {"other": []}
    for start, end, steps, epoch_end in self.intervals:
      names = [name for name, spans in windows.items()
               if any(start < w_end and w_start < end for w_start, w_end in spans)]
      key = "epoch_end" if epoch_end else "+".join(names) or "other"
      values.setdefault(key, []).append(1000.0 * (end - start) / steps)
    reference = float(np.median(values["other"])) if values["other"] else None
    return {key: ({"count": len(v), "p50": float(np.percentile(v, 50)),
                   "p99": float(np.percentile(v, 99)), "max": float(np.max(v)),
                   # Steps slower than 3x the median step of category 'other'.
                   "over_3x_median": int(sum(x > 3 * reference for x in v)) if reference else 0}
                  if v else {"count": 0})
            for key, v in values.items()}


class ProgressLog(keras.callbacks.Callback):
  """Appends one JSON line per epoch (step, wall time, metrics) to ``path`` for launchers/benchmarks.

  ``rates`` is a list another hook appends examples/sec measurements to (StepSummaries); the
  median of those added during the epoch is logged as ``examples_per_sec``.
  """

  def __init__(self, path: str, group: int, total_steps: int,
               rates: Optional[List[float]] = None):
    super().__init__()
    self.path = path
    self.group = group
    self.total_steps = total_steps
    self.rates = rates
    self._seen_rates = 0
    self._start = time.monotonic()

  def on_epoch_end(self, epoch, logs=None):
    record = {"group": self.group, "epoch": epoch + 1, "step": current_step(self.model),
              "total_steps": self.total_steps, "wall_time_s": time.monotonic() - self._start}
    record.update(_to_python(logs))
    if self.rates is not None and len(self.rates) > self._seen_rates:
      record["examples_per_sec"] = float(np.median(self.rates[self._seen_rates:]))
      self._seen_rates = len(self.rates)
    with tf.io.gfile.GFile(self.path, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")


def _to_python(logs) -> Dict[str, float]:
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
