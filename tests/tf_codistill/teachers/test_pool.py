"""Teacher pool: finds peers' newest complete versions, loads them off-thread, refuses corrupt
ones (signature, NaN, links: tests/reliability/test_teacher_trust.py)."""

import logging
import os
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill import step_hooks
from tf_codistill.exchange import directory as exchange
from tf_codistill.teachers import pool as teachers
from tf_codistill.teachers.spec import TeacherSpec
from tf_codistill.training.model import CodistillModel
from tf_codistill.training.model import clone_architecture

from testing_utils import activate_all
from testing_utils import normalized_net
from testing_utils import run_ps_coordinator
from testing_utils import small_net
from testing_utils import student_and_pool

SPEC = tf.TensorSpec([None, 4], tf.float32)


def test_peer_without_versions_gives_no_teacher_then_its_publish_is_loaded(tmp_path):
  model, pool = student_and_pool(tmp_path)
  assert pool.poll_once() == 0 and activate_all(model, pool) == []
  peer = small_net(seed=7)
  exchange.publish(peer, str(tmp_path), 1, 50, SPEC)
  assert pool.poll_once() == 1
  activate_all(model, pool)
  assert model.teacher_steps.numpy().tolist() == [50]
  for a, b in zip(model.active_teacher(0).get_weights(), peer.get_weights()):
    np.testing.assert_array_equal(a, b)
  assert pool.poll_once() == 0  # nothing newer


def _assert_teacher_holds(model, net):
  """The active teacher holds ``net``'s weights (as its variables' dtype keeps them)."""
  for held, value in zip(model.active_teacher(0).weights, net.get_weights()):
    np.testing.assert_array_equal(held.numpy(), tf.cast(value, held.dtype).numpy())


# bfloat16 teachers are restored by key on the task that holds them (restoring.py), float32 ones
# by load_weights: a bad version is refused by both.
@pytest.mark.parametrize("policy", [None, "bfloat16"])
def test_newest_corrupt_version_is_skipped_with_a_warning_naming_it(tmp_path, caplog, policy):
  model, pool = student_and_pool(tmp_path, teacher_policy=policy)
  good = small_net(seed=3)
  exchange.publish(good, str(tmp_path), 1, 10, SPEC, keep_last=5)
  bad = exchange.publish(small_net(seed=4), str(tmp_path), 1, 20, SPEC, keep_last=5)
  data = os.path.join(bad, "variables", "variables.data-00000-of-00001")
  with open(data, "r+b") as f:
    f.truncate(8)
  with caplog.at_level(logging.WARNING):
    assert pool.poll_once() == 1
  assert bad in caplog.text and "keeping the previous teacher" in caplog.text
  activate_all(model, pool)
  assert model.teacher_steps.numpy().tolist() == [10]
  _assert_teacher_holds(model, good)
  assert pool.rejections == 1


@pytest.mark.parametrize("policy", [None, "bfloat16"])
def test_same_size_garbage_in_variables_is_refused_and_previous_teacher_kept(tmp_path, caplog,
                                                                              policy):
  model, pool = student_and_pool(tmp_path, teacher_policy=policy)
  good = small_net(seed=3)
  exchange.publish(good, str(tmp_path), 1, 10, SPEC, keep_last=5)
  pool.poll_once()
  activate_all(model, pool)
  bad = exchange.publish(small_net(seed=4), str(tmp_path), 1, 20, SPEC, keep_last=5)
  index = os.path.join(bad, "variables", "variables.index")
  size = os.path.getsize(index)
  with open(index, "wb") as f:  # Same size, so the marker check passes; restore must fail.
    f.write(b"\0" * size)
  with caplog.at_level(logging.WARNING):
    assert pool.poll_once() == 0
  assert bad in caplog.text
  activate_all(model, pool)
  assert model.teacher_steps.numpy().tolist() == [10]
  _assert_teacher_holds(model, good)


@pytest.mark.parametrize("policy", [None, "bfloat16"])
def test_a_version_of_another_width_with_the_same_signature_is_refused(tmp_path, caplog, policy):
  model, pool = student_and_pool(tmp_path, teacher_policy=policy)
  good = small_net(seed=3)
  exchange.publish(good, str(tmp_path), 1, 10, SPEC, keep_last=5)
  wider = exchange.publish(small_net(seed=4, hidden=16), str(tmp_path), 1, 20, SPEC, keep_last=5)
  with caplog.at_level(logging.WARNING):
    assert pool.poll_once() == 1
  assert f"{wider}: cannot restore variables" in caplog.text
  activate_all(model, pool)
  assert model.teacher_steps.numpy().tolist() == [10]
  _assert_teacher_holds(model, good)


