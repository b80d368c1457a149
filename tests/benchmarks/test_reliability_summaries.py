"""The verdicts, tables and reports of benchmarks/soak.py, fault_trials.py and reliability_doc.py
on synthetic measurements (the real runs are tests/reliability/test_soak.py and
test_process_faults.py), and the reports of the committed summaries of those and of
cluster_throughput.py."""

import itertools
import json
import os

import pytest

from benchmarks import fault_trials
from benchmarks import net_fault_trials
from benchmarks import registry
from benchmarks import reliability_doc
from benchmarks import soak
from benchmarks import standalone


def _timeline(start, plain_ms=10.0, slow=(), refresh_every=20, steps=4000):
  """A chief's step timeline: one interval per step (each ``plain_ms``, the steps in ``slow``
  6x slower), an epoch end every 1000 steps and a teacher refresh overlapping every
  ``refresh_every``-th step."""
  intervals, refresh, t = [], [], start
  for i in range(steps):
    length = 0.001 * plain_ms * (6 if i in slow else 1)
    intervals.append([t, t + length, 1, i % 1000 == 999])
    if i % refresh_every == 0:
      refresh.append([t + 0.001, t + 0.005])
    t += length
  return {"clock": "time.monotonic", "intervals": intervals,
          "windows": {"refresh": refresh, "publish": []}}


def _run(leak_mib_per_min=0.0, slow=()):
  series = lambda base, leak: [[t, base + leak * t / 60.0] for t in range(0, 1300, 5)]
  return {"exit_code": 0, "duration_s": 1200, "wall_s": 1300, "strategy": "parameter_server",
          "warmup_s": 180, "sample_s": 5, "train_start_s": {"0": 30.0, "1": 32.0},
          "groups": {g: {"teacher_loads": 400} for g in ("0", "1")},
          "timelines": {"0": _timeline(1000.0, slow=slow), "1": _timeline(1000.001)},
          "rss_mib": {"launcher": series(60, 0), "group_0/chief_0": series(900, leak_mib_per_min),
                      "group_1/ps_0": series(500, 0)}}


def test_flat_memory_and_steady_steps_pass():
  verdict = soak.judge(_run())
  assert verdict["ok"] and verdict["rss_flat"] and verdict["step_times_ok"], verdict
  assert verdict["refresh_every_s"] == [3.0, 3.0]


def test_a_leak_of_a_few_mib_per_minute_is_caught():
  verdict = soak.judge(_run(leak_mib_per_min=5.0))  # ~80 MiB between first and last fifth
  assert not verdict["rss_flat"] and not verdict["rss"]["group_0/chief_0"]["flat"]
  assert verdict["rss"]["group_1/ps_0"]["flat"]


def test_slow_plain_steps_fail_the_rule_unless_they_overlap_a_peer_event():
  steps = soak.judge(_run())["step_times"]["0"]
  assert steps["ok"] and steps["plain_steps"] == 4000 - 200 - 4 and steps["plain_p50_ms"] == 10.0
  # 4000 steps, 200 at a refresh, 4 epoch ends. With each group on its own CPU every slow plain
  # step counts: 3 of 3796 (0.08%) are within the rule's 0.1%; 4 are not.
  assert soak.judge(_pinned(_run(slow=(5, 6, 7))))["step_times"]["0"]["ok"]
  steps = soak.judge(_pinned(_run(slow=(5, 6, 7, 8))))["step_times"]["0"]
  assert steps["plain_slow"] == 4 and steps["counted"] == 4 and not steps["ok"]
  assert steps["checks"] == {"p99": True, "slow_fraction": False, "max_step": True}
  # A step during its own refresh is a refresh step, not a plain one.
  assert soak.judge(_run(slow=(20, 40, 60, 80)))["step_times"]["0"]["plain_slow"] == 0
  # Too many moderately slow steps (2% at 3.5x: p99 above 3x the median) fail the p99 check.
  many = _run()
  many["timelines"]["0"] = _timeline(1000.0)
  for i in range(1, 3800, 50):
    s, e = many["timelines"]["0"]["intervals"][i][:2]
    many["timelines"]["0"]["intervals"][i][1] = s + 3.5 * (e - s)
  assert soak.judge(many)["step_times"]["0"]["checks"]["p99"] is False
  # One step over 1 s fails on its own.
  long_step = _run()
  long_step["timelines"]["0"] = _timeline(1000.0, refresh_every=10**6)  # it spans no refresh
  long_step["timelines"]["0"]["intervals"][5][1] += 1.5
  assert soak.judge(long_step)["step_times"]["0"]["checks"]["max_step"] is False


