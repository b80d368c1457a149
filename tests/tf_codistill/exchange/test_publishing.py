"""LocalCopy and ExchangePublisher: publishing off the training loop, at its cadence."""

from tf_codistill.exchange import publishing


def _local_copy():
  import tensorflow as tf
  import tf_keras as keras

  def make():
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))
  student, local = make(), make()
  return publishing.LocalCopy(student, local), tf.TensorSpec([None, 4], tf.float32)


def test_publisher_writes_off_the_loop_at_its_cadence_and_the_final_step(tmp_path):
  from tf_codistill.exchange import directory as exchange
  local, spec = _local_copy()
  publisher = publishing.ExchangePublisher(local, str(tmp_path), group=0, publish_every_steps=10,
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

  from tf_codistill.exchange import directory as exchange
  local, spec = _local_copy()
  publisher = publishing.ExchangePublisher(local, str(tmp_path), group=0, publish_every_steps=10,
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
  publisher = publishing.ExchangePublisher(local, str(blocker), group=0, publish_every_steps=5,
                                          input_spec=spec)
  publisher.on_begin(None, 0)
  publisher.on_step(None, 5, {})
  publisher.on_end(None, 7)
  assert publisher.failures == 2 and publisher.publish_seconds == []


def test_an_unexpected_publish_error_is_logged_and_counted_not_lost(tmp_path, caplog):
  import logging

  local, spec = _local_copy()
  publisher = publishing.ExchangePublisher(local, str(tmp_path), group=0, publish_every_steps=5,
                                          input_spec=spec)

  def broken(*args, **kwargs):
    raise TypeError("a bug in a writer")
  publisher.writer = type("Writer", (), {"publish": staticmethod(broken)})()
  publisher.on_begin(None, 0)
  with caplog.at_level(logging.ERROR):
    publisher.on_step(None, 5, {})
    publisher.on_end(None, 5)
  assert publisher.failures == 1
  assert "publishing step 5" in caplog.text and "failed unexpectedly" in caplog.text
  assert "TypeError: a bug in a writer" in caplog.text
