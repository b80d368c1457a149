"""Process faults on real local clusters: kill -9 of a parameter-server worker, of a ps task, of a
chief, of a whole codistillation group, and of a synchronous group's chief or worker, each at a
seeded random step (benchmarks/fault_trials), under the launcher's default fault policy.

The reduced form (one trial of each kind that tests/cluster does not cover, marked ``cluster``)
runs with the other cluster tests; the repeated trials (``soak``, deselected by default) are
``python -m benchmarks.run fault_trials`` (10 trials of each kind), whose summary is the table of
docs/reliability.md.
"""

import os
import signal
import time

import pytest

from benchmarks import fault_trials

from testing_utils import Launch
from testing_utils import alive
from testing_utils import launch_args

TRAIN_STEPS = 240
CHECKPOINT_EVERY = 40


@pytest.fixture(scope="module")
def work(tmp_path_factory):
  work = tmp_path_factory.mktemp("faults")
  fault_trials.ensure_data(str(work / "data"))
  return work


def _check(record):
  shown = {k: v for k, v in record.items() if k != "stderr_tail"}
  # The verdict's parts one by one, so a failure names the part that failed before any long record.
  for part in ("finished", "resumed_correctly", "launcher_restarted"):
    assert record.get(part), (f"{part}={record.get(part)!r}, error={record.get('error')!r}, "
                              f"step_at_kill={record.get('step_at_kill')}, "
                              f"resumed_from_step={record.get('resumed_from_step')}, "
                              f"final_steps={record.get('final_steps')}, "
                              f"exit_code={record.get('exit_code')}", shown)
  assert record["ok"], (shown, record.get("stderr_tail", "")[-3000:])
  assert record["exit_code"] == 0, shown
  # One kill costs one restart, never two.
  assert record["restarts_used"] == 1, (shown, record.get("stderr_tail", "")[-6000:])
  assert record["recovery_s"] is not None and record["recovery_s"] < 600, shown
  if record["kind"] == "worker":
    # Nothing restarts but the worker: the coordinator reschedules its steps; no step is lost.
    assert record["steps_lost"] == 0, shown
  else:
    # The group restarted from its newest checkpoint (every CHECKPOINT_EVERY steps): it lost at
    # most one interval and the steps in flight, and did not start over.
    assert 0 <= record["steps_lost"] <= CHECKPOINT_EVERY + 20, shown
    # (A retried parameter-server step may count twice: checkpoints sit at k*40, maybe +1 or 2.)
    assert record["resumed_from_step"] % CHECKPOINT_EVERY <= 2, shown
    if record["step_at_kill"] >= CHECKPOINT_EVERY + 20:
      assert record["resumed_from_step"] > 0, shown
  if record["kind"] == "group":
    assert record["final_steps"] == {"0": TRAIN_STEPS, "1": TRAIN_STEPS} or all(
        TRAIN_STEPS <= s <= TRAIN_STEPS + 2 for s in record["final_steps"].values()), shown


# In CI: the kinds tests/cluster/test_clusters.py does not already kill (it kills a
# parameter-server worker, parameter-server and one-device chiefs, and a sync worker; a sync chief
# with --soak); the repeated trials below cover all six.
@pytest.mark.cluster
@pytest.mark.parametrize("kind", ["ps", "group"])
def test_kill_9_at_a_random_step_recovers(work, kind):
  _check(fault_trials.run_trial(kind, seed=0, work_dir=str(work), data_dir=str(work / "data"),
                                train_steps=TRAIN_STEPS, steps_per_epoch=CHECKPOINT_EVERY))


@pytest.mark.soak
@pytest.mark.parametrize("kind", fault_trials.KINDS)
@pytest.mark.parametrize("seed", range(1, 4))
def test_repeated_kill_9_trials_recover(work, kind, seed):
  _check(fault_trials.run_trial(kind, seed=seed, work_dir=str(work), data_dir=str(work / "data"),
                                train_steps=TRAIN_STEPS, steps_per_epoch=CHECKPOINT_EVERY))


@pytest.mark.cluster
def test_a_launcher_killed_outright_takes_every_task_with_it(tmp_path, criteo_dir):
  # kill -9 leaves the launcher no time to stop its tasks: the kernel must (parent-death
  # signal), or the ps task would serve forever and the workers would wait on it.
  launch = Launch(launch_args(str(tmp_path / "job"), criteo_dir, "--num_groups=1",
                              "--strategy=parameter_server", "--workers_per_group=1",
                              "--ps_per_group=1", gin="baseline.gin",
                              bindings=["trainer.train.train_steps = 100000"]))
  tasks = {(0, "chief", 0), (0, "worker", 0), (0, "ps", 0)}
  launch.wait_for(lambda: set(launch.pids) == tasks, 120, "every task's start")
  pids = dict(launch.pids)
  time.sleep(5)  # the tasks are past their start-up, serving
  assert all(alive(pid) for pid in pids.values()), pids
  launch.proc.kill()
  deadline = time.time() + 30
  while time.time() < deadline and any(alive(pid) for pid in pids.values()):
    time.sleep(0.2)
  survivors = [task for task, pid in pids.items() if alive(pid)]
  for task in survivors:  # no orphan outlives a failed test either
    os.kill(pids[task], signal.SIGKILL)
  assert not survivors, pids
