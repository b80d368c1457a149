"""Step hooks and the callbacks that end training: exactly the steps asked for, NaN stops."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from testing_utils import small_net
from tf_codistill import errors
from tf_codistill import step_hooks


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
