"""Step times as the training loop sees them, split by what overlapped each step."""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tf_codistill.step_hooks import StepHook


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
