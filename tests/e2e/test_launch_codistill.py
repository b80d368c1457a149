"""End to end through the console scripts: 2 groups really exchange SavedModels; failures are
loud."""

import glob
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from tf_codistill import layout

from testing_utils import REPO
from testing_utils import Launch
from testing_utils import alive
from testing_utils import launch_args
from testing_utils import tb_scalars

pytestmark = pytest.mark.e2e


def _cli(name):
  return [sys.executable, "-m", f"tf_codistill.bin.{name}"]


def test_two_groups_load_each_others_published_models(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  # A group that runs ahead waits for its peer's first version (a loaded machine can finish
  # one group before the other has published). The teachers are the CTR model's stacked form
  # (the default clone is what the LM and image jobs and the demo run).
  proc = subprocess.run(
      launch_args(model_dir, criteo_dir, "--num_groups=2",
                  bindings=["tfc.Exchange.wait_for_first_teachers_s = 120.0",
                            "tfc.TeacherSpec.student_factory = @models.ctr_teacher"]),
      cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  # Every task parsed the job's one checked configuration file, not the user's gin again.
  job_config = layout.job_config(model_dir)
  assert "wait_for_first_teachers_s = 120.0" in open(job_config).read()
  for group, peer in ((0, 1), (1, 0)):
    group_dir = os.path.join(model_dir, f"group_{group}")
    with open(layout.RunDir(group_dir).results) as f:
      results = json.load(f)
    assert results["steps"] == 240
    assert results["teacher_loads"] >= 1 and results["teacher_rejections"] == 0
    assert results["teacher_factory"] == "ctr_teacher"
    assert results["teacher_steps"][0] >= 40
    log = open(os.path.join(group_dir, "chief_0.log")).read()
    peer_dir = os.path.join(model_dir, "exchange", f"group_{peer}")
    loaded = re.findall(rf"teacher: loaded peer group {peer} step (\d+) from {re.escape(peer_dir)}"
                        rf"/step_\d+", log)
    assert loaded, log[-3000:]
    tags = tb_scalars(os.path.join(group_dir, "tb"))
    for tag in (f"teacher/group_{peer}_step", "teacher_staleness", "distill_loss", "alpha",
                "task_loss", "examples_per_sec"):
      assert tag in tags, sorted(tags)
    # The exchange keeps only the newest two versions; the final weights are always published.
    # (A publish due while the previous one is still being written waits, so on a loaded machine
    # the older version may be a few steps after its multiple of 40.)
    versions = sorted(os.listdir(os.path.join(model_dir, "exchange", f"group_{group}")),
                      key=lambda name: int(name.split("_")[1]))
    assert len(versions) == 2 and versions[-1] == "step_240", versions
    assert 40 <= int(versions[0].split("_")[1]) < 240, versions
    # Distillation was really on after burn-in.
    history = results["history"]
    assert history["alpha"][-1] == 1.0 and history["distill_loss"][-1] > 0

  churn_json = str(tmp_path / "churn.json")
  proc = subprocess.run(
      _cli("churn") + [f"--saved_model={model_dir}/group_0/export",
                       f"--saved_model={model_dir}/group_1/export",
                       f"--data={criteo_dir}/eval-*", f"--json_out={churn_json}",
                       f"--gin_file={REPO}/gin/criteo/common.gin",
                       "--gin_bindings=NUM_BUCKETS = 1000"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert "mean over pairs" in proc.stdout
  summary = json.load(open(churn_json))
  assert summary["examples"] == 4000 and 0 < summary["mean_abs_diff"] < 0.5


def test_a_failing_group_fails_the_launcher_with_its_log(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  proc = subprocess.run(launch_args(model_dir, criteo_dir, "--num_groups=2",
                                    train="no-such-file-*"),
                        cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  # A configuration error (exit status 2) is not retried; the group's own one-line error is shown.
  assert re.search(r"group \d chief:0 stopped on a configuration error \(exit status 2\), not "
                   r"restarted; log .*group_\d/chief_0.log", proc.stderr)
  assert "tfc.Data.train_files: no Criteo files match" in proc.stderr
  assert "no-such-file-*" in proc.stderr


def test_ctrl_c_stops_every_group(tmp_path, criteo_dir):
  launch = Launch(launch_args(str(tmp_path / "job"), criteo_dir, "--num_groups=2",
                              bindings=["trainer.train.train_steps = 100000"]))
  launch.wait_for(lambda: len(launch.pids) == 2, 120, "both groups to start")
  launch.wait_for(lambda: glob.glob(f"{tmp_path}/job/group_*/tb"), 120, "training to start")
  launch.proc.send_signal(signal.SIGINT)
  assert launch.wait(timeout=60) == 130, launch.stderr[-2000:]
  assert "interrupted" in launch.stderr
  pids = list(launch.pids.values())
  assert not [pid for pid in pids if alive(pid)], f"group processes {pids} outlived the launcher"
