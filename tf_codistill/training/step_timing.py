"""Step times as the training loop sees them, split by what overlapped each step.

``StepTimer`` times steps between batch hooks (every strategy but parameter servers);
``ClosureTimer`` times, under parameter servers, every step function the coordinator scheduled
by when it finished on its worker.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tf_keras as keras
from absl import logging

from tf_codistill.step_hooks import StepHook

Interval = Tuple[float, float, int, bool]  # (start, end, steps, whether an epoch end fell in it)


class _Intervals:
  """Timed step intervals and what they say, split by the windows they overlapped."""

  intervals: Sequence[Interval]

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


class StepTimer(_Intervals, StepHook):
  """Wall time per step as the training loop sees it (hooks included), split by what overlapped
  the step: named time windows (teacher refreshes, publishes) or an epoch end (evaluation,
  checkpoints).

  Under a ThreadDriver an interval spans every step the workers finished since the last poll;
  each such interval counts once, as its mean time per step (``ClosureTimer`` times each step).
  """

  reads_logs = False

  def __init__(self, steps_per_epoch: int, skip_steps: int = 5):
    self.steps_per_epoch = steps_per_epoch
    self.skip_steps = skip_steps  # the first steps include tracing
    self.intervals: List[Interval] = []
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


class ClosureTimer(_Intervals, keras.callbacks.Callback):
  """Under ParameterServerStrategy, the time of every step function the coordinator scheduled:
  from when the one before it finished on a worker to when it finished, each a closure of
  ``steps_per_execution`` steps. With one worker per group these are its step times; with
  several, the gaps between any two workers' finishes. The newest ``max_intervals`` are kept.

  A thread waits for each closure in the order scheduled and stamps time.monotonic() when it is
  done; the training thread only queues them. Keras hands this batch hook the closures' remote
  outputs (``_supports_tf_logs``), which it never copies.
  """

  def __init__(self, steps_per_execution: int = 1, skip_steps: int = 5,
               max_intervals: int = 200_000):
    super().__init__()
    self._supports_tf_logs = True
    self.steps_per_execution = steps_per_execution
    self.skip_steps = skip_steps  # the first closures include tracing
    # The newest intervals only: a long job must not grow the chief's memory step by step.
    self.intervals: Deque[Interval] = collections.deque(maxlen=max_intervals)
    self._epoch = 0
    self._pending: "queue.Queue[Optional[Tuple[Any, int]]]" = queue.Queue()
    self._thread: Optional[threading.Thread] = None
    self._last: Optional[Tuple[float, int]] = None  # when the last closure finished, its epoch
    self._seen = 0

  def on_train_begin(self, logs=None):
    self._last, self._seen = None, 0
    self._thread = threading.Thread(target=self._stamp, name="closure-timer", daemon=True)
    self._thread.start()

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch = epoch

  def on_train_batch_end(self, batch, logs=None):
    self._pending.put((logs, self._epoch))

  def on_train_end(self, logs=None):
    self._pending.put(None)
    if self._thread is not None:
      self._thread.join(timeout=60.0)

  def _stamp(self) -> None:
    while True:
      item = self._pending.get()
      if item is None:
        return
      logs, epoch = item
      if not _finished(logs):
        continue  # failed or cancelled (its step is rescheduled on another worker)
      now = time.monotonic()
      self._seen += 1
      if self._last is not None and self._seen > self.skip_steps:
        start, last_epoch = self._last
        self.intervals.append((start, now, self.steps_per_execution, epoch != last_epoch))
      self._last = (now, epoch)


def _finished(logs: Any) -> bool:
  """Waits until the closure whose outputs are ``logs`` is done; whether it succeeded."""
  remote = next((leaf for leaf in _leaves(logs) if hasattr(leaf, "fetch")), None)
  if remote is None:
    return True  # plain values: the step ran in this process
  # RemoteValue._get_error waits for the closure without copying its outputs to the
  # coordinator; fetch() (public) waits and copies.
  wait = getattr(remote, "_get_error", None)
  try:
    if wait is None:
      remote.fetch()
      return True
    return wait() is None and _status_ready(remote)
  except Exception as e:  # pylint: disable=broad-except
    logging.info("closure timer: a step failed or was cancelled: %s", e)
    return False


def _status_ready(remote: Any) -> bool:
  status = getattr(remote, "_status", None)
  return status is None or getattr(status, "name", "READY") == "READY"


def _leaves(logs: Any) -> List[Any]:
  if isinstance(logs, dict):
    return [leaf for value in logs.values() for leaf in _leaves(value)]
  return [logs]
