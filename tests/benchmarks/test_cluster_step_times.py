"""The cluster_step_times benchmark (``python -m benchmarks.run cluster_step_times``) on real
local clusters: a parameter-server group and a MultiWorkerMirrored group, every arm timed,
teachers really refreshed, the goals computed."""

import json
import os
import subprocess
import sys
import time
import types

import pytest

from benchmarks import cluster_step_times
from benchmarks import machine
from benchmarks import standalone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tmp_path, settings, timeout=600):
  """``python -m benchmarks.run cluster_step_times`` with ``settings`` (gin bindings of
  ``bench.cluster_step_times``), its results under ``tmp_path/results`` and its work directory
  ``tmp_path/work/cluster_step_times``."""
  env = {**os.environ, "TF_CODISTILL_BENCH_LOCK": str(tmp_path / "lock")}
  return subprocess.run(
      [sys.executable, "-m", "benchmarks.run", "cluster_step_times",
       f"--results_dir={tmp_path / 'results'}", f"--work_dir={tmp_path / 'work'}", "--allow_load",
       "--settle_s=0", *[f"--gin_bindings=bench.cluster_step_times.{s}" for s in settings]],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _summary(tmp_path):
  return json.loads((tmp_path / "results" / "cluster_step_times" / "summary.json").read_text())


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


def test_the_refresh_goal_reads_a_groups_refresh_windows_where_it_has_them():
  ratio = lambda median: {"median": median, "interval90": [median - 0.01, median + 0.01]}
  groups = {"parameter_server": {
                "ratios": {"teacher_vs_no_teacher": ratio(0.95), "refresh_vs_teacher": ratio(0.90)},
                "refresh_windows": {"pairs": 30, "refreshing_vs_quiet": ratio(0.98)}},
            "one_process": {"ratios": {"refresh_vs_teacher": ratio(0.975)}}}
  loss = cluster_step_times.goals(groups)["refresh_throughput_loss"]
  # The parameter-server group's windows (2%) stand for it, not its arms' 10%: the worst of
  # the groups is then the one process's arms (2.5%).
  assert loss["value"] == pytest.approx(0.025) and loss["group"] == "one_process" and loss["met"]
  groups["one_process"]["refresh_windows"] = {"pairs": 0}  # none finished: its arms count
  assert cluster_step_times.goals(groups)["refresh_throughput_loss"]["group"] == "one_process"
  groups["one_process"]["ratios"]["refresh_vs_teacher"] = ratio(0.99)
  loss = cluster_step_times.goals(groups)["refresh_throughput_loss"]
  assert loss["group"] == "parameter_server" and loss["value"] == pytest.approx(0.02)


class _Clock:
  def __init__(self, intervals):
    self.intervals = intervals


def test_refresh_windows_split_the_steps_and_loads_by_the_window_their_times_fall_in():
  model = types.SimpleNamespace(stop_training=False)
  # Steps of 0.1 s from t=100 on: the first timed step ends at 100.1, where the windows begin.
  ends = [100.0 + 0.1 * i for i in range(1, 46)]
  clock = _Clock([(end - 0.1, end) for end in ends])
  windows = cluster_step_times.RefreshWindows(model, clock, window_s=1.0, pairs=3, stop_fit=True)
  assert windows.window_of(50.0) is None  # nothing is due before the first timed step
  windows.start = 100.1
  assert [windows.window_of(t) for t in (100.1, 101.05, 102.2, 106.09, 106.2)] == [0, 0, 2, 5,
                                                                                    None]
  loads = [(101.2, 101.5), (103.3, 104.2), (100.5, 100.6), (107.0, 107.1)]
  split = windows.split(loads)
  # The steps end at 104.6 at the latest: 2 pairs of windows finished (4 s), the third did not.
  assert len(split["times"]["quiet"]) == len(split["times"]["refreshing"]) == 2
  assert all(len(w) in (9, 10, 11) for pair in split["times"].values() for w in pair)
  assert split["loads"] == {"quiet": [1, 0], "refreshing": [1, 1], "outside": 1,
                            "swapped_in_a_later_window": 1}
  assert split["window_s"] == 1.0


def test_refresh_windows_make_one_version_due_per_refreshing_window_and_stop_the_fit():
  model = types.SimpleNamespace(stop_training=False)
  clock = _Clock([])
  windows = cluster_step_times.RefreshWindows(model, clock, window_s=10.0, pairs=2,
                                              stop_fit=True)
  assert windows.versions_due() == 0 and windows.start is None  # no timed step yet
  now = time.monotonic()
  clock.intervals.append((now - 25.1, now - 25.0))  # 25 s into the windows: the third (quiet)
  assert windows.versions_due() == 1 and not model.stop_training
  windows.start = now - 35.0  # the fourth, refreshing
  assert windows.versions_due() == 2 and not model.stop_training
  windows.start = now - 45.0  # past the last: no more versions, and the fit stops
  assert windows.versions_due() == 2 and model.stop_training
  other = types.SimpleNamespace(stop_training=False)
  mirrored = cluster_step_times.RefreshWindows(other, _Clock([(0.0, now - 45.0)]), 10.0, 2,
                                               stop_fit=False)
  assert mirrored.versions_due() == 2 and not other.stop_training


def test_refresh_windows_of_launches_are_pooled_pair_by_pair():
  def launch(quiet_s, busy_s, pairs, empty=False):
    quiet = [[quiet_s] * 5 for _ in range(pairs)]
    busy = [[busy_s] * 5 for _ in range(pairs)]
    if empty:
      busy[-1] = []  # a refreshing window with no step in it: its pair is left out
    return {"times": {"quiet": quiet, "refreshing": busy}, "window_s": 4.0,
            "loads": {"quiet": [0] * pairs, "refreshing": [1] * (pairs - 1) + [2],
                      "outside": 1, "swapped_in_a_later_window": 0}}
  summary = cluster_step_times.summarize_windows([launch(0.040, 0.041, 3),
                                                  launch(0.040, 0.050, 3, empty=True)])
  assert summary["pairs"] == 5 and summary["window_s"] == [4.0, 4.0]
  ratio = summary["refreshing_vs_quiet"]
  assert ratio["process_medians"] == pytest.approx([40 / 41, 40 / 50])
  assert ratio["interval90"] == pytest.approx([40 / 50, 40 / 41])
  assert summary["loads"] == {"in_quiet_windows": 0, "in_refreshing_windows": 8, "outside": 2,
                              "swapped_in_a_later_window": 0}
  assert summary["refreshing_windows_with_one_load"] == 4
  assert cluster_step_times.summarize_windows([launch(0.04, 0.04, 1, empty=True)]) == {"pairs": 0}


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
  machine.write_json(str(tmp_path / "launch.json"),
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
  done = _run(tmp_path, ["rounds = 1", "steps = 100", "refresh_every_steps = 10",
                         "window_pairs = 2", "poll_interval_s = 0.2", "num_buckets = 500",
                         "batch_size = 32", "launches = 1"])
  assert done.returncode == 0, done.stderr[-3000:]
  summary = _summary(tmp_path)
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
    # The refresh-windows fit: its pairs of windows, a version due in each refreshing one.
    windows = group["refresh_windows"]
    assert windows["pairs"] >= 1 and windows["refreshing_vs_quiet"]["median"] > 0, (name, windows)
    assert sum(windows["loads"].values()) >= 1 and windows["window_s"][0] > 0, (name, windows)
  assert set(summary["goal_verdicts"]) == set(cluster_step_times.GOALS)
  assert summary["config"]["launches"] == 1 and summary["config"]["window_pairs"] == 2
  launch = json.loads((tmp_path / "work" / "cluster_step_times" / "parameter_server_0"
                       / "launch.json").read_text())
  assert launch["config"]["steps"] == 100 and set(launch["part"]["times"]) == set(
      cluster_step_times.ARMS)
  assert launch["sources"] == standalone.source_digest() and launch["load_avg_1m_before"] >= 0
  for group in summary["groups"].values():
    (record,) = group["launch_records"]
    assert record["reused"] is False and record["sources"] == launch["sources"]
  assert summary["config"]["teacher_form"] == "stacked"  # the CTR model's teachers, on ps too
  assert summary["machine"]["allow_load"] is True and "foreign_cpu_share" in summary["machine"]
  report = (tmp_path / "results" / "cluster_step_times" / "report.md").read_text()
  assert "teacher_throughput_ratio_parameter_server" in report and "refreshing vs quiet" in report


def test_one_process_times_every_arm_and_refreshes_its_teacher_without_a_cluster(tmp_path):
  done = _run(tmp_path, [
      "groups = ['one_process']",
      # Rounds of 200 steps (about 1.2 s here): with 60 the first round ended before the first
      # load had landed even on an idle machine ([0, 2] swaps), and under load neither did.
      # Windows of 25 steps (about 0.1 s): windows of 10 (about 0.045 s) were each emptied by
      # one stall of the process under a full test run, so no pair was left.
      "rounds = 2", "steps = 200", "refresh_every_steps = 25", "window_pairs = 2",
      "poll_interval_s = 0.2", "num_buckets = 500", "batch_size = 32", "launches = 1"])
  assert done.returncode == 0, done.stderr[-3000:]
  summary = _summary(tmp_path)
  (group,) = summary["groups"].values()
  assert list(summary["groups"]) == ["one_process"]
  for arm, row in group["step_times"].items():
    assert row["steps"] == 2 * 200 and row["mean_ms"] > 0, (arm, row)
  assert set(group["step_times"]) == set(cluster_step_times.ARMS)
  assert sum(group["refreshes_per_round"]) >= 1, group["refreshes_per_round"]
  assert 0 < group["load_seconds"]["median"] <= group["load_seconds"]["max"]
  assert len(group["ratios"]["refresh_vs_teacher"]["rounds"]) == 2
  # No parameter-server group: only the refresh goal, from this group.
  assert set(summary["goal_verdicts"]) == {"refresh_throughput_loss"}
  windows = group["refresh_windows"]
  assert windows["pairs"] >= 1, windows
  assert summary["goals"]["refresh_throughput_loss"] == pytest.approx(
      1 - windows["refreshing_vs_quiet"]["median"])
  report = (tmp_path / "results" / "cluster_step_times" / "report.md").read_text()
  assert "refresh_throughput_loss" in report and "one_process" in report


def test_an_unknown_group_is_refused_naming_the_parameter(tmp_path):
  done = _run(tmp_path, ["groups = ['one_process', 'mirrored']"], timeout=120)
  assert done.returncode != 0
  assert ("bench.cluster_step_times.groups: each must be one of parameter_server, "
          "multi_worker_mirrored, one_process") in done.stderr
  assert not (tmp_path / "work").exists()
  assert not (tmp_path / "results" / "cluster_step_times" / "summary.json").exists()