def test_a_bfloat16_teacher_of_a_student_with_an_integer_weight_is_loaded(tmp_path):
  # Normalization keeps an int64 count beside its float statistics: read in its own dtype.
  peer = normalized_net(np.arange(12, dtype=np.float32).reshape(3, 4))
  exchange.publish(peer, str(tmp_path), 1, 10, SPEC)
  student = normalized_net(np.ones([2, 4], np.float32))
  model = CodistillModel(student, 1,
                         teachers=TeacherSpec(
                             factory=lambda: clone_architecture(student, "bfloat16")))
  model(tf.zeros([1, 4]))
  pool = teachers.TeacherPool(str(tmp_path), [1], model, SPEC, [None, 1])
  assert pool.poll_once() == 1 and pool.rejections == 0
  activate_all(model, pool)
  assert tf.int64 in [w.dtype for w in model.active_teacher(0).weights]
  _assert_teacher_holds(model, peer)


@pytest.mark.parametrize("policy, tolerance", [(None, 0.0), ("bfloat16", 0.02), ("int8", 0.02)])
def test_the_ctr_models_stacked_teacher_is_loaded_in_each_precision(tmp_path, policy, tolerance):
  from tf_codistill.models import ctr
  from tf_codistill.teachers import quantization
  make = lambda seed: ctr.ctr_model(num_buckets=30, embedding_dim=4, hidden_units=(8,), seed=seed)
  spec = {"dense": tf.TensorSpec([None, 13], tf.float32),
          "categorical": tf.TensorSpec([None, 26], tf.int64)}
  x = {"dense": tf.random.stateless_normal([6, 13], [1, 2]),
       "categorical": tf.random.stateless_uniform([6, 26], [3, 4], 0, 30, tf.int64)}
  peer = make(seed=5)
  exchange.publish(peer, str(tmp_path), 1, 20, spec)
  student = make(seed=0)
  model = CodistillModel(student, 1,
                         teachers=TeacherSpec(
                             factory=lambda: ctr.ctr_teacher(student, dtype_policy=policy)))
  model(x)
  pool = teachers.TeacherPool(str(tmp_path), [1], model, spec, [None, 1])
  assert pool.poll_once() == 1 and pool.rejections == 0
  activate_all(model, pool)
  teacher = model.active_teacher(0)
  assert quantization.is_quantized(teacher) == (policy == "int8")
  np.testing.assert_allclose(tf.cast(teacher(x), tf.float32), peer(x), atol=tolerance)
  if policy is None:
    for back, want in zip(quantization.float_weights(teacher), peer.get_weights()):
      np.testing.assert_array_equal(back, want)


def test_three_groups_average_over_both_peers(tmp_path):
  model, pool = student_and_pool(tmp_path, peers=(0, 2))
  peers = {0: small_net(seed=11), 2: small_net(seed=12)}
  for group, net in peers.items():
    exchange.publish(net, str(tmp_path), group, 5, SPEC)
  assert pool.poll_once() == 2
  activate_all(model, pool)
  x = tf.random.normal([6, 4])
  expected = (tf.sigmoid(peers[0](x)) + tf.sigmoid(peers[2](x))) / 2
  np.testing.assert_allclose(model.teacher_target(x).numpy(), expected.numpy(), rtol=1e-5)


class _PeerPublishes(keras.callbacks.Callback):
  """Plays the peer: publishes a new version at one batch, then records when it is swapped in."""

  def __init__(self, exchange_dir, peer, at_batch):
    super().__init__()
    self.exchange_dir, self.peer, self.at_batch = exchange_dir, peer, at_batch
    self.published_at = None
    self.steps_after_publish = []

  def on_train_batch_end(self, batch, logs=None):
    if batch == self.at_batch:
      exchange.publish(self.peer, self.exchange_dir, 1, 200, SPEC)
      self.published_at = batch
    if self.published_at is not None:
      self.steps_after_publish.append(
          (batch, int(self.model.teacher_steps.numpy()[0]),
           float(self.model.teacher_staleness().numpy())))
    time.sleep(0.01)


