"""The network fault trials' cases, command lines, summary, report and doc table (the trials
themselves run in tests/reliability/test_network_faults.py)."""

import json
import subprocess
import sys

import pytest

from benchmarks import net_fault_trials
from benchmarks import registry
from benchmarks import reliability_doc
from tf_codistill.launch import isolation


def test_the_cases_cover_cuts_of_every_task_loss_and_latency_in_both_strategies():
  cases = net_fault_trials.CASES
  for seconds in (5, 30, 300):
    for task in ("worker", "ps", "chief"):
      case = cases[f"cut_{task}_{seconds}s"]
      assert (case.strategy, case.task, case.fault, case.seconds) == (
          "parameter_server", task, "cut", seconds)
    assert cases[f"sync_cut_worker_{seconds}s"].strategy == "multi_worker_mirrored"
  assert cases["loss_worker"].percent == 5 and cases["sync_loss_worker"].fault == "loss"
  assert cases["latency_worker"].delay_s == 0.2 and cases["sync_latency_worker"].seconds is None
  assert "cut off for 30 s, then healed (1 group: chief, 2 workers, 1 ps)" in (
      cases["cut_ps_30s"].describe())
  for mode in ("slow", "read_only", "full", "vanished", "stalled"):
    assert (cases[f"exchange_{mode}_30s"].task, cases[f"exchange_{mode}_30s"].groups) == (
        "exchange", 2)
  assert cases["exchange_stalled_300s"].seconds == 300
  assert cases["peer_silent_30s"].describe().startswith("the peer group stopped for 30 s")


def test_a_trial_runs_the_launcher_with_its_shape_and_watchdog():
  sync = net_fault_trials.trial_command(net_fault_trials.CASES["sync_cut_worker_5s"], "/m", "/d",
                                        240, 40, 90.0)
  assert "--strategy=multi_worker_mirrored" in sync and "--stall_timeout_s=90" in sync
  ps = net_fault_trials.trial_command(net_fault_trials.CASES["cut_ps_5s"], "/m", "/d", 240, 40,
                                      120.0)
  assert "--strategy=parameter_server" in ps and "--ps_per_group=1" in ps
  exchange = net_fault_trials.trial_command(net_fault_trials.CASES["exchange_full_30s"], "/m",
                                            "/d", 240, 40, 120.0, exchange_dir="/x")
  assert "--num_groups=2" in exchange and "--exchange_dir=/x" in exchange
  assert net_fault_trials.bound_s(net_fault_trials.CASES["cut_ps_300s"], 120.0) == (
      300 + 240 + 600)


def _record(case, seed, finished=True, restarts=0, hung=False, recovery=2.0, during=10):
  """A trial's record as run_trial writes it (the fields the summary reads)."""
  return {"case": case, "seed": seed, "finished": finished, "restarts_used": restarts,
          "hung": hung, "ok": finished and not hung, "recovery_s": recovery,
          "steps_during_fault": during, "exit_code": 0 if finished else None}


def _summary(trials):
  return {"command": "python -m benchmarks.run net_fault_trials", "started_utc": "now",
          "wall_s": 600, "cpus": 2, "load_avg_at_end": [1.5, 1.5, 1.5], "stall_timeout_s": 120.0,
          "summary": net_fault_trials.summarize(trials), "trials": trials}


