"""benchmarks/cluster_step_times.py on real local clusters: a parameter-server group and a
MultiWorkerMirrored group, every arm timed, teachers really refreshed, the goals computed."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import cluster_step_times
from benchmarks import standalone

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
  # No launches recorded in these ratios:
  assert loss["launch_values"] is None
  assert verdicts["teacher_throughput_ratio_parameter_server"]["launch_values"] is None


def _launch(no_teacher_s, teacher_s, refresh_s, loads):
  """A launch's raw record: 2 rounds of 3 steps per arm, each arm at a constant step time."""
  times = {"no_teacher": [[no_teacher_s] * 3] * 2, "teacher": [[teacher_s] * 3] * 2,
           "teacher_refresh": [[refresh_s] * 3] * 2}
  return {"times": times, "refreshes_per_round": [len(loads), 0], "load_seconds": loads,
          "load_to_swap_seconds": [2 * x for x in loads]}


def test_launches_are_pooled_with_each_launch_median_and_an_interval_over_launches():
  launches = [_launch(0.040, 0.042, 0.043, [0.5]), _launch(0.040, 0.050, 0.050, [0.1, 0.3])]
  group = cluster_step_times.summarize(launches)
  teacher = group["ratios"]["teacher_vs_no_teacher"]
  assert teacher["process_medians"] == pytest.approx([40 / 42, 40 / 50])
  assert len(teacher["rounds"]) == 4 and group["launches"] == 2
  # Resampling launches: with one launch at 0.95 and one at 0.80, the interval spans both.
  assert teacher["interval90"] == pytest.approx([40 / 50, 40 / 42])
  assert group["refreshes_per_round"] == [1, 0, 2, 0]
  assert group["load_seconds"] == pytest.approx({"median": 0.3, "max": 0.5})
  assert group["load_to_swap_seconds"]["max"] == pytest.approx(1.0)
  assert group["step_times"]["teacher"]["steps"] == 12
  verdicts = cluster_step_times.goals({"parameter_server": group})
  assert verdicts["teacher_throughput_ratio_parameter_server"]["launch_values"] == pytest.approx(
      [40 / 42, 40 / 50])
  assert verdicts["refresh_throughput_loss"]["launch_values"] == pytest.approx(
      [1 - 42 / 43, 0.0])


def test_a_finished_launch_is_reused_only_under_the_same_settings_and_sources(
    tmp_path, monkeypatch):
  def no_cluster(jobs):
    raise AssertionError("a finished launch was measured again")
  monkeypatch.setattr(cluster_step_times.local_cluster, "free_cluster", no_cluster)
  settings = {"steps": 300, "rounds": 4, "teacher_form": "stacked"}
  work = str(tmp_path)
  assert cluster_step_times.finished_launch(work, settings, "abc") is None
  part = _launch(0.04, 0.042, 0.043, [0.2])
  standalone.write_json(str(tmp_path / "launch.json"),
                        {"config": settings, "sources": "abc", "part": part})
  assert cluster_step_times.finished_launch(work, dict(settings), "abc")["part"] == part
  reused = cluster_step_times.run_group("parameter_server", work, settings, "abc")
  assert reused["part"] == part and reused["reused"] is True
  assert cluster_step_times.finished_launch(work, {**settings, "steps": 200}, "abc") is None
  assert cluster_step_times.finished_launch(work, settings, "other sources") is None
  with pytest.raises(AssertionError, match="measured again"):  # other settings: a new launch
    cluster_step_times.run_group("parameter_server", work, {**settings, "steps": 200}, "abc")
  for broken in ('{"config": ', "[1, 2]", '{"config": {}, "sources": "abc"}'):
    (tmp_path / "launch.json").write_text(broken)  # cut short, not a record, no measurement
    assert cluster_step_times.finished_launch(work, settings, "abc") is None


