"""`python -m benchmarks.run quick` end to end: every arm trained or computed, recorded."""

import json
import math
import os
import subprocess
import sys

import pytest

from testing_utils import REPO

pytestmark = pytest.mark.e2e


def test_quick_suite_writes_every_arm_goals_report_and_plots(tmp_path):
  results, work = tmp_path / "results", tmp_path / "work"
  command = [sys.executable, "-m", "benchmarks.run", "quick", f"--results_dir={results}",
             f"--work_dir={work}", "--allow_load", "--settle_s=0"]  # the tests load the machine
  proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
  assert proc.returncode == 0, proc.stderr[-4000:]
  with open(results / "quick" / "summary.json") as f:
    summary = json.load(f)
  expected = {"baseline", "codistill", "ls_uniform", "ls_unigram", "ensemble", "offline_distill",
              "sync_2x", "async_1w"}
  assert set(summary["arms"]) == expected
  for name, arm in summary["arms"].items():
    assert arm["runs"], name
    for run in arm["runs"]:
      assert math.isfinite(run["final_val_loss"]) and 0 < run["final_val_loss"] < 1.0, (name, run)
  assert len(summary["arms"]["codistill"]["runs"]) == 2 * 2  # 2 seeds x 2 groups
  assert summary["arms"]["baseline"]["churn"]["pairs"]
  assert set(summary["goals"]) == {"codistill_steps_ratio", "churn_reduction",
                                   "codistill_minus_best_label_smoothing_loss"}
  assert summary["goals"]["churn_reduction"] is not None
  # Progress lines, one per run, and the report with its plots.
  assert proc.stdout.count("[quick] ") >= len(expected)
  report = (results / "quick" / "report.md").read_text()
  assert "python -m benchmarks.run quick" in report
  for plot in ("val_loss_vs_steps.png", "val_loss_vs_wall_time.png"):
    assert os.path.getsize(results / "quick" / plot) > 1000
    assert f"]({plot})" in report
  # A second invocation reuses every arm instead of training again.
  again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-4000:]
  assert again.stdout.count("reusing") == len(expected)
  # On a machine without the teacher (another work dir), offline distillation trains it again
  # from the baseline's recorded configuration and records how far its curve is.
  subprocess.run(["rm", "-rf", str(work / "quick" / "runs" / "baseline" / "seed_0"),
                  str(results / "quick" / "runs" / "offline_distill")], check=True)
  third = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
  assert third.returncode == 0, third.stderr[-4000:]
  offline = json.loads((results / "quick" / "runs" / "offline_distill"
                        / "seed_0_group_0.json").read_text())
  assert offline["teacher_run"]["seed"] == 0 and offline["teacher_run"]["trained_now"]
  assert offline["teacher_run"]["steps_compared"] >= 1
