"""Step hooks and the callbacks that end training: exactly the steps asked for, NaN stops."""

import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill import errors
from tf_codistill import step_hooks
from tf_codistill.training.model import CodistillModel

from testing_utils import small_net


def _fit(callbacks, epochs, steps_per_epoch, loss_scale=1.0):
  model = small_net()
  model.compile(optimizer="sgd", loss=lambda y, p: loss_scale * tf.reduce_mean((y - p) ** 2))
  data = tf.data.Dataset.from_tensor_slices(
      (np.ones([64, 4], "float32"), np.ones([64, 1], "float32"))).batch(8).repeat()
  model.fit(data, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=0)
  return model


@pytest.mark.parametrize("total, steps_per_epoch, epochs", [(70, 30, 3), (60, 30, 2), (5, 30, 1)])
def test_step_limit_ends_fit_at_exactly_the_steps_asked_for(total, steps_per_epoch, epochs):
  ends = []

  class EpochEnds(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
      ends.append(step_hooks.current_step(self.model))

  model = _fit([step_hooks.StepLimit(total, steps_per_epoch), EpochEnds()], epochs,
               steps_per_epoch)
  assert step_hooks.current_step(model) == total
  # The cut-short last epoch still ends (evaluation, checkpoints and progress run there).
  assert ends[-1] == total and len(ends) == epochs


def test_step_limit_counts_the_steps_a_run_took_before_its_first_epoch_began():
  # A parameter-server run resumed from a checkpoint at step 250 (epochs of 100) starts epoch 2
  # over: 50 steps of it were taken, so 700 more make the run's 1000 steps, not 750.
  model = small_net()
  model.compile(optimizer="sgd", loss="mse")
  model.optimizer.iterations.assign(250)
  data = tf.data.Dataset.from_tensor_slices(
      (np.ones([64, 4], "float32"), np.ones([64, 1], "float32"))).batch(8).repeat()
  model.fit(data, epochs=10, initial_epoch=2, steps_per_epoch=100, verbose=0,
            callbacks=[step_hooks.StepLimit(1000, 100, offset=250 % 100)])
  assert step_hooks.current_step(model) == 1000


def test_batch_driver_runs_hooks_with_float_logs_and_the_guard_stops_at_nan():
  seen = []

  class Record(step_hooks.StepHook):
    def on_begin(self, model, step):
      seen.append(("begin", step))

    def on_step(self, model, step, logs):
      seen.append((step, sorted(logs), type(logs["loss"])))

    def on_end(self, model, step):
      seen.append(("end", step))

  _fit([step_hooks.BatchDriver([Record()])], 1, 2)
  assert seen == [("begin", 0), (1, ["loss"], float), (2, ["loss"], float), ("end", 2)]
  with pytest.raises(errors.NonFiniteLossError, match="non-finite loss at step 1"):
    _fit([step_hooks.NonFiniteGuard()], 1, 3, loss_scale=float("nan"))


class _Seen(step_hooks.StepHook):
  """Records the logs each step hands it; ``reads_logs`` as asked."""

  def __init__(self, reads_logs):
    self.reads_logs = reads_logs
    self.logs = []

  def on_step(self, model, step, logs):
    self.logs.append(dict(logs))


def test_batch_driver_reads_no_logs_for_hooks_that_read_none():
  quiet = _Seen(reads_logs=False)
  _fit([step_hooks.BatchDriver([quiet])], 1, 2)
  assert quiet.logs == [{}, {}]
  quiet, reader = _Seen(reads_logs=False), _Seen(reads_logs=True)
  _fit([step_hooks.BatchDriver([quiet, reader])], 1, 2)
  assert [sorted(logs) for logs in quiet.logs] == [["loss"], ["loss"]] == [
      sorted(logs) for logs in reader.logs]


@pytest.mark.parametrize("reads_logs", [False, True])
def test_thread_driver_reads_the_models_logs_only_for_hooks_that_read_them(reads_logs):
  model = CodistillModel(small_net(), 1)
  model.compile(optimizer="sgd", loss="mse")
  data = tf.data.Dataset.from_tensor_slices(
      (np.ones([64, 4], "float32"), np.ones([64, 1], "float32"))).batch(8).repeat()
  hook = _Seen(reads_logs)

  class Slow(keras.callbacks.Callback):  # steps long enough for the driver to poll between
    def on_train_batch_end(self, batch, logs=None):
      time.sleep(0.02)

  model.fit(data, epochs=1, steps_per_epoch=20, verbose=0,
            callbacks=[step_hooks.ThreadDriver([hook], poll_seconds=0.01), Slow()])
  assert hook.logs
  if reads_logs:
    assert all({"loss", "task_loss", "distill_loss", "alpha", "teacher_staleness"} <= set(logs)
               for logs in hook.logs)
  else:
    assert all(logs == {} for logs in hook.logs)