def test_the_summary_counts_finished_restarted_and_hung_trials(tmp_path):
  trials = [_record("cut_worker_5s", 0), _record("cut_worker_5s", 1, restarts=1, recovery=9.0),
            _record("cut_ps_300s", 0, finished=False, hung=True, recovery=None, during=0)]
  summary = _summary(trials)
  worker, ps = summary["summary"]["cut_worker_5s"], summary["summary"]["cut_ps_300s"]
  assert (worker["trials"], worker["finished"], worker["without_restart"], worker["hangs"]) == (
      2, 2, 1, 0)
  assert worker["recovery_s"] == {"median": 5.5, "min": 2.0, "max": 9.0}
  assert (ps["finished"], ps["hangs"], ps["recovery_s"]) == (0, 1, None)
  net_fault_trials.BENCHMARK.write_report(summary, str(tmp_path))
  text = (tmp_path / "report.md").read_text()
  row = "| worker cut off for 5 s, then healed (1 group: chief, 2 workers, 1 ps) | 2 | 2 | 1 |"
  assert row in text
  assert "**1 trial(s) hung or did not finish:**" in text and "- cut_ps_300s seed 0:" in text
  assert net_fault_trials.BENCHMARK.failure(summary) == "1 trial(s) hung or did not finish"
  path = tmp_path / "net.json"
  path.write_text(json.dumps(summary))
  section = reliability_doc.measured_section(str(tmp_path / "none.json"), [], str(path))
  assert "| ps cut off for 300 s, then healed" in section and "stall watchdog 120 s" in section


def test_unknown_cases_are_refused_before_anything_runs(tmp_path):
  ctx = registry.Context(name="net_fault_trials", results_dir=str(tmp_path / "r"),
                         work_dir=str(tmp_path / "w"), command="test")
  with pytest.raises(ValueError, match=r"bench\.net_fault_trials\.cases: \['bogus'\]"):
    net_fault_trials.measure_trials(ctx, cases=("cut_worker_5s", "bogus"))
  assert not (tmp_path / "w").exists()


@pytest.mark.skipif(net_fault_trials.netfaults.unavailable() is not None,
                    reason=str(net_fault_trials.netfaults.unavailable()))
def test_a_cut_whose_launch_ended_meanwhile_ends_without_its_packet_count():
  """A restart can beat a long cut: the launch (and its namespace) is gone when the cut ends;
  the trial records no packet count instead of failing on the namespace."""
  namespace = isolation.NetworkNamespace()
  faults = net_fault_trials.netfaults.NetworkFaults(namespace.pid)
  sleeper = subprocess.Popen(faults.enter([sys.executable, "-c", "import time; time.sleep(60)"]))
  try:
    faults.wait_inside(sleeper.pid)
    end = net_fault_trials._cut(faults, sleeper.pid)
    namespace.close()
    assert not faults.alive()
    assert end() == {"packets_dropped": None}
  finally:
    sleeper.kill()
    sleeper.wait()
    namespace.close()


def _launch_that_steps(tmp_path, step, lives_s):
  """A stand-in launch: a real process that lives ``lives_s`` seconds, and group 0's heartbeat at
  ``step`` (what ``_for_a_while`` reads)."""
  beat = tmp_path / "group_0" / "heartbeat.json"
  beat.parent.mkdir(parents=True)
  beat.write_text(json.dumps({"step": step, "pid": 1}))
  proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({lives_s})"])

  class Launch:
    model_dir = str(tmp_path)
  Launch.proc = proc
  return Launch, beat


def test_a_launch_that_ends_during_the_fault_is_not_waited_for(tmp_path):
  # A 60-s fault and a 600-s wait for a step after the heal: the launch ends after 1 s (as a
  # restart may finish the job while the fault stands), so the fault ends then, and no step
  # after the heal is waited for.
  launch, _ = _launch_that_steps(tmp_path, step=50, lives_s=1)
  healed = []
  record = net_fault_trials._for_a_while(
      lambda: lambda: (healed.append(True), {"packets_dropped": 0})[1], 60, launch, 40, 600)
  assert healed == [True]
  assert record == {"step_at_fault": 50, "steps_during_fault": 0, "recovery_s": None,
                    "launch_ended_first": True, "packets_dropped": 0}


def test_a_step_after_the_heal_is_timed(tmp_path):
  launch, beat = _launch_that_steps(tmp_path, step=50, lives_s=30)

  def start():
    def end():
      beat.write_text(json.dumps({"step": 51, "pid": 1}))  # the group steps once healed
      return {}
    return end
  try:
    record = net_fault_trials._for_a_while(start, 0.5, launch, 40, 60)
  finally:
    launch.proc.kill()
  assert record["step_at_fault"] == 50 and record["steps_during_fault"] == 0
  assert record["recovery_s"] is not None and not record["launch_ended_first"]