def test_slow_steps_during_a_peer_event_count_only_when_groups_have_their_own_cpus():
  slow = (5, 6, 7, 8)  # 1000.05 .. 1000.29 in group 0
  at = 1000.0 + 6 * 0.01  # group 1 refreshes over 1000.06 .. 1000.36
  timelines = {"0": _timeline(1000.0, slow=slow), "1": _peer_refresh_at(at)}
  verdict = soak.step_time_verdict(timelines, peers_share_cpus=True)
  assert verdict["0"]["plain_slow"] == 4, verdict["0"]
  assert verdict["0"]["outliers"][0]["during"] == ["group 1 refresh"]
  assert verdict["0"]["unexplained"] == 0 and verdict["0"]["ok"]
  assert not soak.step_time_verdict(timelines, peers_share_cpus=False)["0"]["ok"]
  pinned = _run(slow=slow)
  pinned["timelines"]["1"] = _peer_refresh_at(at)
  assert soak.judge(pinned)["step_times_ok"]
  pinned["group_cpus"] = {"0": [0], "1": [1]}
  assert not soak.judge(pinned)["step_times_ok"]
  row = soak.markdown_row({"run": pinned, "verdict": soak.judge(pinned)})
  assert "each group pinned to its own CPU(s) 0/1" in row and "4 over 5x the median" in row


def _pinned(run):
  run["group_cpus"] = {"0": [0], "1": [1]}
  return run


def _peer_refresh_at(t):
  timeline = _timeline(1000.0, refresh_every=10**6)
  timeline["windows"]["refresh"] = [[t, t + 0.3]]
  return timeline


def _trial(kind, seed, lost, recovery, ok=True, restarts=1):
  return {"kind": kind, "seed": seed, "steps_lost": lost, "recovery_s": recovery,
          "finished": ok, "resumed_correctly": ok, "ok": ok, "step_at_kill": 100 + seed,
          "restarts_used": restarts}