def test_refresh_picks_up_newer_version_while_training_continues(tmp_path):
  peer = small_net(seed=21)
  exchange.publish(peer, str(tmp_path), 1, 100, SPEC)
  model, pool = student_and_pool(tmp_path)
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  refresh = teachers.TeacherRefresh(pool)
  player = _PeerPublishes(str(tmp_path), small_net(seed=22), at_batch=20)
  x = np.random.default_rng(0).normal(size=(200 * 8, 4)).astype("float32")
  y = (x[:, :1] > 0).astype("float32")
  data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
  model.fit(data, epochs=1, verbose=0, callbacks=[step_hooks.BatchDriver([refresh]), player])
  assert model.teacher_steps.numpy().tolist() == [200]
  assert refresh.swaps == 2 and refresh.loads_by_group == {1: 2}
  # Each swap records its version's off-thread load, which ends before the swap does.
  assert len(refresh.load_seconds) == 2 and all(x > 0 for x in refresh.load_seconds)
  assert all(load <= end - start
             for load, (start, end) in zip(refresh.load_seconds, refresh.windows))
  seen = [teacher_step for _, teacher_step, _ in player.steps_after_publish]
  swap_index = seen.index(200)
  assert swap_index >= 1, "training must go on while the new version is loaded"
  # Staleness = own step - peer step: after the swap at own step s it reads s - 200.
  batch, _, staleness = player.steps_after_publish[swap_index]
  assert staleness == pytest.approx((batch + 1) - 200)
  assert pool._thread is None  # stopped at the end of training


def test_a_stopped_pool_polls_again_when_started_again(tmp_path):
  # A model that fits again starts its refresh's pool again.
  model, pool = student_and_pool(tmp_path)
  pool.poll_interval_s = 0.05
  exchange.publish(small_net(seed=3), str(tmp_path), 1, 10, SPEC)
  for step in (10, 20):
    if step == 20:
      exchange.publish(small_net(seed=4), str(tmp_path), 1, 20, SPEC)
    pool.start()
    deadline = time.monotonic() + 30
    while pool.loads < step // 10 and time.monotonic() < deadline:
      time.sleep(0.05)
    pool.stop()
    activate_all(model, pool)
    assert model.teacher_steps.numpy().tolist() == [step]


def _nice() -> int:
  return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _renice_allowed() -> bool:
  """Whether a thread may lower its own priority here (a sandbox may forbid it)."""
  allowed = []
  def renice():
    try:
      os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _nice() + 1)
      allowed.append(True)
    except OSError:
      pass
  thread = threading.Thread(target=renice)
  thread.start()
  thread.join()
  return bool(allowed)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _renice_allowed(),
                    reason="per-thread nice values are Linux's, and this sandbox forbids them")
@pytest.mark.parametrize("loader_nice", [0, 10, 19])
def test_the_loading_thread_runs_at_loader_nice_and_the_caller_keeps_its_priority(
    tmp_path, loader_nice):
  model = CodistillModel(small_net(), 1)
  model(tf.zeros([1, 4]))
  pool = teachers.TeacherPool(str(tmp_path), [1], model, SPEC, [None, 1], poll_interval_s=0.05,
                              loader_nice=loader_nice)
  exchange.publish(small_net(seed=3), str(tmp_path), 1, 10, SPEC)
  seen = []
  load = pool._load
  pool._load = lambda *args: seen.append(_nice()) or load(*args)
  mine = _nice()
  pool.start()
  try:
    assert pool.wait_until_loaded(60) == []
  finally:
    pool.stop()
  assert seen == [min(19, mine + loader_nice)] and _nice() == mine
  activate_all(model, pool)
  assert model.teacher_steps.numpy().tolist() == [10]


def test_pool_refuses_a_loader_nice_out_of_range(tmp_path):
  model = CodistillModel(small_net(), 1)
  for bad in (-1, 20):
    with pytest.raises(ValueError, match=f"loader_nice={bad} must be in"):
      teachers.TeacherPool(str(tmp_path), [1], model, SPEC, [None, 1], loader_nice=bad)


def test_a_wait_for_loaded_teachers_ends_when_the_pool_thread_loads_them_or_times_out(tmp_path):
  model, pool = student_and_pool(tmp_path, peers=(1, 2))
  start = time.monotonic()
  assert pool.wait_until_loaded(0.3) == [1, 2] and time.monotonic() - start >= 0.3
  exchange.publish(small_net(seed=5), str(tmp_path), 2, 40, SPEC)
  late = threading.Timer(0.5, exchange.publish, (small_net(seed=7), str(tmp_path), 1, 50, SPEC))
  pool.start()
  late.start()
  try:
    assert pool.wait_until_loaded(60) == []
  finally:
    late.join()
    pool.stop()
  # When the wait ends, every loaded version is there to be activated.
  assert sorted(u.step for u in activate_all(model, pool)) == [40, 50]


