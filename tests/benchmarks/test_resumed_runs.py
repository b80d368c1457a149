"""A suite run stopped by kill -9 (a session's end) and started again goes on from its
checkpoints (bench.Suite.resume_every_steps): the recorded curve is the uninterrupted run's, and
the record lists both parts."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import tf_codistill as tfc

from testing_utils import REPO

pytestmark = pytest.mark.e2e

SUITE = """
bench.Suite.name = 'resumed'
bench.Suite.description = 'One baseline run, stopped and resumed.'
bench.Suite.train_rows = 20000
bench.Suite.eval_rows = 2000
bench.Suite.resume_every_steps = 20
bench.Suite.target_from_arm = 'baseline'
NUM_BUCKETS = 1000
models.ctr_model.embedding_dim = 4
models.ctr_model.hidden_units = (16,)
tfc.Data.batch_size = 64
trainer.train.train_steps = 160
trainer.train.steps_per_epoch = 20
bench.Suite.arms = [@baseline/bench.Arm()]
baseline/bench.Arm.name = 'baseline'
baseline/bench.Arm.gin_files = ['criteo/baseline.gin']
"""


def _command(tmp_path, name):
  return [sys.executable, "-m", "benchmarks.run", f"--suite_file={tmp_path / 'resumed.gin'}",
          f"--results_dir={tmp_path / name / 'results'}", f"--work_dir={tmp_path / name / 'work'}",
          "--allow_load", "--settle_s=0"]  # the tests load the machine


def _recorded(tmp_path, name):
  runs = tmp_path / name / "results" / "resumed" / "runs" / "baseline"
  with open(runs / "seed_0_group_0.json") as f:
    results = json.load(f)
  with open(runs / "seed_0_group_0.jsonl") as f:
    return results, [json.loads(line) for line in f]


def _kill_runner_and_tasks(runner, run_dir):
  os.killpg(runner.pid, signal.SIGKILL)  # the runner and the launcher in it
  runner.wait()
  with open(os.path.join(run_dir, "launch_events.jsonl")) as f:
    pids = [e["pid"] for e in map(json.loads, f) if e["event"] == "launched"]
  for pid in pids:  # the tasks run in sessions of their own
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


def test_a_stopped_suite_run_resumes_and_records_the_uninterrupted_curve(tmp_path):
  (tmp_path / "resumed.gin").write_text(SUITE)
  whole = subprocess.run(_command(tmp_path, "whole"), cwd=REPO, capture_output=True, text=True,
                         timeout=900)
  assert whole.returncode == 0, whole.stderr[-4000:]
  run_dir = str(tmp_path / "stopped" / "work" / "resumed" / "runs" / "baseline" / "seed_0")
  runner = subprocess.Popen(_command(tmp_path, "stopped"), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
  deadline = time.time() + 600
  while tfc.resume_step(os.path.join(run_dir, "group_0")) < 60:  # a checkpoint at 60 or later
    assert runner.poll() is None and time.time() < deadline, "the run ended before its stop"
    time.sleep(0.05)
  _kill_runner_and_tasks(runner, run_dir)
  again = subprocess.run(_command(tmp_path, "stopped"), cwd=REPO, capture_output=True, text=True,
                         timeout=900)
  assert again.returncode == 0, again.stderr[-4000:]
  assert "baseline seed 0: resuming its stopped run from its checkpoints" in again.stdout
  results, curve = _recorded(tmp_path, "stopped")
  expected, expected_curve = _recorded(tmp_path, "whole")
  assert [r["step"] for r in curve] == [r["step"] for r in expected_curve]
  assert [r["val_logloss"] for r in curve] == [r["val_logloss"] for r in expected_curve]
  assert results["weights_digest"] == expected["weights_digest"]
  first, second = results["parts"]
  assert first["from_step"] == {} and second["from_step"]["0"] >= 60
  assert second["from_step"]["0"] == results["resumed_from_step"]
  assert "parts" not in expected and expected["resumed_from_step"] == 0
