"""averaging_hooks: groups as real processes over one exchange directory, bit-identical after every
round; H=1 local SGD equals one synchronous group at twice the batch; dead, slow, poisoned and
restarted peers."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import averaging_group
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill import errors
from tf_codistill import step_hooks
from tf_codistill.exchange import averaging
from tf_codistill.optim import outer
from tf_codistill.training import averaging_hooks

SCRIPT = averaging_group.__file__
SHAPES = [(4, 8), (8,), (8, 1), (1,)]


def _start(tmp_path, group, name=None, **flags):
  out = str(tmp_path / f"{name or f'group_{group}'}.json")
  args = [sys.executable, SCRIPT, f"--exchange_dir={tmp_path / 'exchange'}", f"--group={group}",
          f"--out={out}"] + [f"--{k}={v}" for k, v in flags.items()]
  return subprocess.Popen(args, stderr=subprocess.PIPE, text=True), out


def _finish(started, timeout=300):
  results = []
  for process, out in started:
    _, stderr = process.communicate(timeout=timeout)
    assert process.returncode == 0, stderr[-3000:]
    with open(out) as f:
      results.append(dict(json.load(f), stderr=stderr))
  return results


def _run(tmp_path, groups=2, per_group=None, **flags):
  return _finish([_start(tmp_path, g, **{**flags, **(per_group or {}).get(g, {})})
                  for g in range(groups)])


def test_groups_hold_the_same_bits_after_every_round_and_a_replay_agrees(tmp_path):
  a, b = _run(tmp_path, steps=20, every=5, per_group={1: {"strategy": "mirrored"}})
  assert [e["round"] for e in a["log"]] == [1, 2, 3, 4]
  assert [e["digest"] for e in a["log"]] == [e["digest"] for e in b["log"]]
  assert all(e["members"] == [0, 1] and not e["excluded"] for e in a["log"] + b["log"])
  assert a["final_digest"] == b["final_digest"] == a["log"][-1]["digest"]
  # The inner optimizers' (Adam) state stays each group's own.
  assert a["slots_digest"] != b["slots_digest"]
  # Every round again, in numpy, from the stored start and changes.
  directory = str(tmp_path / "exchange")
  state = averaging.read_shared_state(directory, newest_at_most=0)
  theta, momentum = state.parameters, None
  opt = outer.OuterOptimizer("nesterov", 0.7, 0.9)
  for entry in a["log"]:
    changes = [averaging.read_change(directory, g, entry["round"], SHAPES, outer.digest(theta))[0]
               for g in entry["members"]]
    theta, momentum = opt.step(theta, outer.average_in_order(changes), momentum)
    assert outer.digest(theta) == entry["digest"]
  stats = a["statistics"]["averaging_rounds"]
  assert stats["bytes_sent"] == 4 * 4 * (32 + 8 + 8 + 1) == stats["bytes_received"]


def test_h1_local_sgd_equals_one_synchronous_group_at_twice_the_batch(tmp_path):
  steps, batch = 6, 16
  results = _run(tmp_path, steps=steps, every=1, batch=batch, outer="average", inner="sgd")
  start = averaging.read_shared_state(str(tmp_path / "exchange"), newest_at_most=0).parameters
  sync = averaging_group.student(0)
  sync.set_weights(start)
  sync.compile(optimizer=keras.optimizers.SGD(0.1),
               loss=keras.losses.BinaryCrossentropy(from_logits=True))
  (x0, y0), (x1, y1) = averaging_group.rows(0), averaging_group.rows(1)
  for t in range(steps):
    rows = slice(t * batch, (t + 1) * batch)
    sync.train_on_batch(np.concatenate([x0[rows], x1[rows]]),
                        np.concatenate([y0[rows], y1[rows]]))
  averaged = np.load(str(tmp_path / "group_0.json.npz"))
  for i, weight in enumerate(sync.get_weights()):
    np.testing.assert_allclose(averaged[f"arr_{i}"], weight, rtol=1e-5, atol=1e-6)
  assert results[0]["final_digest"] == results[1]["final_digest"]


@pytest.mark.parametrize("encoding", ["bfloat16", "int8"])
def test_lean_changes_keep_the_groups_identical_and_send_fewer_bytes(tmp_path, encoding):
  a, b = _run(tmp_path, steps=10, every=5, encoding=encoding)
  assert [e["digest"] for e in a["log"]] == [e["digest"] for e in b["log"]]
  per_value = {"bfloat16": 2, "int8": 1}[encoding]
  scales = 2 * (4 + 1 + 8 + 1) if encoding == "int8" else 0
  assert a["log"][0]["bytes_sent"] == per_value * (32 + 8 + 8 + 1) + scales


def test_a_dead_peer_is_left_out_after_the_timeout_and_a_restart_rejoins(tmp_path):
  # Group 1 stops after one round (as if killed); group 0 goes on alone after 3 s per round.
  a, b = _run(tmp_path, steps=15, every=5, peer_timeout_s=3,
              per_group={1: {"steps": 5}})
  assert [e["members"] for e in a["log"]] == [[0, 1], [0], [0]]
  assert "no change within 3 s" in a["log"][1]["excluded"]["1"]
  assert a["statistics"]["averaging_rounds"]["rounds_short_of_groups"] == 2
  assert a["log"][0]["digest"] == b["log"][0]["digest"]
  # Group 1 restarted with no checkpoint: it starts from the shared state of round 3 and takes
  # round 4 alone where every group takes it, at step 20 (round r at step r * H), so its last
  # round is the one its peers' is at the same step.
  [again] = _finish([_start(tmp_path, 1, name="again", steps=20, every=5, peer_timeout_s=3)])
  assert "starts at round 3" in again["stderr"]
  assert [(e["round"], e["step"], e["members"]) for e in again["log"]] == [(4, 20, [1])]


def test_a_poisoned_change_is_rejected_naming_its_group_and_round(tmp_path):
  a, b = _run(tmp_path, steps=10, every=5, peer_timeout_s=3, per_group={1: {"poison_round": 2}})
  assert a["log"][0]["members"] == [0, 1]
  assert a["log"][1]["members"] == [0]
  why = a["log"][1]["excluded"]["1"]
  assert "group 1's change for round 2 is rejected: it holds NaN" in why
  assert "group 1's change for round 2 is rejected" in a["stderr"]
  assert np.isfinite(np.load(str(tmp_path / "group_0.json.npz"))["arr_0"]).all()
  assert b["log"][1]["members"] == [0] and b["log"][1]["late"]
  assert b["log"][1]["digest"] == a["log"][1]["digest"]


def test_on_missing_fail_stops_the_round_with_nothing_applied(tmp_path):
  process, _ = _start(tmp_path, 0, steps=10, every=5, peer_timeout_s=2, on_missing="fail")
  _, stderr = process.communicate(timeout=300)
  assert process.returncode != 0
  assert "AveragingError: averaging: round 1 of group 0 was not decided after 2 s" in stderr
  assert "on_missing='fail'" in stderr and "no change from groups [1]" in stderr
  assert averaging.read_decision(str(tmp_path / "exchange"), 1) is None


def test_a_group_killed_mid_training_is_left_out_and_the_others_finish(tmp_path):
  # 12 rounds: a kill that lands a few rounds after round 2 (a loaded machine) still leaves some.
  survivor = _start(tmp_path, 0, steps=60, every=5, peer_timeout_s=3)
  victim, _ = _start(tmp_path, 1, steps=100000, every=5, peer_timeout_s=3)
  directory = str(tmp_path / "exchange")
  deadline = time.monotonic() + 240
  while averaging.read_decision(directory, 2) is None and time.monotonic() < deadline:
    time.sleep(0.05)
  os.kill(victim.pid, signal.SIGKILL)
  victim.wait(60)
  [a] = _finish([survivor])
  members = [e["members"] for e in a["log"]]
  assert members[:2] == [[0, 1], [0, 1]] and members[-1] == [0], members
  assert len(members) == 12 and a["final_digest"] == a["log"][-1]["digest"]


def _in_process(tmp_path, group, agree=None, **settings):
  """A group's AveragingRound in this process, over a 3x2 dense layer (one process per group;
  with ``agree`` standing in for the collective of a MultiWorkerMirrored group)."""
  config = averaging.ParameterAveraging(**{"every_steps": 10, "peer_timeout_s": 0.2,
                                           "poll_interval_s": 0.01, **settings})
  student = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  rounds = averaging_hooks.AveragingRound(config, str(tmp_path / "exchange"), group, 2,
                                          chief=True, agree=agree)
  return rounds, types.SimpleNamespace(student=student)


def _train_alone(rounds, model, steps):
  """Group 0 alone (its peer never publishes): a local step between rounds, each round decided
  without the peer after its timeout."""
  rounds.on_begin(model, 0)
  for step in range(1, steps + 1):
    for variable in model.student.trainable_variables:
      variable.assign_add(np.full(variable.shape, 0.01 * step, np.float32))
    rounds.on_step(model, step, {})


def test_a_group_behind_catches_up_to_the_agreed_round_exactly(tmp_path):
  leader, model = _in_process(tmp_path, 0)
  _train_alone(leader, model, steps=30)
  assert [e["round"] for e in leader.log] == [1, 2, 3]
  digests = {e["round"]: e["digest"] for e in leader.log}
  directory = str(tmp_path / "exchange")
  # Its workers saw rounds up to 3 and up to 2: every worker takes round 2, replayed from the
  # stored changes since the shared states after round 0 are gone.
  for state in ("step_1", "step_2", "step_3"):
    shutil.rmtree(os.path.join(averaging.shared_dir(directory), state))
  behind, model = _in_process(tmp_path, 1, agree=lambda round_: min(round_, 2))
  behind.on_begin(model, 37)
  assert behind.round == 2
  assert outer.digest(behind.anchor) == digests[2]
  # What it read to get there: the shared start and the two rounds' changes, float32 each.
  parameter_bytes = sum(v.numpy().nbytes for v in model.student.trainable_variables)
  assert behind.statistics()["bytes_read_catching_up"] == 3 * parameter_bytes
  assert outer.digest([v.numpy() for v in model.student.trainable_variables]) == digests[2]
  # Round r falls on step r * H in every group: round 2's period began at step 20, so round 3
  # (decided at step 30 without it) is due at once, and its round 4 falls at 40 like its peers'
  # (not at 47, nor at 50 a round behind them).
  assert behind.round_start_step == 20
  behind.on_step(model, 38, {})
  assert [(e["round"], e["late"], e["digest"]) for e in behind.log] == [(3, True, digests[3])]
  assert behind.round_start_step == 30
  # With every worker at round 3, the newest shared state is not needed either.
  ahead, model = _in_process(tmp_path, 1)
  ahead.on_begin(model, 30)
  assert ahead.round == 3 and outer.digest(ahead.anchor) == digests[3]


def _alone_from_fixed_weights(tmp_path, name):
  """Group 0 alone over exchange ``name``, its student at fixed weights, with the model's
  checkpointed ``averaging_position`` (a CodistillModel's)."""
  rounds, model = _in_process(tmp_path / name, 0)
  for i, variable in enumerate(model.student.trainable_variables):
    variable.assign(np.linspace(-1.0, 1.0, variable.shape.num_elements(), dtype=np.float32)
                    .reshape(variable.shape) * (i + 1))
  model.averaging_position = tf.Variable(tf.constant([-1, 0], tf.int64))
  return rounds, model


def _local_steps(rounds, model, first, last, round_at_last=True):
  for step in range(first, last + 1):
    for variable in model.student.trainable_variables:
      variable.assign_add(np.full(variable.shape, 0.01 * step, np.float32))
    if step < last or round_at_last:
      rounds.on_step(model, step, {})


def _resume(tmp_path, name, model, step):
  """A new process (a new AveragingRound over the same exchange) restored from ``model``'s
  checkpointed state at ``step``."""
  rounds, resumed = _alone_from_fixed_weights(tmp_path, name)
  for variable, saved in zip(resumed.student.trainable_variables,
                             model.student.trainable_variables):
    variable.assign(saved)
  resumed.averaging_position.assign(model.averaging_position)
  rounds.on_begin(resumed, step)
  return rounds, resumed


def _digest(model):
  return outer.digest([v.numpy() for v in model.student.trainable_variables])


def test_a_group_resumed_from_a_checkpoint_goes_on_as_if_it_had_not_stopped(tmp_path):
  # H = 10, the peer never publishes (each round decided without it after 0.2 s).
  full, model = _alone_from_fixed_weights(tmp_path, "full")
  full.on_begin(model, 0)
  _local_steps(full, model, 1, 30)
  assert [e["round"] for e in full.log] == [1, 2, 3]
  # Checkpointed at step 25, in round 2's period: the resumed group keeps its 5 local steps
  # (not round 2's parameters) and its round 3 at step 30 is the uninterrupted run's, bit for bit.
  part, model = _alone_from_fixed_weights(tmp_path, "part")
  part.on_begin(model, 0)
  _local_steps(part, model, 1, 25)
  assert model.averaging_position.numpy().tolist() == [2, 20]
  again, resumed = _resume(tmp_path, "part", model, 25)
  assert (again.round, again.round_start_step, _digest(resumed)) == (2, 20, _digest(model))
  _local_steps(again, resumed, 26, 30)
  assert again.log[-1]["round"] == 3 and again.log[-1]["digest"] == full.log[-1]["digest"]
  # Checkpointed at step 20 before that step's round: the round is taken at once on resuming.
  cut, model = _alone_from_fixed_weights(tmp_path, "cut")
  cut.on_begin(model, 0)
  _local_steps(cut, model, 1, 20, round_at_last=False)
  again, resumed = _resume(tmp_path, "cut", model, 20)
  assert again.log[0]["round"] == 2 and again.log[0]["digest"] == full.log[1]["digest"]
  assert resumed.averaging_position.numpy().tolist() == [2, 20]
  # Rounds decided after its checkpoint (the others went on): it takes the newest instead.
  late, model = _alone_from_fixed_weights(tmp_path, "late")
  late.on_begin(model, 0)
  _local_steps(late, model, 1, 25)
  checkpoint = (model.averaging_position.numpy(),
                [v.numpy() for v in model.student.trainable_variables])
  _local_steps(late, model, 26, 30)  # round 3 decided, then the process is lost
  model.averaging_position.assign(checkpoint[0])
  for variable, saved in zip(model.student.trainable_variables, checkpoint[1]):
    variable.assign(saved)
  again, resumed = _resume(tmp_path, "late", model, 25)
  assert again.round == 3 and _digest(resumed) == late.log[-1]["digest"]
  assert again.round_start_step == 30  # round 3's step: its round 4 falls at 40, as its peers'


def test_non_finite_parameters_stop_the_round_before_anything_is_published(tmp_path):
  rounds, model = _in_process(tmp_path, 0)
  rounds.on_begin(model, 0)
  kernel = model.student.trainable_variables[0]
  kernel.assign(np.full(kernel.shape, np.nan, np.float32))
  with pytest.raises(errors.NonFiniteLossError,
                     match="averaging: group 0's parameters are not finite at step 10: its "
                           "change for round 1 is not published"):
    rounds.on_step(model, 10, {})
  assert not averaging.has_change(str(tmp_path / "exchange"), 0, 1)


class _Student(keras.Model):
  """A model with a ``student`` (what AveragingRound averages) trained by ``fit``."""

  def __init__(self):
    super().__init__()
    self.student = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])

  def call(self, inputs):
    return self.student(inputs)