def test_the_loader_writes_no_copy_while_it_becomes_the_active_one(tmp_path):
  model, pool = student_and_pool(tmp_path)
  staged, newer = small_net(seed=3), small_net(seed=4)
  exchange.publish(staged, str(tmp_path), 1, 40, SPEC, keep_last=5)
  assert pool.poll_once() == 1  # step 40 waits in the inactive copy
  exchange.publish(newer, str(tmp_path), 1, 50, SPEC, keep_last=5)
  loader = threading.Thread(target=pool.poll_once)

  def activate(update):
    loader.start()  # the loader looks for a copy to load step 50 into meanwhile
    time.sleep(0.5)
    assert loader.is_alive()  # it waits: the pending copy is not yet the active one
    model.activate_teacher(update.index, update.step)
  assert [u.step for u in pool.activate_updates(activate)] == [40]
  loader.join()
  _assert_teacher_holds(model, staged)  # untouched by the load of step 50
  activate_all(model, pool)
  assert model.teacher_steps.numpy().tolist() == [50]
  _assert_teacher_holds(model, newer)


def test_a_version_unreadable_for_a_moment_is_read_at_the_next_poll_not_refused(tmp_path):
  # A cloud filesystem's 503 or rate limit cannot be made here; the pool's load raises it once.
  model, pool = student_and_pool(tmp_path)
  exchange.publish(small_net(seed=3), str(tmp_path), 1, 40, SPEC)
  load, calls = pool._load, []

  def busy_once(index, version):
    calls.append(version.step)
    if len(calls) == 1:
      raise tf.errors.UnavailableError(None, None, "503 Service Unavailable")
    return load(index, version)
  pool._load = busy_once
  assert pool.poll_once() == 0 and pool.rejections == 0
  assert pool.poll_once() == 1 and calls == [40, 40]


def test_a_peer_whose_versions_break_the_loader_leaves_the_other_peers_loading(tmp_path, caplog):
  model, pool = student_and_pool(tmp_path, peers=(1, 2))
  exchange.publish(small_net(seed=3), str(tmp_path), 1, 40, SPEC)
  exchange.publish(small_net(seed=5), str(tmp_path), 2, 40, SPEC)
  load = pool._load

  def broken_for_group_1(index, version):
    if version.group == 1:
      raise RuntimeError("a bug")
    return load(index, version)
  pool._load = broken_for_group_1
  with caplog.at_level(logging.ERROR):
    assert pool.poll_once() == 1
  assert "unexpected error loading peer group 1" in caplog.text
  assert [u.index for u in activate_all(model, pool)] == [1]


def test_pool_refuses_wrong_number_of_peers(tmp_path):
  model = CodistillModel(small_net(), 1)
  with pytest.raises(ValueError, match="2 peers for a model with 1 teachers"):
    teachers.TeacherPool(str(tmp_path), [0, 2], model, SPEC, [None, 1])


