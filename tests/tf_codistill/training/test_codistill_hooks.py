"""codistill_hooks: the Exchange configuration, and fit publishing and refreshing by itself."""

import logging
import os
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tf_codistill as tfc
from tf_codistill import step_hooks
from tf_codistill.exchange import directory as exchange
from tf_codistill.training import codistill_hooks

from testing_utils import small_net


def _data(n=512, batch=32, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 4)).astype("float32")
  y = (x[:, :1] > 0).astype("float32")
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()


def _compiled(model):
  model.compile(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def test_exchange_peers_follow_the_teacher_graph_or_are_given(tmp_path):
  assert tfc.Exchange(str(tmp_path), group=2, num_groups=4).peer_groups() == [0, 1, 3]
  ring = tfc.Exchange(str(tmp_path), group=0, num_groups=4, teacher_graph="ring")
  assert ring.peer_groups() == [3] and ring.num_teachers == 1
  assert tfc.Exchange(str(tmp_path), group=1, num_groups=4, peers=[3, 0]).peer_groups() == [0, 3]


@pytest.mark.parametrize("changes, named", [
    (dict(directory=""), "Exchange.directory"),
    (dict(group=2), "group=2 is out of range"),
    (dict(num_groups=1), "num_groups >= 2"),
    (dict(teacher_graph="star"), "teacher_graph='star'"),
    (dict(peers=[0]), "Exchange.peers=[0]"),
    (dict(peers=[5]), "Exchange.peers=[5]"),
    (dict(num_groups=3, peers=[1, 1]), "Exchange.peers=[1, 1] must be distinct other groups"),
    (dict(publish_every_steps=0), "Exchange.publish_every_steps=0"),
    (dict(keep_last=0), "Exchange.keep_last=0"),
    (dict(poll_interval_s=0), "Exchange.poll_interval_s=0"),
    (dict(loader_nice=-1), "Exchange.loader_nice=-1"),
    (dict(loader_nice=20), "Exchange.loader_nice=20"),
    (dict(wait_for_first_teachers_s=-1), "Exchange.wait_for_first_teachers_s=-1"),
    (dict(wait_for_first_teachers_s=float("inf")), "wait_for_first_teachers_s=inf must be"),
])
def test_exchange_refuses_values_that_cannot_work_naming_them(tmp_path, changes, named):
  args = {"directory": str(tmp_path), "group": 0, "num_groups": 2, **changes}
  with pytest.raises(tfc.ConfigurationError, match=named.replace("[", r"\[").replace("(", r"\(")):
    tfc.Exchange(**args)


def test_model_with_an_exchange_has_one_teacher_per_peer(tmp_path):
  model = tfc.CodistillModel(small_net(), exchange=tfc.Exchange(str(tmp_path), 0, num_groups=3))
  assert model.num_teachers == 2
  with pytest.raises(tfc.ConfigurationError, match="num_teachers=1 but the exchange names 2"):
    tfc.CodistillModel(small_net(), 1, exchange=tfc.Exchange(str(tmp_path), 0, num_groups=3))



def test_the_teachers_are_the_models_and_refuse_what_cannot_be_built():
  with pytest.raises(tfc.ConfigurationError, match="TeacherSpec.precision='int4' is not one of"):
    tfc.TeacherSpec(precision="int4")
  with pytest.raises(tfc.ConfigurationError, match="applies to cloned teachers, and "
                     "tfc.TeacherSpec.factory is set"):
    tfc.TeacherSpec(precision="bfloat16", factory=small_net)
  with pytest.raises(TypeError, match="teacher_precision"):
    tfc.Exchange("/tmp/x", 0, teacher_precision="bfloat16")  # pylint: disable=unexpected-keyword-arg
  model = tfc.CodistillModel(small_net(), 1, teachers=tfc.TeacherSpec(precision="bfloat16"))
  assert model.teachers.precision == "bfloat16"
  assert {w.dtype for w in model.all_teachers()[0].weights} == {tf.bfloat16}


def test_the_exchange_gives_its_pool_the_loader_priority(tmp_path):
  model = tfc.CodistillModel(small_net(), 1)
  hooks = codistill_hooks.exchange_hooks(
      model, tfc.Exchange(str(tmp_path), 0, loader_nice=5), tf.TensorSpec([None, 4], tf.float32))
  assert hooks.refresh.pool.loader_nice == 5
  assert tfc.Exchange(str(tmp_path), 0).loader_nice == 0  # the training's priority by default


STRATEGIES = {"default": tf.distribute.get_strategy,
              "one_device": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
              "mirrored": lambda: tf.distribute.MirroredStrategy(["/cpu:0"])}


@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_fit_publishes_and_distills_from_a_published_peer(tmp_path, kind):
  exchange_dir = str(tmp_path / "exchange")
  peer = small_net(seed=7)
  peer(tf.zeros([1, 4]))
  exchange.publish(peer, exchange_dir, 1, 500, tf.TensorSpec([None, 4], tf.float32))
  with STRATEGIES[kind]().scope():
    model = _compiled(tfc.CodistillModel(
        small_net(), distillation=tfc.Distillation(burn_in_steps=5),
        exchange=tfc.Exchange(exchange_dir, 0, publish_every_steps=10, poll_interval_s=0.05)))
  history = model.fit(_data(), epochs=3, steps_per_epoch=20, verbose=0)
  # The peer's version was loaded and used; this group published on its cadence and at the end.
  assert model.teacher_steps.numpy().tolist() == [500]
  assert history.history["distill_loss"][-1] > 0 and history.history["alpha"][-1] == 1.0
  assert history.history["teacher_staleness"][-1] == 60 - 500
  assert model.exchange_hooks.refresh.swaps == 1
  # The final step and one earlier version are kept (keep_last = 2); a publish due while one is
  # in flight waits for the next step after it, so the earlier one is any step from 10 on.
  steps = [v.step for v in exchange.list_versions(exchange_dir, 0)]
  assert steps[0] == 60 and len(steps) == 2 and 10 <= steps[1] < 60, steps
  # The published student holds the student's weights of its step.
  served = tf.saved_model.load(os.path.join(exchange_dir, "group_0", "step_60"))
  x = tf.random.stateless_normal([5, 4], seed=[0, 1])
  np.testing.assert_allclose(served.signatures["serving_default"](inputs=x)["logits"],
                             model.student(x), rtol=1e-5, atol=1e-6)


def _publish_once_group_0_has(exchange_dir, step, peer, peer_step):
  """Publishes ``peer`` as group 1's ``peer_step`` half a second after group 0's version of
  ``step`` appears: a peer that runs behind."""
  deadline = time.monotonic() + 60
  while (time.monotonic() < deadline
         and step not in [v.step for v in exchange.list_versions(exchange_dir, 0)]):
    time.sleep(0.05)
  time.sleep(0.5)
  exchange.publish(peer, exchange_dir, 1, peer_step, tf.TensorSpec([None, 4], tf.float32))


def test_fit_holds_a_group_ahead_of_its_peer_until_the_peer_first_version_is_loaded(tmp_path):
  exchange_dir = str(tmp_path / "exchange")
  peer = small_net(seed=7)
  peer(tf.zeros([1, 4]))
  late_peer = threading.Thread(target=_publish_once_group_0_has, args=(exchange_dir, 10, peer, 10))
  model = _compiled(tfc.CodistillModel(
      small_net(), distillation=tfc.Distillation(burn_in_steps=5),
      exchange=tfc.Exchange(exchange_dir, 0, publish_every_steps=10, poll_interval_s=0.05,
                            wait_for_first_teachers_s=60)))
  late_peer.start()
  try:
    history = model.fit(_data(), epochs=1, steps_per_epoch=20, verbose=0)
  finally:
    late_peer.join()
  wait = model.exchange_hooks.first_wait
  # It waited at step 10 (the later of burn-in and the first publish), after publishing its
  # own step 10 (the peer published only once that appeared), and not until the timeout.
  assert wait.at_step == 10 and 0.4 < wait.waited_seconds < 30, wait.waited_seconds
  assert model.teacher_steps.numpy().tolist() == [10] and wait.windows
  assert model.exchange_hooks.refresh.swaps == 1 and history.history["distill_loss"][-1] > 0
  # A later fit (or a resumed run) whose teachers are loaded already does not wait again.
  model.fit(_data(), epochs=1, steps_per_epoch=5, verbose=0)
  assert model.exchange_hooks.first_wait is not wait
  assert model.exchange_hooks.first_wait.waited_seconds == 0.0
  assert not model.exchange_hooks.first_wait.windows


def test_fit_trains_on_without_teachers_when_the_wait_times_out(tmp_path, caplog):
  model = _compiled(tfc.CodistillModel(small_net(), exchange=tfc.Exchange(
      str(tmp_path), 0, publish_every_steps=5, poll_interval_s=0.05,
      wait_for_first_teachers_s=0.5)))
  with caplog.at_level(logging.WARNING):
    model.fit(_data(), epochs=1, steps_per_epoch=10, verbose=0)
  assert "no version of peer group(s) [1] after waiting" in caplog.text
  wait = model.exchange_hooks.first_wait
  assert wait.at_step == 5 and 0.5 <= wait.waited_seconds < 10
  assert model.teacher_steps.numpy().tolist() == [-1]
  assert int(model.optimizer.iterations.numpy()) == 10  # trained on after the timeout


def test_fit_without_a_dataset_needs_an_input_spec(tmp_path):
  model = _compiled(tfc.CodistillModel(small_net(), exchange=tfc.Exchange(str(tmp_path), 0)))
  x = np.zeros([64, 4], "float32")
  with pytest.raises(tfc.ConfigurationError, match="input spec is unknown"):
    model.fit(x, np.zeros([64, 1], "float32"), epochs=1, verbose=0)
  model(x[:1])  # once called, the spec of that call is used
  model.fit(x, np.zeros([64, 1], "float32"), epochs=1, batch_size=32, verbose=0)
  assert [v.step for v in exchange.list_versions(str(tmp_path), 0)] == [2]


def test_unwritable_exchange_directory_is_a_configuration_error(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  model = _compiled(tfc.CodistillModel(small_net(), exchange=tfc.Exchange(str(blocker), 0)))
  with pytest.raises(tfc.ConfigurationError, match="Exchange.directory: cannot write to"):
    model.fit(_data(), epochs=1, steps_per_epoch=2, verbose=0)


def test_public_names_resolve():
  assert set(tfc.__all__) <= set(dir(tfc))
  for name in tfc.__all__:
    assert getattr(tfc, name) is not None
  with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
    tfc.Trainer  # noqa: B018
  assert codistill_hooks.is_chief(tf.distribute.get_strategy())


class _Steps(step_hooks.StepHook):
  """Records the steps a driver ran it at."""
  reads_logs = False

  def __init__(self):
    self.steps = []

  def on_step(self, model, step, logs):
    self.steps.append(step)


def test_fit_runs_the_callers_hooks_and_the_exchange_through_one_driver(tmp_path, monkeypatch):
  drivers = []
  make = step_hooks.driver_for
  monkeypatch.setattr(step_hooks, "driver_for",
                      lambda strategy, hooks: drivers.append(list(hooks)) or make(strategy, hooks))
  mine = _Steps()
  model = _compiled(tfc.CodistillModel(small_net(), exchange=tfc.Exchange(
      str(tmp_path), 0, publish_every_steps=5, poll_interval_s=0.05)))
  model.fit(_data(), epochs=1, steps_per_epoch=10, verbose=0, hooks=[mine])
  hooks = model.exchange_hooks
  assert len(drivers) == 1  # one driver: the caller's hook first, then the exchange's
  assert drivers[0] == [mine, hooks.refresh, hooks.publisher]
  assert mine.steps == list(range(1, 11))
  stats = hooks.statistics()
  assert stats["publishes"] >= 1 and stats["publish_failures"] == 0
  assert stats["teacher_loads"] == 0 and stats["first_teachers_wait_s"] is None
  assert set(hooks.windows()) == {"refresh", "publish"}


def test_a_non_finite_loss_stops_the_teacher_loads_and_waits_for_the_publish(tmp_path):
  class Stop(step_hooks.StepHook):
    reads_logs = False

    def on_step(self, model, step, logs):
      if step == 6:
        raise tfc.NonFiniteLossError("loss is NaN at step 6", step)

  model = _compiled(tfc.CodistillModel(small_net(), exchange=tfc.Exchange(
      str(tmp_path), 0, publish_every_steps=5, poll_interval_s=0.05)))
  with pytest.raises(tfc.NonFiniteLossError, match="step 6"):
    model.fit(_data(), epochs=1, steps_per_epoch=20, verbose=0, hooks=[Stop()])
  pool = model.exchange_hooks.refresh.pool
  assert pool._stop.is_set() and pool._thread is None  # stopped and joined
  # The publish of step 5 finished before fit returned: its version is complete.
  assert [v.step for v in exchange.list_versions(str(tmp_path), 0)] == [5]
