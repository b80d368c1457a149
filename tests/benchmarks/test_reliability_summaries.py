"""The verdicts and tables of benchmarks/soak.py, fault_trials.py and reliability_doc.py on
synthetic measurements (the real runs are tests/reliability/test_soak.py and
test_process_faults.py)."""

import json

from benchmarks import fault_trials
from benchmarks import reliability_doc
from benchmarks import soak


def _run(leak_mib_per_min=0.0, outliers=0):
  series = lambda base, leak: [[t, base + leak * t / 60.0] for t in range(0, 1300, 5)]
  step_times = {"other": {"count": 1000, "p50": 10.0, "p99": 20.0, "max": 25.0,
                          "over_3x_median": outliers},
                "refresh": {"count": 300, "p50": 12.0, "p99": 40.0, "max": 90.0,
                            "over_3x_median": 20}}
  return {"exit_code": 0, "duration_s": 1200, "wall_s": 1300, "strategy": "parameter_server",
          "warmup_s": 180, "sample_s": 5, "train_start_s": {"0": 30.0, "1": 32.0},
          "groups": {g: {"teacher_loads": 400, "step_time_ms": step_times} for g in ("0", "1")},
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


def test_plain_step_outliers_fail_but_refresh_steps_do_not_count():
  assert soak.judge(_run(outliers=0))["step_times_ok"]
  assert not soak.judge(_run(outliers=50))["step_times_ok"]


def _trial(kind, seed, lost, recovery, ok=True):
  return {"kind": kind, "seed": seed, "steps_lost": lost, "recovery_s": recovery,
          "finished": ok, "resumed_correctly": ok, "ok": ok, "step_at_kill": 100 + seed}


def test_fault_summary_and_doc_section(tmp_path):
  trials = [_trial("worker", 0, 0, 8.0), _trial("worker", 1, 0, 10.0),
            _trial("chief", 0, 30, 40.0), _trial("chief", 1, 10, 50.0, ok=False)]
  summary = fault_trials.summarize(trials)
  assert summary["chief"]["finished"] == 1 and summary["chief"]["trials"] == 2
  assert summary["chief"]["steps_lost"] == {"median": 20, "min": 10, "max": 30}
  faults = {"command": "python -m benchmarks.fault_trials --trials=2", "started_utc": "now",
            "wall_s": 600, "cpus": 2, "load_avg_at_end": [3.0, 3.0, 3.0], "summary": summary,
            "trials": trials}
  soak_summary = {"command": "python -m benchmarks.soak", "started_utc": "now", "cpus": 2,
                  "load_avg_at_end": [3.0, 3.0, 3.0], "run": _run(), "verdict": soak.judge(_run())}
  (tmp_path / "f.json").write_text(json.dumps(faults))
  (tmp_path / "s.json").write_text(json.dumps(soak_summary))
  text = reliability_doc.measured_section(str(tmp_path / "f.json"), str(tmp_path / "s.json"))
  assert "| kill -9 of the chief" in text and "1/2 finished" in text and "20 (10-30)" in text
  assert "| soak: 2-way codistillation" in text and "RSS flat after warm-up" in text
