"""Publishing the student to the exchange directory from the chief, off the training loop.

``LocalCopy`` holds a non-distributed copy of the (possibly distributed) student, refreshed between
two steps; ``ExchangePublisher`` writes it as a SavedModel (or a lean version:
``lean_versions.LeanWriter``) on a background thread every K steps.
A model whose weights or probe predictions are not finite is never published or exported.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from tf_codistill.exchange import directory as exchange
from tf_codistill.exchange import lean_versions
from tf_codistill.step_hooks import StepHook


def all_finite(arrays: Sequence[np.ndarray]) -> bool:
  """True if every floating-point array holds only finite values."""
  return all(np.isfinite(a).all() for a in arrays
             if np.issubdtype(np.asarray(a).dtype, np.floating))


class LocalCopy:
  """A non-distributed copy of the student, refreshed from the (possibly distributed) student."""

  def __init__(self, student: keras.Model, local: keras.Model,
               before_snapshot: Optional[Callable[[], None]] = None):
    self.student = student
    self.model = local
    self.before_snapshot = before_snapshot  # e.g. flush pending fused optimizer updates
    self._synced_step = None
    self._lock = threading.Lock()
    self.read_lock: Optional[threading.Lock] = None  # held by writers of the student's variables

  def snapshot(self) -> List[np.ndarray]:
    """The student's current values (read between two steps for a consistent copy)."""
    if self.before_snapshot is not None:
      self.before_snapshot()
    if self.read_lock is None:
      return self.student.get_weights()
    with self.read_lock:
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


def _version_bytes(group: int, step: int, path: str) -> int:
  """The bytes of the files a published version's marker lists (0 if it cannot be read)."""
  try:
    files = exchange.read_marker(exchange.Version(group, step, path)).get("files") or {}
  except exchange.InvalidVersionError:
    return 0
  return int(sum(files.values()))


class ExchangePublisher(StepHook):
  """Publishes the student to the exchange directory every ``publish_every_steps`` optimizer
  steps.

  The training loop only snapshots the weights (``get_weights``); writing the SavedModel happens
  on a background thread, one publish at a time (a publish due while one is in flight waits for
  the next step after it, and the cadence stays on its multiples). Steps are compared by order,
  not equality: with ``steps_per_execution`` or asynchronous training not every step is seen. A
  version is named by the step whose weights it holds. ``publish_every_steps`` and
  ``keep_last`` are ``tfc.Exchange``'s, which checks them.
  """

  reads_logs = False

  def __init__(self, local: LocalCopy, exchange_dir: str, group: int, publish_every_steps: int,
               input_spec, *, keep_last: int = 2, probe=None,
               writer: Optional[lean_versions.LeanWriter] = None):
    self.probe = exchange.ProbeForward(probe)  # the published model must predict finite values
    self.writer = writer  # writes lean versions; None: SavedModels
    self.refused = 0  # snapshots not published because they were not finite
    self.local = local
    self.exchange_dir = exchange_dir
    self.group = group
    self.publish_every_steps = publish_every_steps
    self.input_spec = input_spec
    self.keep_last = keep_last
    self.last_published = 0
    self.failures = 0
    self.publish_seconds: List[float] = []
    self.published_bytes: List[int] = []  # the files of each version (what every peer reads)
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
        if self.writer is None:
          path = exchange.publish(local, self.exchange_dir, self.group, step, self.input_spec,
                                  keep_last=self.keep_last)
        else:
          path = self.writer.publish(weights, self.exchange_dir, self.group, step,
                                     keep_last=self.keep_last)
    except (tf.errors.OpError, OSError) as e:
      # Peers keep the previous version; training goes on and the next interval retries.
      self.failures += 1
      logging.error("exchange: publishing step %d to %s failed, previous version kept: %s",
                    step, self.exchange_dir, e)
      return
    except Exception:  # Not the filesystem: said loudly, as nothing reads this thread's result.
      self.failures += 1
      logging.exception("exchange: publishing step %d to %s failed unexpectedly, previous "
                        "version kept", step, self.exchange_dir)
      return
    end = time.monotonic()
    self.published_bytes.append(_version_bytes(self.group, step, path))
    self.publish_seconds.append(end - start)
    self.windows.append((start, end))
    logging.info("exchange: published step %d to %s (%.2fs, off the training loop)", step, path,
                 end - start)

  def _start(self, step: int) -> None:
    start = time.monotonic()
    self.last_published = step
    self._in_flight = self._executor.submit(self._publish, step, self.local.snapshot(), start)

  def on_begin(self, model, step):
    self.last_published = step - step % self.publish_every_steps  # resumed runs keep the cadence

  def on_step(self, model, step, logs):
    if self._in_flight is not None and not self._in_flight.done():
      return
    if step >= (self.last_published // self.publish_every_steps + 1) * self.publish_every_steps:
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


def finiteness_problem(model: keras.Model, weights: Sequence[np.ndarray],
                       probe: Optional[exchange.ProbeForward] = None) -> Optional[str]:
  """Why ``model`` (holding ``weights``) must not be published or exported, or None."""
  if not all_finite(weights):
    return "its weights contain NaN/Inf"
  if probe is not None and not probe.finite(model):
    return "its predictions on a probe batch of real inputs are NaN/Inf"
  return None
