"""Hangs are bounded: a group whose chief's step stops moving (a stopped peer it waits for, a
stopped chief) dumps every task's stacks and is restarted, or fails naming the setting, after
--stall_timeout_s; never a silent hang. (A stopped MultiWorkerMirrored worker needs no watchdog:
TF's coordination service fails its chief after strategies.make_strategy.heartbeat_timeout_s.)"""

import json
import os
import signal
import sys

import pytest

from tf_codistill import layout
from tf_codistill.launch import launcher

from testing_utils import Launch
from testing_utils import launch_args

pytestmark = pytest.mark.cluster
# Long enough that the stop lands mid-training; a heartbeat every half second.
BINDINGS = ["trainer.train.train_steps = 2000", "trainer.train.steps_per_epoch = 200",
            "tfc.Checkpoints.every_steps = 200", "trainer.train.heartbeat_every_s = 0.5"]


def _heartbeat_step(group_dir):
  try:
    with open(layout.RunDir(group_dir).heartbeat) as f:
      return json.load(f)["step"]
  except (OSError, ValueError):
    return None


_LAUNCH = """
import json, sys
import tf_codistill as tfc
model_dir, gin_file, bindings = sys.argv[1].split("=", 1)[1], sys.argv[2], json.loads(sys.argv[3])
tfc.launch_groups(model_dir, 2, gin_files=[gin_file], gin_bindings=bindings, stall_timeout_s=20)
"""


def test_groups_hung_waiting_for_a_stopped_peer_dump_their_stacks_and_restart(tmp_path,
                                                                             criteo_dir):
  # Group 1 is stopped from its start: group 0 waits for its first version (alive, in Python),
  # and neither makes progress. tfc.launch_groups runs what it is given (launch_job and the CLI
  # refuse a configured wait longer than the watchdog's timeout: below).
  model_dir = str(tmp_path / "job")
  args = launch_args(model_dir, criteo_dir, bindings=[
      "tfc.Exchange.wait_for_first_teachers_s = 3600.0", "trainer.train.heartbeat_every_s = 0.5"])
  gin_file = next(a.split("=", 1)[1] for a in args if a.startswith("--gin_file="))
  bindings = [a.split("=", 1)[1] for a in args if a.startswith("--gin_bindings=")]
  launch = Launch([sys.executable, "-c", _LAUNCH, f"--model_dir={model_dir}", gin_file,
                   json.dumps(bindings)])
  launch.wait_for(lambda: (1, "chief", 0) in launch.pids, 60, "group 1's chief")
  os.kill(launch.pids[(1, "chief", 0)], signal.SIGSTOP)
  assert launch.wait(timeout=600) == 0, launch.stderr[-4000:]
  events = launcher.read_events(model_dir)
  stalled = {e["group"]: e for e in events if e["event"] == "stalled"}
  # (Group 0 waits at step 40; its heartbeat, written every half second, may show an earlier one.)
  assert set(stalled) == {0, 1} and stalled[0]["step"] <= 40 and stalled[1]["step"] is None
  assert all(e["seconds"] >= 20 for e in stalled.values())
  restarted = [e for e in events if e["event"] == "restarted"]
  assert sorted(e["group"] for e in restarted) == [0, 1]
  assert {e["status"] for e in restarted} == {launcher.STALLED_STATUS}
  assert "group 0 made no progress for" in launch.stderr
  # Group 0's chief was alive in its wait: its stacks, in the first teachers' wait, are in its log.
  log = open(os.path.join(model_dir, "group_0", "chief_0.log")).read()
  assert "Thread 0x" in log and "wait_until_loaded" in log
  for group in (0, 1):
    with open(layout.RunDir(os.path.join(model_dir, f"group_{group}")).results) as f:
      assert json.load(f)["steps"] == 240


def test_a_configured_wait_the_watchdog_would_take_for_a_hang_is_refused(tmp_path, criteo_dir):
  launch = Launch(launch_args(str(tmp_path / "job"), criteo_dir, "--num_groups=2",
                              "--stall_timeout_s=20",
                              bindings=["tfc.Exchange.wait_for_first_teachers_s = 3600.0"]))
  assert launch.wait(timeout=120) == 2
  assert ("tfc.Exchange.wait_for_first_teachers_s allows a 3600 s wait, not below "
          "--stall_timeout_s=20") in launch.stderr


def test_a_stalled_group_out_of_restarts_fails_naming_the_setting(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  # The watchdog counts the start-up too (until the first heartbeat): 30 s, not less, so a
  # start-up on a busy machine (10+ s measured beside the other tests) is not taken for the stall.
  launch = Launch(launch_args(model_dir, criteo_dir, "--num_groups=1", "--max_restarts=0",
                              "--stall_timeout_s=30", gin="baseline.gin", bindings=BINDINGS))
  group_dir = os.path.join(model_dir, "group_0")
  launch.wait_for(lambda: (_heartbeat_step(group_dir) or 0) >= 1, 300, "the first steps")
  os.kill(launch.pids[(0, "chief", 0)], signal.SIGSTOP)
  assert launch.wait(timeout=300) == 1
  assert ("group 0 chief:0 made no progress for 30 s (no step, evaluation or export; at step"
          in launch.stderr)
  assert "--stall_timeout_s" in launch.stderr
  assert "out of restarts (--max_restarts=0)" in launch.stderr
  assert [e["event"] for e in launcher.read_events(model_dir)][-2:] == ["stalled", "failed"]
