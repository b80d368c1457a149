"""Fault trials go on across sessions: recorded trials are kept, the rest run, cases interleaved."""

import dataclasses
import json
import os

import pytest

from benchmarks import fault_trials
from benchmarks import machine
from benchmarks import net_fault_trials
from benchmarks import registry
from benchmarks import trials

SETTINGS = {"train_steps": 240, "steps_per_epoch": 40}


def _ctx(tmp_path):
  return registry.Context(name="t", results_dir=str(tmp_path / "r"), work_dir=str(tmp_path / "w"),
                          command="test", progress=lambda _: None)


def _run(ctx, settings=SETTINGS, fail=()):
  ran = []

  def run_one(case, seed):
    ran.append((case, seed))
    os.makedirs(os.path.join(ctx.work_dir, f"{case}_{seed}"), exist_ok=True)
    return {"case": case, "seed": seed, "wall_s": 10.0, "ok": (case, seed) not in fail}
  result = trials.run_interleaved(ctx, ["a", "b"], 2, settings, run_one,
                                  lambda case, seed: [os.path.join(ctx.work_dir, f"{case}_{seed}")])
  return ran, result


def test_trials_run_cases_interleaved_seed_by_seed_and_are_recorded_as_they_end(tmp_path):
  ctx = _ctx(tmp_path)
  ran, result = _run(ctx)
  assert ran == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
  assert [(t["case"], t["seed"]) for t in result["trials"]] == ran
  assert result["wall_s"] == 40.0 and result["cpus"] == os.cpu_count()
  with open(tmp_path / "r" / "trials" / "b_1.json") as f:
    recorded = json.load(f)
  assert recorded["settings"] == SETTINGS and "load_1m_before" in recorded
  assert len(recorded["library_sources"]) == 16  # the library code the trial ran
  assert os.listdir(ctx.work_dir) == []  # each trial's folders removed after it


def test_a_later_run_keeps_recorded_trials_and_runs_the_rest_or_all_with_new_settings(tmp_path):
  ctx = _ctx(tmp_path)
  _, first = _run(ctx)
  os.remove(tmp_path / "r" / "trials" / "a_1.json")  # as if the session ended before it
  ran, again = _run(ctx)
  assert ran == [("a", 1)]
  assert again["trials"][:2] == first["trials"][:2] and again["trials"][3] == first["trials"][3]
  ran, _ = _run(ctx, settings={**SETTINGS, "train_steps": 300})
  assert len(ran) == 4


def test_failed_trials_are_listed_with_their_error_or_their_record():
  summary = {"trials": [{"case": "a", "seed": 0, "ok": True},
                        {"case": "a", "seed": 1, "ok": False, "error": "launch failed"},
                        {"case": "b", "seed": 0, "ok": False, "hung": True}]}
  assert [t["seed"] for t in trials.failed(summary)] == [1, 0]
  assert trials.failed_lines(summary, "hung", "case", ("hung",)) == [
      "", "**2 trial(s) hung:**", "", "- a seed 1: launch failed", "- b seed 0: hung=True"]
  assert trials.failed_lines({"trials": summary["trials"][:1]}, "hung", "case", ()) == []
  assert trials.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
  assert trials.spread([]) is None


def test_fault_trials_keep_a_trial_recorded_under_their_settings(tmp_path):
  ctx = _ctx(tmp_path)
  recorded = {"kind": "worker", "seed": 0, "wall_s": 30.0, "ok": True, "finished": True,
              "resumed_correctly": True, "steps_lost": 0, "recovery_s": 5.0,
              "settings": {"train_steps": 240, "steps_per_epoch": 40}}
  machine.write_json(str(tmp_path / "r" / "trials" / "worker_0.json"), recorded)
  summary = fault_trials.measure_trials(ctx, trials=1, kinds=["worker"])
  assert summary["trials"] == [recorded]  # nothing ran again
  assert summary["summary"]["worker"]["finished"] == 1 and summary["wall_s"] == 30.0


