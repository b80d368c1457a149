"""benchmarks/cluster_step_times.py on real local clusters: a parameter-server group and a
MultiWorkerMirrored group, every arm timed, teachers really refreshed, the goals computed."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import cluster_step_times

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_goals_take_the_parameter_server_ratio_and_the_worst_refresh_loss():
  ratio = lambda median: {"median": median, "interval90": [median - 0.01, median + 0.01]}
  groups = {"parameter_server": {"ratios": {"teacher_vs_no_teacher": ratio(0.95),
                                            "refresh_vs_teacher": ratio(0.99)}},
            "multi_worker_mirrored": {"ratios": {"teacher_vs_no_teacher": ratio(0.90),
                                                 "refresh_vs_teacher": ratio(0.96)}}}
  verdicts = cluster_step_times.goals(groups)
  assert verdicts["teacher_throughput_ratio_parameter_server"]["met"]
  loss = verdicts["refresh_throughput_loss"]
  assert loss["value"] == pytest.approx(0.04) and not loss["met"]
  assert loss["interval90"] == pytest.approx([0.03, 0.05])


@pytest.mark.cluster
def test_both_groups_time_every_arm_and_refresh_their_teacher(tmp_path):
  out = tmp_path / "summary.json"
  env = {**os.environ, "TF_CODISTILL_BENCH_LOCK": str(tmp_path / "lock")}
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.cluster_step_times", "--rounds=1", "--steps=100",
       "--refresh_every_steps=10", "--poll_interval_s=0.2", "--num_buckets=500",
       "--batch_size=32", "--allow_load", "--settle_s=0",
       f"--out={out}", f"--work_dir={tmp_path / 'work'}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads(out.read_text())
  assert set(summary["groups"]) == {"parameter_server", "multi_worker_mirrored"}
  for name, group in summary["groups"].items():
    assert set(group["step_times"]) == set(cluster_step_times.ARMS), name
    # MultiWorkerMirrored: every timed step; parameter servers: the step functions' finishes
    # after the skipped ones (a closure can be retried, never more than scheduled).
    for arm, row in group["step_times"].items():
      assert 75 <= row["steps"] <= 100 and row["mean_ms"] > 0, (name, arm, row)
    assert group["refreshes_per_round"][0] >= 1, (name, group["refreshes_per_round"])
    assert 0 < group["load_to_swap_seconds"]["median"] <= group["load_to_swap_seconds"]["max"]
    for ratio in group["ratios"].values():
      assert ratio["median"] > 0 and len(ratio["rounds"]) == 1
  assert set(summary["goal_verdicts"]) == set(cluster_step_times.GOALS)
  assert summary["config"]["teacher_form"] == "stacked"  # the CTR model's teachers, on ps too
  assert summary["machine"]["allow_load"] is True and "foreign_cpu_share" in summary["machine"]