def test_fault_summary_and_doc_section(tmp_path):
  trials = [_trial("worker", 0, 0, 8.0), _trial("worker", 1, 0, 10.0, restarts=2),
            _trial("chief", 0, 30, 40.0), _trial("chief", 1, 10, 50.0, ok=False)]
  summary = fault_trials.summarize(trials)
  assert summary["chief"]["finished"] == 1 and summary["chief"]["trials"] == 2
  assert summary["chief"]["steps_lost"] == {"median": 20, "min": 10, "max": 30}
  faults = {"command": "python -m benchmarks.run fault_trials "
                       "--gin_bindings='bench.fault_trials.trials = 2'", "started_utc": "now",
            "wall_s": 600, "cpus": 2, "load_avg_at_end": [3.0, 3.0, 3.0], "summary": summary,
            "trials": trials}
  soak_summary = {"command": "python -m benchmarks.run soak", "started_utc": "now", "cpus": 2,
                  "load_avg_at_end": [3.0, 3.0, 3.0], "run": _run(), "verdict": soak.judge(_run())}
  (tmp_path / "f.json").write_text(json.dumps(faults))
  (tmp_path / "s.json").write_text(json.dumps(soak_summary))
  text = reliability_doc.measured_section(str(tmp_path / "f.json"), [str(tmp_path / "s.json")])
  assert "| kill -9 of the chief" in text and "1/2 finished" in text and "20 (10-30)" in text
  # A summary made before the machine record: its start and the load at its end only.
  assert "Kill trials: `python -m benchmarks.run fault_trials " in text
  assert "now, 10 min of trials, 2 CPUs, load average at the end 3.0 (machine shared" in text
  assert "resumed correctly | 1 (1), 2 (1) |" in text  # the workers' restarts: one each, or not
  assert fault_trials.restarts_cell([1, 1, None]) == "1 (2), not counted (1)"
  assert "| soak: 2-way codistillation" in text and "RSS flat after warm-up" in text
  lines = text.splitlines()
  first = lines.index(next(line for line in lines if line.startswith("| case |")))
  table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[first:]))
  assert table[-1].startswith("| soak") and len(table) == 5  # header, separator, 2 kinds, soak
  assert len({line.strip("|").count("|") for line in table}) == 1, table  # the soak row fits
  # The benchmarks' own reports hold the same table and row.
  fault_trials.BENCHMARK.write_report(faults, str(tmp_path / "fault_trials"))
  text = (tmp_path / "fault_trials" / "report.md").read_text()
  assert "| kill -9 of the chief" in text and "1/2 finished" in text
  assert "Kill steps per kind: worker [100, 101]; chief [100, 101]." in text
  assert "one kill should cost one): worker [1, 2]; chief [1, 1]." in text
  assert "**1 trial(s) did not recover:**" in text and "- chief seed 1:" in text
  soak.BENCHMARK.write_report(soak_summary, str(tmp_path / "soak"))
  text = (tmp_path / "soak" / "report.md").read_text()
  assert "| case | trials | outcome |" in text and "| soak: 2-way codistillation" in text
  assert "| group_0/chief_0 | " in text and "| 0 | 3796 | 10.0 |" in text


def _late_worker_kill(**fields):
  """A worker trial whose job finished 6.6 s after the kill, before the relaunched worker
  served (the shape of the recorded worker seed 5)."""
  return {"kind": "worker", "seed": 5, "finished": True, "resumed_correctly": True,
          "launcher_restarted": True, "progress_s": 0.3, "restart_s": None, "recovery_s": None,
          "restarts_used": 1, "steps_lost": 0, "step_at_kill": 162, "killed_after_s": 21.19,
          "wall_s": 27.8, "ok": False, **fields}


def test_a_job_that_ends_before_the_relaunched_worker_serves_recovered():
  assert fault_trials.recovered(_late_worker_kill(ended_before_replacement_served=True))
  assert not fault_trials.recovered(_late_worker_kill(ended_before_replacement_served=False))
  assert not fault_trials.recovered(_late_worker_kill(ended_before_replacement_served=True,
                                                      finished=False))
  assert not fault_trials.recovered(_late_worker_kill(ended_before_replacement_served=True,
                                                      launcher_restarted=False))
  # A record made before the field existed is judged from its times: the job ended 6.6 s after
  # the kill, long before the recovery watch's deadline, so it ended first.
  old = fault_trials.judged(_late_worker_kill())
  assert old["ended_before_replacement_served"] and old["ok"]
  # The same record with the watch run to its deadline (no restart within it) did not recover.
  stuck = fault_trials.judged(_late_worker_kill(wall_s=21.19 + fault_trials.RECOVERY_TIMEOUT_S))
  assert not stuck["ended_before_replacement_served"] and not stuck["ok"]
  # Other kinds always need their restart time; a trial that timed out keeps its verdict.
  chief = fault_trials.judged(_late_worker_kill(kind="chief"))
  assert not chief["ok"]
  assert fault_trials.judged({"kind": "worker", "ok": False, "error": "timed out"})["ok"] is False
  summary = fault_trials.summarize([old, fault_trials.judged(_late_worker_kill(seed=6,
                                                                               restart_s=7.0))])
  assert summary["worker"]["ok"] == 2 and summary["worker"]["ended_before_replacement_served"] == 1
  table = fault_trials.markdown_table({"summary": summary})
  assert "2/2 finished, 2/2 resumed correctly, 1 finished before the relaunched worker served" in (
      table)