def _recorded_net_trial(tmp_path):
  """A net_fault_trials trial recorded under the default settings, as a run writes it."""
  recorded = {"case": "cut_worker_5s", "seed": 0, "wall_s": 50.0, "ok": True, "finished": True,
              "restarts_used": 0, "hung": False, "recovery_s": 2.0, "steps_during_fault": 10,
              "settings": {"train_steps": 240, "steps_per_epoch": 40, "stall_timeout_s": 120.0}}
  machine.write_json(str(tmp_path / "r" / "trials" / "cut_worker_5s_0.json"), recorded)
  return recorded


@pytest.mark.skipif(net_fault_trials.netfaults.unavailable() is not None,
                    reason=str(net_fault_trials.netfaults.unavailable()))
def test_net_fault_trials_keep_a_trial_recorded_under_their_settings_stall_timeout_included(
    tmp_path):
  ctx = _ctx(tmp_path)
  recorded = _recorded_net_trial(tmp_path)
  summary = net_fault_trials.measure_trials(ctx, trials=1, cases=["cut_worker_5s"])
  assert summary["trials"] == [recorded] and summary["stall_timeout_s"] == 120.0
  assert summary["summary"]["cut_worker_5s"]["finished"] == 1


def test_without_running_the_record_holds_the_recorded_trials_and_names_the_rest(tmp_path):
  ctx = _ctx(tmp_path)
  _run(ctx)
  os.remove(tmp_path / "r" / "trials" / "a_1.json")
  ran = []
  so_far = trials.run_interleaved(ctx, ["a", "b"], 2, SETTINGS, lambda *trial: ran.append(trial),
                                  lambda *_: [], run_missing=False)
  assert ran == [] and so_far["missing"] == ["a_1"] and so_far["complete"] is False
  assert [(t["case"], t["seed"]) for t in so_far["trials"]] == [("a", 0), ("b", 0), ("b", 1)]
  assert so_far["wall_s"] == 30.0 and not os.path.exists(tmp_path / "r" / "trials" / "a_1.json")
  whole = trials.run_interleaved(ctx, ["b"], 2, SETTINGS, lambda *trial: ran.append(trial),
                                 lambda *_: [], run_missing=False)
  assert ran == [] and whole["complete"] is True and whole["missing"] == []


def test_net_fault_trials_so_far_need_no_network_faults_and_make_no_data(tmp_path):
  ctx = _ctx(tmp_path)
  recorded = _recorded_net_trial(tmp_path)
  so_far = net_fault_trials.BENCHMARK.recorded(ctx)
  assert so_far["trials"] == [recorded] and so_far["complete"] is False
  assert len(so_far["missing"]) == 5 * len(net_fault_trials.CASES) - 1
  assert "cut_worker_5s_0" not in so_far["missing"] and "cut_ps_30s_4" in so_far["missing"]
  assert so_far["summary"]["cut_worker_5s"]["finished"] == 1 and len(so_far["summary"]) == 1
  assert not os.path.exists(tmp_path / "w")


def test_each_trial_waits_for_a_quiet_machine_and_records_whether_it_got_one(tmp_path,
                                                                             monkeypatch):
  monkeypatch.setattr(machine, "load_1m", lambda: machine.cores() + 1.5)
  loaded = dataclasses.replace(_ctx(tmp_path), quiet=machine.Quiet(allow_load=True, settle_s=0))
  _, result = _run(loaded)
  assert [t["started_above_nproc_load"] for t in result["trials"]] == [True] * 4
  assert result["trials"][0]["load_1m_before"] == machine.cores() + 1.5
  # Not allowed above the cores: no trial runs, none is recorded.
  strict = dataclasses.replace(_ctx(tmp_path / "strict"),
                               quiet=machine.Quiet(allow_load=False, settle_s=0))
  with pytest.raises(machine.MachineLoaded, match="t a seed 0"):
    _run(strict)
  assert not os.path.exists(tmp_path / "strict" / "r" / "trials")
  # Without a policy (tests, children) it does not wait and marks nothing.
  _, result = _run(_ctx(tmp_path / "free"))
  assert {t["started_above_nproc_load"] for t in result["trials"]} == {None}
