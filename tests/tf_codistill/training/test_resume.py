"""A group stopped by kill -9 and started again goes on exactly as if it had not stopped: the
same validation curve and the same final weights as an uninterrupted run (tfc.Checkpoints
.resume_input), its progress log one run's; without resume_input it re-reads its first batches."""

import json
import os
import signal
import subprocess
import time

import pytest

import tf_codistill as tfc
from tf_codistill import layout

from testing_utils import train_args

pytestmark = pytest.mark.e2e

STEPS, EPOCH = 160, 20
# 4 steps per execution: tf_keras' own backup records an execution's first step, so a resumed
# run would take steps again (one step per execution: the cluster and suite resume tests).
SETTINGS = ("tfc.Data.batch_size = 64", f"trainer.train.train_steps = {STEPS}",
            f"trainer.train.steps_per_epoch = {EPOCH}", f"tfc.Checkpoints.every_steps = {EPOCH}",
            "trainer.train.eval_steps = 4", "trainer.train.seed = 3",
            "trainer.train.steps_per_execution = 4")


def _command(criteo_dir, model_dir, *bindings):
  return train_args(model_dir, criteo_dir, bindings=SETTINGS + bindings)


def _curve(model_dir):
  path = layout.RunDir(model_dir).progress
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.endswith("\n")]


def _results(model_dir):
  with open(layout.RunDir(model_dir).results) as f:
    return json.load(f), _curve(model_dir)


def _stopped_and_resumed(criteo_dir, model_dir, stop_after_step, *bindings):
  """Runs the group, kills it (SIGKILL) once it has a checkpoint at ``stop_after_step`` or later,
  runs it again."""
  task = subprocess.Popen(_command(criteo_dir, model_dir, *bindings),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while tfc.resume_step(model_dir) < stop_after_step:
    assert task.poll() is None and time.time() < deadline, "the run ended before its stop"
    time.sleep(0.02)
  task.send_signal(signal.SIGKILL)
  task.wait()
  assert not os.path.exists(layout.RunDir(model_dir).results)
  stopped_at = tfc.resume_step(model_dir)
  subprocess.run(_command(criteo_dir, model_dir, *bindings), check=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
  results, curve = _results(model_dir)
  assert results["resumed_from_step"] == stopped_at
  return results, curve


@pytest.fixture(scope="module")
def uninterrupted(criteo_dir, tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp("uninterrupted"))
  subprocess.run(_command(criteo_dir, model_dir), check=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE, timeout=300)
  return (*_results(model_dir), model_dir)


def test_a_killed_run_resumed_equals_the_uninterrupted_run(criteo_dir, tmp_path, uninterrupted):
  results, curve = _stopped_and_resumed(criteo_dir, str(tmp_path / "m"), 3 * EPOCH)
  expected_results, expected_curve, _ = uninterrupted
  assert expected_results["resumed_from_step"] == 0
  assert 3 * EPOCH <= results["resumed_from_step"] < STEPS
  assert results["resumed_from_step"] % EPOCH == 0
  # One line per evaluation, each step once, with the uninterrupted run's losses exactly.
  assert [r["step"] for r in curve] == [r["step"] for r in expected_curve] == list(
      range(EPOCH, STEPS + 1, EPOCH))
  assert [r["val_loss"] for r in curve] == [r["val_loss"] for r in expected_curve]
  assert results["weights_digest"] == expected_results["weights_digest"]
  assert results["val_loss"] == expected_results["val_loss"]
  # Wall time counts on from the step it resumed at.
  times = [r["wall_time_s"] for r in curve]
  assert times == sorted(times)
  assert results["wall_time_s"] >= times[-1] * 0.5


def test_without_resume_input_the_resumed_run_reads_its_first_batches_again(
    criteo_dir, tmp_path, uninterrupted):
  results, curve = _stopped_and_resumed(criteo_dir, str(tmp_path / "m"), 3 * EPOCH,
                                        "tfc.Checkpoints.resume_input = False")
  expected_results, expected_curve, _ = uninterrupted
  resumed = results["resumed_from_step"]
  assert resumed >= 3 * EPOCH
  before = [r["val_loss"] for r in curve if r["step"] <= resumed]
  assert before == [r["val_loss"] for r in expected_curve if r["step"] <= resumed]
  assert results["weights_digest"] != expected_results["weights_digest"]


def test_a_finished_run_started_again_resumes_at_its_end(criteo_dir, uninterrupted):
  # Its last checkpoint is kept (as a stopped job's finished groups need): it trains nothing and
  # writes the same results again.
  expected_results, expected_curve, model_dir = uninterrupted
  assert tfc.resume_step(model_dir) == STEPS
  subprocess.run(_command(criteo_dir, model_dir), check=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE, timeout=300)
  results, curve = _results(model_dir)
  assert results["resumed_from_step"] == STEPS and results["steps"] == STEPS
  assert results["weights_digest"] == expected_results["weights_digest"]
  assert curve == expected_curve


def test_a_finished_run_whose_last_epoch_was_cut_short_trains_nothing_when_started_again(
    criteo_dir, tmp_path):
  # 150 steps in epochs of 40: the last epoch ends at step 150 (StepLimit), mid-epoch; started
  # again, the run resumes past it instead of taking a step of a fifth epoch.
  model_dir = str(tmp_path / "m")
  short = ("trainer.train.train_steps = 150", "trainer.train.steps_per_epoch = 40",
           "tfc.Checkpoints.every_steps = 50", "trainer.train.steps_per_execution = 1")
  for _ in range(2):
    subprocess.run(_command(criteo_dir, model_dir, *short), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    if _ == 0:
      first, first_curve = _results(model_dir)
      assert first["steps"] == 150 and tfc.resume_step(model_dir) == 150
  again, curve = _results(model_dir)
  assert again["resumed_from_step"] == 150 and again["steps"] == 150
  assert again["weights_digest"] == first["weights_digest"]
  assert [r["step"] for r in curve] == [r["step"] for r in first_curve] == [40, 80, 120, 150]