# A parameter-server group's coordinator (run in its own process: connecting to a cluster changes
# the process's eager context for good) loads three teacher versions and reports the functions
# each load added to its context, and whether the teacher holds the last version.
_PS_COORDINATOR = r"""
import numpy as np
from tensorflow.python.eager import context
from testing_utils import activate_all, small_net
from tf_codistill.exchange import config as exchange_config
from tf_codistill.training import codistill_hooks
from tf_codistill.exchange import directory as exchange
from tf_codistill.teachers import quantization
from tf_codistill.teachers import restoring
from tf_codistill.teachers import pool as teachers
from tf_codistill.errors import ConfigurationError
from tf_codistill.training.model import CodistillModel, clone_architecture
from tf_codistill.teachers.spec import TeacherSpec

exchange_dir = args[0]
with strategy.scope():
  model = CodistillModel(small_net(), 1)
  model(tf.zeros([1, 4]))
spec = tf.TensorSpec([None, 4], tf.float32)
pool = teachers.TeacherPool(exchange_dir, [1], model, spec, [None, 1])
added = []
for step in (10, 20, 30):
  peer = small_net(seed=step)
  exchange.publish(peer, exchange_dir, 1, step, spec, keep_last=5)
  before = set(context.context().list_function_names())
  assert pool.poll_once() == 1, pool.rejections
  activate_all(model, pool)
  added.append(sorted(set(context.context().list_function_names()) - before))
# A version with a NaN weight is refused (checked on the ps) and the last good teacher stays.
bad = small_net(seed=40)
bad.set_weights([np.where(np.arange(w.size).reshape(w.shape) == 0, np.nan, w)
                 for w in bad.get_weights()])
exchange.publish(bad, exchange_dir, 1, 40, spec, keep_last=5)
refused = pool.poll_once() == 0 and pool.rejections == 1
teacher = model.active_teacher(0)
# A wait for the first teachers cannot hold a parameter-server group's steps: refused.
try:
  codistill_hooks.exchange_hooks(
      model, exchange_config.Exchange(exchange_dir, 0, wait_for_first_teachers_s=5.0), spec)
  wait_refused = ""
except ConfigurationError as e:
  wait_refused = str(e)
same = all(np.array_equal(a, b) for a, b in zip(teacher.get_weights(), peer.get_weights()))
devices = sorted({v.device for v in teacher.weights})
# A bfloat16 teacher is restored by key on the ps that holds it (restoring.py): the newest good
# version (the NaN one refused), then a newer one with no new function. Where the pool's reads
# ran is recorded.
reads = []
read_weights = restoring.read_weights
def recorded_read(prefix, model):
  values = read_weights(prefix, model)
  reads.append(sorted({t.device for t in values}))
  return values
restoring.read_weights = recorded_read
with strategy.scope():
  student16 = small_net()
  model16 = CodistillModel(student16, 1,
                           teachers=TeacherSpec(
                               factory=lambda: clone_architecture(student16, "bfloat16")))
  model16(tf.zeros([1, 4]))
pool16 = teachers.TeacherPool(exchange_dir, [1], model16, spec, [None, 1])
loaded16 = [pool16.poll_once(), pool16.rejections]
activate_all(model16, pool16)
newest = small_net(seed=50)
exchange.publish(newest, exchange_dir, 1, 50, spec, keep_last=5)
before = set(context.context().list_function_names())
loaded16 += [pool16.poll_once(), pool16.rejections]
added16 = sorted(set(context.context().list_function_names()) - before)
activate_all(model16, pool16)
teacher16 = model16.active_teacher(0)
same16 = all(np.array_equal(v.numpy(), tf.cast(w, tf.bfloat16).numpy())
             for v, w in zip(teacher16.weights, newest.get_weights()))
reads16 = list(reads)
# An int8 teacher's codes are computed by numpy in the coordinator: its values are read there.
with strategy.scope():
  student8 = small_net()
  model8 = CodistillModel(student8, 1, teachers=TeacherSpec(
      factory=lambda: quantization.int8_copy(student8)))
  model8(tf.zeros([1, 4]))
pool8 = teachers.TeacherPool(exchange_dir, [1], model8, spec, [None, 1])
loaded8 = pool8.poll_once()
activate_all(model8, pool8)
reads8 = reads[len(reads16):]
close8 = all(np.allclose(a, b, atol=0.02) for a, b in
             zip(quantization.float_weights(model8.active_teacher(0)), newest.get_weights()))
# The CTR model's stacked int8 form (column scales folded into the first kernel) on the ps.
from tf_codistill.models import ctr
ctr_spec = {"dense": tf.TensorSpec([None, 13], tf.float32),
            "categorical": tf.TensorSpec([None, 26], tf.int64)}
ctr_x = {"dense": tf.random.stateless_normal([6, 13], [1, 2]),
         "categorical": tf.random.stateless_uniform([6, 26], [3, 4], 0, 30, tf.int64)}
make_ctr = lambda seed: ctr.ctr_model(num_buckets=30, embedding_dim=4, hidden_units=(8,),
                                      seed=seed)
ctr_peer = make_ctr(5)
exchange.publish(ctr_peer, exchange_dir + "/ctr", 1, 20, ctr_spec)
with strategy.scope():
  ctr_student = make_ctr(0)
  ctr_model = CodistillModel(ctr_student, 1,
                             teachers=TeacherSpec(
                                 factory=lambda: ctr.ctr_teacher(ctr_student, "int8")))
  ctr_model(ctr_x)
ctr_pool = teachers.TeacherPool(exchange_dir + "/ctr", [1], ctr_model, ctr_spec, [None, 1])
loaded_ctr8 = ctr_pool.poll_once()
activate_all(ctr_model, ctr_pool)
ctr_teacher = ctr_model.active_teacher(0)
ctr8_gap = float(np.abs(tf.cast(ctr_teacher(ctr_x), tf.float32).numpy() - ctr_peer(ctr_x)).max())
ctr8_devices = sorted({v.device for v in ctr_teacher.weights})
# Remote teacher variables: the copy choice stays one Case op (lowered, the unused copy's dead
# ops would pass between the worker and the ps every step).
graph = tf.function(model.teacher_target).get_concrete_function(spec).graph
lowering = [op.get_attr("_lower_using_switch_merge") for op in graph.get_operations()
            if op.type in ("Case", "StatelessCase")]
print(json.dumps({"added": added, "same": same, "devices": devices, "refused": refused,
                  "remote": model.teachers_are_remote(), "case_lowering": lowering,
                  "wait_refused": wait_refused, "loaded16": loaded16, "added16": added16,
                  "same16": same16, "devices16": sorted({v.device for v in teacher16.weights}),
                  "io_device": restoring.host_cpu(teacher16), "reads16": reads16,
                  "loaded8": loaded8, "reads8": reads8, "close8": close8,
                  "loaded_ctr8": loaded_ctr8, "ctr8_gap": ctr8_gap,
                  "ctr8_devices": ctr8_devices}))
"""


