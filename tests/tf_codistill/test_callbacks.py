"""Step hooks that need no training run: step timing around teacher refreshes."""

import pytest

from tf_codistill import callbacks


def test_step_timer_splits_steps_by_what_overlapped_them():
  timer = callbacks.StepTimer(steps_per_epoch=100, skip_steps=0)
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
  timer = callbacks.StepTimer(steps_per_epoch=4, skip_steps=2)
  timer.on_begin(None, 0)
  for step in (1, 2, 3, 4, 5, 8, 9):
    timer.on_step(None, step, {})
  # Intervals 2->3, 3->4, 4->5 (after the epoch's last step 4), 5->8, 8->9 (after step 8).
  assert [(steps, end) for _, _, steps, end in timer.intervals] == [
      (1, False), (1, False), (1, True), (3, False), (1, True)]


def _local_copy():
  import tensorflow as tf
  import tf_keras as keras

  def make():
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))
  student, local = make(), make()
  return callbacks.LocalCopy(student, local), tf.TensorSpec([None, 4], tf.float32)


def test_publisher_writes_off_the_loop_at_its_cadence_and_the_final_step(tmp_path):
  from tf_codistill import exchange
  local, spec = _local_copy()
  publisher = callbacks.ExchangePublisher(local, str(tmp_path), group=0, every_steps=10,
                                          input_spec=spec, keep_last=5)
  publisher.on_begin(None, 0)
  for step in range(1, 26):
    publisher.on_step(None, step, {})
    if publisher._in_flight is not None:
      publisher._in_flight.result()  # deterministic cadence for the test
  publisher.on_end(None, 25)
  assert [v.step for v in exchange.list_versions(str(tmp_path), 0)] == [25, 20, 10]
  assert publisher.failures == 0 and len(publisher.windows) == 3


def test_publish_due_while_one_is_in_flight_waits_then_cadence_returns_to_multiples(tmp_path):
  import concurrent.futures
  from tf_codistill import exchange
  local, spec = _local_copy()
  publisher = callbacks.ExchangePublisher(local, str(tmp_path), group=0, every_steps=10,
                                          input_spec=spec, keep_last=5)
  publisher.on_begin(None, 0)
  publisher._in_flight = concurrent.futures.Future()  # a slow publish still being written
  for step in range(1, 14):
    publisher.on_step(None, step, {})
  publisher._in_flight.set_result(None)
  for step in range(14, 26):
    publisher.on_step(None, step, {})
    publisher._in_flight.result()
  publisher.on_end(None, 25)
  assert [v.step for v in exchange.list_versions(str(tmp_path), 0)] == [25, 20, 14]


def test_failed_publish_is_counted_and_training_goes_on(tmp_path):
  blocker = tmp_path / "exchange"
  blocker.write_text("a file where the exchange directory should be")
  local, spec = _local_copy()
  publisher = callbacks.ExchangePublisher(local, str(blocker), group=0, every_steps=5,
                                          input_spec=spec)
  publisher.on_begin(None, 0)
  publisher.on_step(None, 5, {})
  publisher.on_end(None, 7)
  assert publisher.failures == 2 and publisher.publish_seconds == []
