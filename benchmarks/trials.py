"""Seeded fault trials that go on across invocations (fault_trials, net_fault_trials): cases
interleaved seed by seed, since the machine's load drifts over a run; each trial recorded as it
ends (``<results_dir>/trials/<case>_<seed>.json``) and kept by a later run with the same
settings, so a stopped run resumes trial by trial. A record names the library
sources it ran (``library_sources``, a digest of ``tf_codistill/``) but is kept under other ones
too: after a change to the launcher or the recovery code, remove ``trials/`` to measure again."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from typing import Callable, List, Optional, Sequence

from benchmarks import machine
from benchmarks import registry
from benchmarks import standalone


def run_interleaved(ctx: registry.Context, cases: Sequence[str], trials: int, settings: dict,
                    run_one: Callable[[str, int], dict],
                    scratch: Callable[[str, int], Sequence[str]], run_missing: bool = True
                    ) -> dict:
  """Every (case, seed) trial, recorded or run now (``run_one(case, seed)``, its ``scratch``
  folders removed after), each on a machine as quiet as ``ctx.quiet`` asks (the trial before it
  leaves processes whose load decays for a minute or two); the run's record, its trials under
  ``trials``. With ``run_missing`` False nothing runs: the record of the trials recorded so
  far, the others listed under ``missing`` (``complete`` says whether there are any)."""
  records, missing, start = [], [], time.time()
  sources = standalone.source_digest(("tf_codistill",)) if run_missing else None
  for seed in range(trials):
    for case in cases:
      record = machine.recorded(_path(ctx.results_dir, case, seed), settings)
      if record is None and not run_missing:
        missing.append(f"{case}_{seed}")
        continue
      if record is None:
        load, above = ctx.settle(f"{case} seed {seed}")
        record = {**run_one(case, seed), "settings": settings, "library_sources": sources,
                  "load_1m_before": load, "started_above_nproc_load": above,
                  "load_1m_at_end": os.getloadavg()[0],
                  "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        machine.write_json(_path(ctx.results_dir, case, seed), record, indent=1)
        for folder in scratch(case, seed):
          shutil.rmtree(folder, ignore_errors=True)
      records.append(record)
      if run_missing:
        ctx.progress(json.dumps({k: v for k, v in record.items() if k != "stderr_tail"}))
  result = {"cpus": os.cpu_count(), "wall_s": round(sum(t["wall_s"] for t in records), 1),
            "trials": records, "missing": missing, "complete": not missing}
  if run_missing:  # a run's own record: when it started and the load it left
    result.update(load_avg_at_end=os.getloadavg(),
                  started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)))
  return result


def _path(results_dir: str, case: str, seed: int) -> str:
  return os.path.join(results_dir, "trials", f"{case}_{seed}.json")


def spread(values: Sequence[float]) -> Optional[dict]:
  """Median, min and max of ``values`` (None when there are none)."""
  if not values:
    return None
  return {"median": round(statistics.median(values), 2), "min": min(values),
          "max": max(values)}


def spread_cell(values: Optional[dict], fmt: str) -> str:
  """A ``spread`` as a table cell, ``median (min-max)`` in ``fmt``; '-' without one."""
  if values is None:
    return "-"
  return f"{values['median']:{fmt}} ({values['min']:{fmt}}-{values['max']:{fmt}})"


def failed(summary: dict) -> List[dict]:
  """The trials of a run's record that did not end as they should."""
  return [t for t in summary.get("trials", []) if not t.get("ok")]


def failure(what: str) -> Callable[[dict], Optional[str]]:
  """A ``registry.Benchmark.failure``: how many trials ``what`` (e.g. "did not recover"), if
  any did (the run then exits 1)."""
  return lambda summary: f"{len(failed(summary))} trial(s) {what}" if failed(summary) else None


def failed_lines(summary: dict, what: str, case_key: str, parts: Sequence[str]) -> List[str]:
  """report.md's list of the trials that ``what`` (e.g. "did not recover"), each with its error
  or the record's ``parts``; no lines when every trial ended well."""
  trials = failed(summary)
  if not trials:
    return []
  return ["", f"**{len(trials)} trial(s) {what}:**", ""] + [
      f"- {t[case_key]} seed {t['seed']}: "
      + (t.get("error") or ", ".join(f"{part}={t.get(part)}" for part in parts)) for t in trials]