@pytest.mark.cluster
def test_teacher_loads_on_parameter_servers_trace_no_new_functions(tmp_path):
  """Under ParameterServerStrategy the teachers live on the ps; loading a version restores into
  them (a bfloat16 teacher: read by key and cast on the ps), with no function traced per load (a
  parameter server keeps every function it is sent, for good), a version with a NaN weight is
  refused, and the step keeps the copy choice as one Case op; a wait for the first teachers is
  refused there. An int8 teacher (a clone, and the CTR model's stacked form) loads there too."""
  report = run_ps_coordinator(_PS_COORDINATOR, tmp_path)
  assert report["devices"] == ["/job:ps/replica:0/task:0/device:CPU:0"]
  assert report["same"]
  assert report["added"][1:] == [[], []], report["added"]  # the first load makes its kernels
  assert report["refused"]
  assert report["remote"] and report["case_lowering"] == [False], report
  assert "wait_for_first_teachers_s cannot hold a ParameterServerStrategy" in report["wait_refused"]
  ps_cpu = "/job:ps/replica:0/task:0/device:CPU:0"
  assert report["loaded16"] == [1, 1, 1, 1], report["loaded16"]  # step 30 (40 refused), then 50
  assert report["added16"] == [] and report["same16"]
  assert report["devices16"] == [ps_cpu] and report["io_device"] == ps_cpu
  # Versions 40 (read, then refused for its NaN), 30 and 50.
  assert report["reads16"] == [[ps_cpu]] * 3, report["reads16"]
  assert report["loaded8"] == 1 and report["close8"]
  assert report["reads8"] == [["/job:chief/replica:0/task:0/device:CPU:0"]], report["reads8"]
  # The stacked int8 CTR teacher: held on the ps, predicting like its peer.
  assert report["loaded_ctr8"] == 1 and report["ctr8_devices"] == [ps_cpu], report
  assert report["ctr8_gap"] < 0.02, report["ctr8_gap"]


def test_finiteness_check_names_every_variable_with_a_bad_value_in_any_shard():
  good = tf.Variable(np.ones([3, 2], np.float32), name="good")
  assert teachers.FinitenessCheck([good, tf.Variable([1, 2], name="ints")])() == []
  for bad in (np.nan, np.inf, -np.inf):
    values = np.ones([3, 2], np.float32)
    values[2, 1] = bad
    var = tf.Variable(values, name="bad")
    assert teachers.FinitenessCheck([good, var])() == [var.name]
  from tensorflow.python.distribute import sharded_variable  # what a partitioned ps variable is
  shards = [tf.Variable(np.ones([2, 2], np.float32)), tf.Variable([[1.0, np.nan]])]
  assert teachers.FinitenessCheck([sharded_variable.ShardedVariable(shards)])()
  assert not teachers.FinitenessCheck([sharded_variable.ShardedVariable(shards[:1])])()
  # Values assigned later are checked: the function reads the variables at each call.
  check = teachers.FinitenessCheck([good])
  good.assign(tf.fill([3, 2], np.nan))
  assert check() == [good.name]