def test_launches_alternate_the_groups_each_in_its_own_directory(tmp_path):
  calls = []

  def run(group, work, settings, sources):
    calls.append((group, os.path.basename(work)))
    return {"part": group, "reused": False}

  records = cluster_step_times.run_launches(["parameter_server", "multi_worker_mirrored"], 2,
                                            str(tmp_path), {"steps": 1}, "abc", run=run)
  assert calls == [("parameter_server", "parameter_server_0"),
                   ("multi_worker_mirrored", "multi_worker_mirrored_0"),
                   ("parameter_server", "parameter_server_1"),
                   ("multi_worker_mirrored", "multi_worker_mirrored_1")]
  assert [r["part"] for r in records["parameter_server"]] == ["parameter_server"] * 2


@pytest.mark.cluster
def test_both_groups_time_every_arm_and_refresh_their_teacher(tmp_path):
  out = tmp_path / "summary.json"
  env = {**os.environ, "TF_CODISTILL_BENCH_LOCK": str(tmp_path / "lock")}
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.cluster_step_times", "--rounds=1", "--steps=100",
       "--refresh_every_steps=10", "--poll_interval_s=0.2", "--num_buckets=500",
       "--batch_size=32", "--launches=1", "--allow_load", "--settle_s=0",
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
    assert 0 < group["load_seconds"]["median"] <= group["load_to_swap_seconds"]["max"]
    for ratio in group["ratios"].values():
      assert ratio["median"] > 0 and len(ratio["rounds"]) == 1
      assert ratio["process_medians"] == [ratio["median"]]
  assert set(summary["goal_verdicts"]) == set(cluster_step_times.GOALS)
  assert summary["config"]["launches"] == 1
  launch = json.loads((tmp_path / "work" / "parameter_server_0" / "launch.json").read_text())
  assert launch["config"]["steps"] == 100 and set(launch["part"]["times"]) == set(
      cluster_step_times.ARMS)
  assert launch["sources"] == standalone.source_digest() and launch["load_avg_1m_before"] >= 0
  for group in summary["groups"].values():
    (record,) = group["launch_records"]
    assert record["reused"] is False and record["sources"] == launch["sources"]
  assert summary["config"]["teacher_form"] == "stacked"  # the CTR model's teachers, on ps too
  assert summary["machine"]["allow_load"] is True and "foreign_cpu_share" in summary["machine"]


def test_one_process_times_every_arm_and_refreshes_its_teacher_without_a_cluster(tmp_path):
  out = tmp_path / "summary.json"
  env = {**os.environ, "TF_CODISTILL_BENCH_LOCK": str(tmp_path / "lock")}
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.cluster_step_times", "--groups=one_process",
       "--rounds=2", "--steps=60", "--refresh_every_steps=10", "--poll_interval_s=0.2",
       "--num_buckets=500", "--batch_size=32", "--launches=1", "--allow_load", "--settle_s=0",
       f"--out={out}", f"--work_dir={tmp_path / 'work'}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads(out.read_text())
  (group,) = summary["groups"].values()
  assert list(summary["groups"]) == ["one_process"]
  for arm, row in group["step_times"].items():
    assert row["steps"] == 2 * 60 and row["mean_ms"] > 0, (arm, row)
  assert set(group["step_times"]) == set(cluster_step_times.ARMS)
  assert sum(group["refreshes_per_round"]) >= 1, group["refreshes_per_round"]
  assert 0 < group["load_seconds"]["median"] <= group["load_seconds"]["max"]
  assert len(group["ratios"]["refresh_vs_teacher"]["rounds"]) == 2
  # No parameter-server group: only the refresh goal, from this group.
  assert set(summary["goal_verdicts"]) == {"refresh_throughput_loss"}
  assert summary["goals"]["refresh_throughput_loss"] == pytest.approx(
      1 - group["ratios"]["refresh_vs_teacher"]["median"])


def test_an_unknown_group_is_refused_naming_the_flag(tmp_path):
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.cluster_step_times", "--groups=one_process,mirrored",
       f"--out={tmp_path / 'summary.json'}", f"--work_dir={tmp_path / 'work'}"],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert done.returncode != 0
  assert "--groups: each must be one of parameter_server, multi_worker_mirrored, one_process" in (
      done.stderr)
  assert not (tmp_path / "work").exists()