def test_scheduled_rounds_stay_on_the_multiples_of_h_in_an_epoch_resumed_mid_way(tmp_path):
  # A parameter-server group checkpointed at step 25 in round 2's period (H = 10, alone), then
  # resumed by fit in epochs of 10 steps: fit starts epoch 2 over, 5 steps in, and its rounds
  # fall at steps 30, 40 and 50 as the uninterrupted run's would, not at 35 and 45.
  part, model = _alone_from_fixed_weights(tmp_path, "ps")
  part.on_begin(model, 0)
  _local_steps(part, model, 1, 25)
  assert model.averaging_position.numpy().tolist() == [2, 20]
  rounds, _ = _in_process(tmp_path / "ps", 0)
  resumed = _Student()
  resumed.averaging_position = tf.Variable(model.averaging_position.numpy())
  resumed.compile(optimizer="sgd", loss="mse")
  resumed.optimizer.iterations.assign(25)
  for variable, saved in zip(resumed.student.trainable_variables,
                             model.student.trainable_variables):
    variable.assign(saved)
  data = tf.data.Dataset.from_tensor_slices(
      (np.ones([8, 3], "float32"), np.ones([8, 2], "float32"))).batch(4).repeat()
  resumed.fit(data, epochs=5, initial_epoch=2, steps_per_epoch=10, verbose=0,
              callbacks=[averaging_hooks.ScheduledRounds(rounds),
                         step_hooks.StepLimit(50, 10, offset=25 % 10)])
  assert [(e["round"], e["step"]) for e in rounds.log] == [(3, 30), (4, 40), (5, 50)]
