"""StepTimer and ClosureTimer: step times split by what overlapped them (no training run needed)."""

import threading
import time
import types

import pytest

from tf_codistill.training import step_timing


def test_step_timer_splits_steps_by_what_overlapped_them():
  timer = step_timing.StepTimer(steps_per_epoch=100, skip_steps=0)
  timer.on_begin(None, 0)
  # Hand-made intervals (start, end, steps, epoch end): 10 ms steps, a 50 ms step during a
  # refresh, a 4-step interval of 80 ms (20 ms/step), one step overlapping both windows, and an
  # epoch end during a publish (counted as an epoch end).
  timer.intervals = [(0.00, 0.01, 1, False), (0.01, 0.02, 1, False), (0.02, 0.07, 1, False),
                     (0.07, 0.15, 4, False), (0.15, 0.16, 1, False), (0.20, 0.23, 1, False),
                     (0.30, 0.70, 1, True)]
  summary = timer.quantiles_ms({"refresh": [(0.03, 0.05), (0.22, 0.25)],
                                "publish": [(0.21, 0.22), (0.5, 0.6)]})
  assert summary["refresh"] == {"count": 1, "p50": pytest.approx(50.0), "p99": pytest.approx(50.0),
                                "max": pytest.approx(50.0), "over_3x_median": 1}
  assert summary["refresh+publish"]["p50"] == pytest.approx(30.0)
  assert summary["epoch_end"]["p50"] == pytest.approx(400.0)
  assert summary["other"]["count"] == 4
  assert summary["other"]["p50"] == pytest.approx(10.0)
  assert summary["other"]["p99"] == pytest.approx(10.0 + 0.97 * 10.0)
  # 'other' has a median of 10 ms: its 20 ms interval is not an outlier, the 400 ms epoch end is.
  assert summary["other"]["over_3x_median"] == 0 and summary["epoch_end"]["over_3x_median"] == 1
  assert "publish" not in summary


def test_step_timer_skips_the_first_steps_and_marks_epoch_ends():
  timer = step_timing.StepTimer(steps_per_epoch=4, skip_steps=2)
  timer.on_begin(None, 0)
  for step in (1, 2, 3, 4, 5, 8, 9):
    timer.on_step(None, step, {})
  # Intervals 2->3, 3->4, 4->5 (after the epoch's last step 4), 5->8, 8->9 (after step 8).
  assert [(steps, end) for _, _, steps, end in timer.intervals] == [
      (1, False), (1, False), (1, True), (3, False), (1, True)]


class _Closure:
  """A scheduled step's remote output as the coordinator holds it: done when its event is set."""

  def __init__(self, error=None):
    self._status_available_event = threading.Event()
    self._error = error
    self._status = types.SimpleNamespace(name="READY")

  def _get_error(self):
    self._status_available_event.wait()
    return self._error

  def fetch(self):
    raise AssertionError("the timer must not copy a closure's outputs")


def test_closure_timer_times_each_scheduled_step_as_it_finishes():
  timer = step_timing.ClosureTimer(steps_per_execution=2, skip_steps=1)
  timer.on_train_begin()
  closures = [_Closure(), _Closure(), _Closure(RuntimeError("worker lost")), _Closure(),
              _Closure()]
  for batch, closure in enumerate(closures):
    if batch == 3:
      timer.on_epoch_begin(1)
    timer.on_train_batch_end(batch, {"loss": closure})  # queued; nothing is done yet
  finished = []  # a moment before each closure finished
  for closure in closures:
    time.sleep(0.02)
    finished.append(time.monotonic())
    closure._status_available_event.set()
  timer.on_train_end()
  # Finishes 1, 2, (3 failed), 4, 5; the first (tracing) is not counted: intervals 1->2, 2->4
  # (an epoch began in between), 4->5, each of 2 steps.
  assert [(steps, epoch_end) for _, _, steps, epoch_end in timer.intervals] == [
      (2, False), (2, True), (2, False)]
  for (start, end, _, _), (before, after) in zip(timer.intervals,
                                                 [(0, 1), (1, 3), (3, 4)]):
    assert finished[before] <= start < end and finished[after] <= end
  assert timer.quantiles_ms({})["other"]["count"] == 2


def test_closure_timer_keeps_only_the_newest_intervals():
  timer = step_timing.ClosureTimer(skip_steps=0, max_intervals=2)
  timer.on_train_begin()
  closures = [_Closure() for _ in range(5)]
  for batch, closure in enumerate(closures):
    closure._status_available_event.set()
    timer.on_train_batch_end(batch, {"loss": closure})
  timer.on_train_end()
  assert len(timer.intervals) == 2  # of 4 (5 finishes), the last two
  assert timer.intervals[0][1] == timer.intervals[1][0]
