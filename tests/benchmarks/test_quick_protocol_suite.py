"""`python -m benchmarks.run quick_protocol`: the pre-registered protocol end to end at
toy size (scaling to B*, tuning, runs pinned two at a time, intervals, churn vs loss, alpha = 0)."""

import json
import subprocess
import sys

import pytest

from benchmarks import machine

from testing_utils import REPO

pytestmark = pytest.mark.e2e


def test_protocol_suite_finds_b_star_tunes_and_reports_goals_with_intervals(tmp_path):
  results, work = tmp_path / "results", tmp_path / "work"
  command = [sys.executable, "-m", "benchmarks.run", "quick_protocol",
             f"--results_dir={results}", f"--work_dir={work}", "--allow_load", "--settle_s=0"]
  proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200)
  assert proc.returncode == 0, proc.stderr[-4000:]
  summary = json.loads((results / "quick_protocol" / "summary.json").read_text())
  record = summary["protocol"]
  scaling = record["scaling"]
  assert set(scaling["batches"]) == {"32", "64"} and scaling["b_star"] == 32
  for batch in scaling["batches"].values():
    assert batch["learning_rate"] in (0.001, 0.003)
    assert batch["grid"][f"{batch['learning_rate']:g}"] == min(batch["grid"].values())
  # Tuned arms pick from the grid; codistillation runs at sync B*'s rate, untuned.
  assert set(record["tuning"]) == {"sync_b"}
  assert summary["arms"]["sync_b"]["runs"][0]["best_val_loss"] is not None
  codistill = summary["arms"]["codistill"]
  assert len(codistill["runs"]) == 4  # 2 seeds x 2 groups, each group on half of the data
  # The target is the lowest minimum of the sync arms' seed-mean curves.
  def mean_curve_min(arm):
    curves = [dict(map(tuple, c)) for c in summary["arms"][arm]["seed_curves"].values()]
    steps = set.intersection(*(set(c) for c in curves))
    return min(sum(c[s] for c in curves) / len(curves) for s in steps)
  assert summary["target_loss"] == pytest.approx(min(map(mean_curve_min, ("sync_b", "sync_2b"))))
  goals, verdicts = summary["goals"], summary["goal_verdicts"]
  for goal in ("codistill_minus_best_sync_loss", "churn_reduction", "churn_reduction_late"):
    assert goals[goal] is not None and len(goals[f"{goal}_interval"]) == 2
    assert goals[f"{goal}_interval"][0] <= goals[goal] <= goals[f"{goal}_interval"][1]
  for goal in ("codistill_steps_ratio", "codistill_minus_best_sync_loss", "churn_reduction"):
    assert verdicts[goal]["met"] in (True, False)
    if goals[goal] is None:
      assert verdicts[goal]["missing"] and not verdicts[goal]["met"]
  # Churn between retrains at every evaluation (prediction history), the pairs' curves recorded.
  assert goals["churn_swing_sync_b"] >= 0
  # Codistillation on the same data (label smoothing arms: the quick suite).
  assert len(summary["arms"]["codistill_same"]["runs"]) == 2  # 1 seed x 2 groups
  assert goals["codistill_same_minus_best_sync_loss"] is not None
  churn = codistill["churn"]
  assert churn["independent"] and len(churn["curves"][0]) == 3  # evaluations at 20, 40, 60
  # alpha = 0 trains exactly as sync B* does (same seed, same data, same rate).
  assert goals["alpha0_max_loss_difference_vs_sync_b"] < 1e-4
  # The teachers' own loss at the step of the version in use was measured (distillation was on).
  assert goals["codistill_teacher_minus_student_loss"] is not None
  assert ("churn_at_matched_loss" in summary
          and "codistill" in summary["churn_at_matched_loss"]["arms"])
  # Every trained run recorded the load before it and runs went two at a time on their own CPU.
  trained = ("sync_b", "sync_2b", "codistill", "codistill_same", "offline_distill",
             "codistill_alpha0")
  assert all(r["load_avg_1m_before"] is not None
             for name in trained for r in summary["arms"][name]["runs"])
  assert {r["cpu_model"] for name in trained
          for r in summary["arms"][name]["runs"]} == {machine.cpu_model()}
  assert "on CPUs 0" in proc.stderr and "on CPUs 1" in proc.stderr
  report = (results / "quick_protocol" / "report.md").read_text()
  assert "## Protocol record" in report and "B\\* = 32" in report