def test_network_trials_in_progress_are_shown_as_such(tmp_path):
  trial = {"case": "cut_worker_5s", "seed": 0, "wall_s": 120.0, "ok": True, "finished": True,
           "restarts_used": 0, "hung": False, "recovery_s": 2.0, "steps_during_fault": 10}
  net = {"command": "python -m benchmarks.run net_fault_trials", "cpus": 2, "wall_s": 120.0,
         "trials": [trial], "missing": ["cut_ps_5s_0"], "complete": False,
         "stall_timeout_s": 120.0, "summary": net_fault_trials.summarize([trial])}
  (tmp_path / "n.json").write_text(json.dumps(net))
  text = reliability_doc.measured_section(str(tmp_path / "none.json"), [],
                                          str(tmp_path / "n.json"))
  assert "| worker cut off for 5 s, then healed" in text
  assert ("Network fault trials, **partial**: 1 trials recorded, 1 not yet (the table counts "
          "the recorded ones); `python -m benchmarks.run net_fault_trials`, 2 min") in text


def test_bad_kinds_are_refused_before_anything_runs(tmp_path):
  ctx = registry.Context(name="fault_trials", results_dir=str(tmp_path / "r"),
                         work_dir=str(tmp_path / "w"), command="test")
  with pytest.raises(ValueError, match=r"bench\.fault_trials\.kinds"):
    fault_trials.measure_trials(ctx, kinds=("worker", "bogus"))
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("name", ["fault_trials", "soak", "cluster_throughput"])
def test_the_committed_summaries_are_reported(tmp_path, name):
  benchmark = registry.load(name)
  with open(os.path.join(registry.RESULTS_DIR, name, "summary.json")) as f:
    summary = json.load(f)
  benchmark.write_report(summary, str(tmp_path))
  text = (tmp_path / "report.md").read_text()
  assert text.startswith("# ") and summary.get("command", "command not recorded") in text
  expected = {"fault_trials": "| kill -9 of the ps task", "soak": "| soak: 2-way codistillation",
              "cluster_throughput": "| async_2workers | "}[name]
  assert expected in text


def test_the_doc_section_is_made_from_the_committed_summaries():
  text = reliability_doc.measured_section()
  assert "| kill -9 of the ps task" in text and "| soak: 2-way codistillation" in text
  assert "Kill trials: `" in text and "Soak: `" in text
  assert ("(recorded through an entry point since removed; today `python -m benchmarks.run "
          "soak`, its settings as `--gin_bindings`)") in text
  # The kill trials ran over two sessions, on a machine whose record says who else used it.
  assert "Kill trials: `python -m benchmarks.run fault_trials`, trials recorded 2026-12-07T" in (
      text)
  assert "CPU used by other processes during the last run 0.0%" in text
  assert "(machine shared with other jobs). Kill" not in text
  assert standalone.command_line({"command": "python -m benchmarks.run fault_trials_x"},
                             "fault_trials").endswith("since removed; today `python -m "
                                                      "benchmarks.run fault_trials`, its settings "
                                                      "as `--gin_bindings`)")
  assert standalone.command_line({"command": "python -m benchmarks.run soak --x"}, "soak") == (
      "`python -m benchmarks.run soak --x`")


def test_writing_the_doc_replaces_only_its_measured_section(tmp_path):
  doc = tmp_path / "reliability.md"
  doc.write_text(f"intro\n{reliability_doc.BEGIN}\nold numbers\n{reliability_doc.END}\noutro\n")
  assert reliability_doc.write(str(doc)) == str(doc)
  text = doc.read_text()
  assert text.startswith(f"intro\n{reliability_doc.BEGIN}\n") and text.endswith(
      f"{reliability_doc.END}\noutro\n")
  assert "old numbers" not in text and reliability_doc.measured_section() in text
  (tmp_path / "bare.md").write_text("no markers\n")
  with pytest.raises(ValueError, match=r"bare.md has no <!-- measured:begin -->"):
    reliability_doc.write(str(tmp_path / "bare.md"))


def test_the_committed_doc_shows_the_committed_summaries():
  with open(reliability_doc.DOC) as f:
    assert reliability_doc.measured_section() in f.read()
