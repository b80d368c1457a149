"""Soak: a long 2-way codistillation run on a local cluster with a teacher refresh every few
seconds; the resident memory (RSS) of every process must stay flat after warm-up (no leak from
reloading teachers) and the steps that overlap no refresh, publish or epoch end (which runs
evaluation and checkpoints) must meet a per-step rule (below).

The job is ``tf-codistill-launch`` as users run it: 2 groups, each a parameter-server cluster
(chief, 1 worker, 1 ps) on 127.0.0.1 ports, generated Criteo-format data, and
``trainer.train.max_wall_seconds`` ending training after ``duration_s``. By default
(``pin_groups``) each group runs on its own half of the CPUs, as on separate machines;
``pin_groups = False`` lets both share every CPU. Every ``sample_s`` the RSS of every task (from
/proc/<pid>/status) and of the launcher is sampled.

RSS is flat when, for every process, the median of the last fifth of the samples after warm-up
exceeds the median of the first fifth by at most max(``rss_tolerance_mib``,
``rss_tolerance_frac`` x RSS) (``judge``). Whether a growth has levelled off is reported as
``second_half_growth_mib``: the median of the last fifth minus that of the middle fifth.

Step times come from each chief's step timeline (trainer.train.save_step_timeline): under
parameter servers one interval per step the chief scheduled, from the previous step's finish on
the worker to its own (step_timing.ClosureTimer); and the windows of the group's teacher
refreshes (load began .. new teacher active) and publishes (snapshot .. written), all on the
host's monotonic clock. A *plain* step overlaps none of its own group's windows and no epoch end.
The rule (``STEP_RULE``, fixed before the first per-step run): per group, the 99th percentile of
plain steps is at most 3x their median, at most 0.1% of them take over 5x the median, and none
over 1 s. When the groups share CPUs, a slow step that overlaps the other group's refresh,
publish or epoch end is that group's work on the same cores and is reported but not counted.

  python -m benchmarks.run soak --gin_bindings='bench.soak.duration_s = 1200'
  python -m benchmarks.run soak --results_dir=/tmp/soak_shared_cpus \
      --gin_bindings='bench.soak.duration_s = 1200' --gin_bindings='bench.soak.pin_groups = False'
  cp /tmp/soak_shared_cpus/soak/summary.json benchmarks/results/soak/shared_cpus.json

write benchmarks/results/soak/summary.json (or ``<results_dir>/soak/``), report.md and beside
them the raw timelines (``step_timelines.json.gz``); the summary's row of docs/reliability.md is
``markdown_row``, which ``benchmarks.run`` puts into the doc after each run (reliability_doc.py:
the committed summary.json and, when there is one, shared_cpus.json).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import statistics
import threading
import time
from typing import Dict, List, Optional

import gin
import numpy as np

from benchmarks import fault_trials
from benchmarks import machine
from benchmarks import registry
from benchmarks import standalone
from tf_codistill import layout
from tf_codistill.launch import launcher

# The raw step timelines, beside summary.json in the results directory.
TIMELINES_FILE = "step_timelines.json.gz"

BINDINGS = fault_trials.SMALL_JOB + (
    "trainer.train.train_steps = 100000000",
    "tfc.Distillation.burn_in_steps = 20",
    "tfc.Exchange.keep_last = 2",
    "trainer.train.save_step_timeline = True",
)


def rss_kib(pid: int) -> Optional[int]:
  """VmRSS of ``pid`` in KiB (None once it has exited)."""
  with contextlib.suppress(OSError, ValueError):
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1])
  return None


class _Sampler:
  """Samples, every ``sample_s`` in the background, the RSS of the launcher and of every task
  it started, and when each group's training started (its chief's first heartbeat)."""

  def __init__(self, launch: standalone.Launch, sample_s: float):
    self.launch, self.sample_s = launch, sample_s
    self.rss_mib: Dict[str, List[List[float]]] = {}  # process -> [[t, rss_mib], ...]
    self.train_start: Dict[int, float] = {}  # group -> seconds after launch
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self) -> None:
    while not self._stop.is_set():
      now = time.monotonic() - self.launch.start
      procs = {"launcher": self.launch.proc.pid}
      procs.update({f"group_{g}/{t}_{k}": pid for (g, t, k), pid in self.launch.pids.items()})
      for group in (0, 1):
        if group not in self.train_start and os.path.exists(
            layout.group_run(self.launch.model_dir, group).heartbeat):
          self.train_start[group] = round(now, 1)
      for name, pid in procs.items():
        rss = rss_kib(pid)
        if rss is not None:
          self.rss_mib.setdefault(name, []).append([round(now, 1), round(rss / 1024.0, 1)])
      self._stop.wait(self.sample_s)

  def stop(self) -> None:
    self._stop.set()
    self._thread.join(timeout=10)


def _group_record(launch: standalone.Launch, group: int) -> dict:
  """A group's results and what its chief's log says about teacher loads and publishes."""
  results = launch.results(group) or {}
  chief_log = layout.group_run(launch.model_dir, group).task_log("chief", 0)
  log = open(chief_log, errors="replace").read() if os.path.exists(chief_log) else ""
  return {**{key: results.get(key) for key in ("steps", "teacher_loads", "step_time_ms",
                                                "examples_per_sec", "val_logloss")},
          "teacher_loads_logged": len(re.findall(r"teacher: loaded peer group", log)),
          "publishes_logged": len(re.findall(r"exchange: published step", log))}


def run_soak(work_dir: str, duration_s: float, publish_every_steps: int = 40,
             poll_interval_s: float = 0.5, steps_per_epoch: int = 2000, sample_s: float = 5.0,
             warmup_s: Optional[float] = None, strategy: str = "parameter_server",
             pin_groups: bool = True) -> dict:
  """Runs the soak job; returns its measurements (not yet judged: see ``judge``).

  ``pin_groups`` gives each group's tasks half of the CPUs (the launcher's --pin_groups), as if
  each group had its own machine: groups of a real deployment do not share cores.
  """
  data = fault_trials.ensure_data(os.path.join(work_dir, "data"))
  model_dir = os.path.join(work_dir, "job")
  shutil.rmtree(model_dir, ignore_errors=True)
  shape = (["--workers_per_group=1", "--ps_per_group=1"] if strategy == "parameter_server"
           else [])
  bindings = list(BINDINGS) + standalone.ctr_data_bindings(data) + [
      f"trainer.train.max_wall_seconds = {float(duration_s)}",
      f"tfc.Exchange.publish_every_steps = {publish_every_steps}",
      f"tfc.Exchange.poll_interval_s = {poll_interval_s}",
      f"trainer.train.steps_per_epoch = {steps_per_epoch}"]
  launch = standalone.Launch(standalone.launch_args(
      model_dir, "codistill_2way.gin",
      [f"--strategy={strategy}", "--num_groups=2", *shape,
       *(["--pin_groups"] if pin_groups else [])],
      bindings))
  sampler = _Sampler(launch, sample_s)
  cpus = dict(enumerate(launcher.split_cpus(2))) if pin_groups else {}
  # Training ends at max_wall_seconds after the chiefs start; startup and the final evaluation
  # come on top.
  code = launch.wait(timeout=duration_s + 600)
  sampler.stop()
  wall = time.monotonic() - launch.start
  timelines = {}
  for group in (0, 1):
    timeline_path = layout.group_run(model_dir, group).step_timeline
    if os.path.exists(timeline_path):
      timelines[str(group)] = machine.read_json(timeline_path)
  if warmup_s is None:
    warmup_s = min(180.0, 0.25 * duration_s)
  return {"exit_code": code, "duration_s": duration_s, "wall_s": round(wall, 1),
          "strategy": strategy, "publish_every_steps": publish_every_steps,
          "group_cpus": {str(g): sorted(c) for g, c in cpus.items()},
          "poll_interval_s": poll_interval_s, "sample_s": sample_s, "warmup_s": warmup_s,
          "groups": {str(g): _group_record(launch, g) for g in (0, 1)},
          "rss_mib": sampler.rss_mib, "timelines": timelines,
          "train_start_s": {str(g): t for g, t in sampler.train_start.items()},
          "stderr_tail": launch.stderr[-3000:] if code else ""}


def _overlaps(start: float, end: float, spans) -> bool:
  return any(start < w_end and w_start < end for w_start, w_end in spans)


# The step-time rule of the module docstring, fixed before the first per-step soak.
STEP_RULE = {"p99_max_x_median": 3.0, "slow_x_median": 5.0, "slow_max_fraction": 0.001,
             "max_step_s": 1.0}
_SHOWN_OUTLIERS = 50


def step_time_verdict(timelines: Dict[str, dict], peers_share_cpus: bool,
                      rule: Optional[Dict[str, float]] = None) -> Dict[str, dict]:
  """Per group: its plain steps (overlapping no refresh/publish window of its own and no epoch
  end), judged by ``rule`` (default ``STEP_RULE``), and which events of the other groups
  (refreshes, publishes, epoch ends) each slow step overlapped.

  ``timelines`` are the chiefs' step_timeline.json (trainer.train.save_step_timeline), all on the
  host's monotonic clock: under parameter servers one interval per scheduled step, timed as it
  finished on its worker (step_timing.ClosureTimer).
  """
  rule = {**STEP_RULE, **(rule or {})}
  origin = min((t["intervals"][0][0] for t in timelines.values() if t["intervals"]), default=0.0)
  verdict = {}
  for group, timeline in timelines.items():
    own = timeline["windows"].values()
    # Every interval but epoch ends, and whether it overlaps a refresh/publish of its own group.
    timed = [(s, e, n, any(_overlaps(s, e, spans) for spans in own))
             for s, e, n, epoch_end in timeline["intervals"] if not epoch_end]
    plain = [(s, e, n) for s, e, n, in_own in timed if not in_own]
    ms = [1000.0 * (e - s) / n for s, e, n in plain]
    median = statistics.median(ms) if ms else None
    peer_events = _peer_events(timelines, group)
    slow = [(s, step_ms, [k for k, spans in peer_events.items() if _overlaps(s, e, spans)])
            for (s, e, _), step_ms in zip(plain, ms) if step_ms > rule["slow_x_median"] * median]
    unexplained = sum(not names for _, _, names in slow)
    counted = unexplained if peers_share_cpus else len(slow)
    p99 = float(np.percentile(ms, 99)) if ms else None
    checks = {
        "p99": bool(ms) and p99 <= rule["p99_max_x_median"] * median,
        "slow_fraction": bool(ms) and counted <= rule["slow_max_fraction"] * len(ms),
        "max_step": bool(ms) and max(ms) <= 1000.0 * rule["max_step_s"]}
    every = [1000.0 * (e - s) / n for s, e, n, _ in timed]
    every_median = statistics.median(every) if every else None
    verdict[group] = {
        "plain_steps": len(plain), "plain_p50_ms": median and round(median, 2),
        "plain_p99_ms": p99 and round(p99, 2), "plain_max_ms": round(max(ms), 1) if ms else None,
        "plain_slow": len(slow), "during_peer_events": len(slow) - unexplained,
        "unexplained": unexplained, "counted": counted,
        # How telling "during a peer event" is: how many plain steps overlap none.
        "plain_clear_of_peer_events": sum(
            not any(_overlaps(s, e, spans) for spans in peer_events.values()) for s, e, _ in plain),
        "steps_in_own_windows": len(timed) - len(plain),
        "outliers": [{"at_s": round(s - origin, 2), "step_ms": round(step_ms, 1),
                      "x_median": round(step_ms / median, 2), "during": names}
                     for s, step_ms, names in slow[:_SHOWN_OUTLIERS]],
        "all_steps": len(every), "all_p50_ms": every_median and round(every_median, 2),
        "all_p99_ms": round(float(np.percentile(every, 99)), 2) if every else None,
        "rule": rule, "checks": checks, "ok": all(checks.values())}
  return verdict


def _peer_events(timelines: Dict[str, dict], group: str) -> Dict[str, list]:
  """The refresh, publish and epoch-end spans of every group but ``group``, by name."""
  events = {}
  for peer, other in timelines.items():
    if peer != group:
      for name, spans in other["windows"].items():
        events[f"group {peer} {name}"] = spans
      events[f"group {peer} epoch end"] = [
          (s, e) for s, e, _, epoch_end in other["intervals"] if epoch_end]
  return events


def judge(run: dict, rss_tolerance_mib: float = 40.0, rss_tolerance_frac: float = 0.05) -> dict:
  """Adds the verdicts: per-process RSS growth after warm-up, step-time outliers, refreshes."""
  rss = {}
  for name, series in run["rss_mib"].items():
    # Only the samples of the training phase after warm-up: from the group's training start
    # (its chief's first heartbeat; the launcher: the earlier group) + warmup_s until training
    # ends (start + duration_s), not the final evaluation, export and shutdown.
    starts = run["train_start_s"]
    group = name.split("/")[0].replace("group_", "") if name.startswith("group_") else None
    start = starts.get(group) if group is not None else min(starts.values(), default=None)
    if start is None:
      rss[name] = {"samples": 0, "flat": None}
      continue
    values = [v for t, v in series
              if start + run["warmup_s"] <= t <= start + run["duration_s"]]
    if len(values) < 5:
      rss[name] = {"samples": len(values), "flat": None}
      continue
    fifth = max(1, len(values) // 5)
    first, last = statistics.median(values[:fifth]), statistics.median(values[-fifth:])
    growth = last - first
    tolerance = max(rss_tolerance_mib, rss_tolerance_frac * first)
    middle = statistics.median(values[2 * fifth:3 * fifth])
    rss[name] = {"samples": len(values), "after_warmup_mib": first, "end_mib": last,
                 "growth_mib": round(growth, 1), "max_mib": max(values),
                 "second_half_growth_mib": round(last - middle, 1),
                 "tolerance_mib": round(tolerance, 1), "flat": growth <= tolerance}
  pinned = bool(run.get("group_cpus"))
  steps = step_time_verdict(run["timelines"], peers_share_cpus=not pinned)
  loads = [g.get("teacher_loads") or 0 for g in run["groups"].values()]
  verdict = {
      "rss": rss, "step_times": steps,
      "rss_flat": all(r["flat"] for r in rss.values() if r["flat"] is not None)
      and any(r["flat"] is not None for r in rss.values()),
      "step_times_ok": all(s["ok"] for s in steps.values()),
      "refreshes": loads,
      "refresh_every_s": [round(run["duration_s"] / n, 2) if n else None for n in loads],
      "finished": run["exit_code"] == 0,
      "groups_pinned": pinned,
  }
  verdict["ok"] = bool(verdict["finished"] and verdict["rss_flat"] and verdict["step_times_ok"]
                       and min(loads) >= 3)
  return verdict


def markdown_row(summary: dict) -> str:
  """The soak row of the docs/reliability.md table."""
  v, run = summary["verdict"], summary["run"]
  growth = max((r["growth_mib"] for r in v["rss"].values() if r.get("flat") is not None),
               default=None)
  worst = max(v["rss"].items(), key=lambda kv: kv[1].get("growth_mib", -1e9))[0]
  groups = v["step_times"].values()
  total = lambda key: sum(s[key] for s in groups)
  rule = next(iter(groups))["rule"] if groups else STEP_RULE
  steps = (f"{total('plain_steps')} plain steps (p50 "
           f"{'/'.join(str(s['plain_p50_ms']) for s in groups)} ms, p99 "
           f"{'/'.join(str(s['plain_p99_ms']) for s in groups)} ms, max "
           f"{'/'.join(str(s['plain_max_ms']) for s in groups)} ms), {total('plain_slow')} over "
           f"{rule['slow_x_median']:g}x the median")
  if v["groups_pinned"]:
    cpus = "each group pinned to its own CPU(s) " + "/".join(
        ",".join(map(str, c)) for _, c in sorted(run["group_cpus"].items()))
  else:
    cpus = "both groups sharing all CPUs"
    steps += (f", {total('during_peer_events')} of them during the other group's refresh, "
              f"publish or epoch end, {total('unexplained')} unexplained")
  steps += (f" (rule: p99 <= {rule['p99_max_x_median']:g}x median, <= "
            f"{100 * rule['slow_max_fraction']:g}% over {rule['slow_x_median']:g}x, none over "
            f"{rule['max_step_s']:g} s)")
  return (f"| soak: 2-way codistillation, {run['strategy']} groups, {cpus}, "
          f"{run['duration_s'] / 60.0:g} min, teacher refresh every "
          f"{'/'.join(str(x) for x in v['refresh_every_s'])} s | 1 | "
          f"{'finished' if v['finished'] else 'FAILED'}; {sum(v['refreshes'])} teacher loads; "
          f"RSS {'flat' if v['rss_flat'] else 'NOT flat'} after warm-up (largest growth "
          f"{growth} MiB, {worst}, over {len(v['rss'])} processes); {steps}: step times "
          f"{'ok' if v['step_times_ok'] else 'NOT ok'} | - | - | - |")


@gin.configurable("soak", module="bench", denylist=["ctx"])
def measure_soak(ctx: registry.Context, duration_s: float = 1200.0, publish_every_steps: int = 40,
                 poll_interval_s: float = 0.5, sample_s: float = 5.0,
                 strategy: str = "parameter_server", pin_groups: bool = True) -> dict:
  """The soak job's measurements and verdict; its raw step timelines go to TIMELINES_FILE.

  Args:
    ctx: the run's context (data and the job go under its work_dir).
    duration_s: training time (trainer.train.max_wall_seconds).
    publish_every_steps: publish interval (steps).
    poll_interval_s: how often each task looks for new teachers.
    sample_s: RSS sampling interval.
    strategy: each group's strategy.
    pin_groups: give each group half of the CPUs, as if it had its own machine; False lets both
      groups share every CPU.
  """
  work = ctx.work_dir
  duration_s, poll_interval_s, sample_s = float(duration_s), float(poll_interval_s), float(sample_s)
  started = time.time()
  run = run_soak(work, duration_s, publish_every_steps, poll_interval_s, sample_s=sample_s,
                 strategy=strategy, pin_groups=pin_groups)
  summary = {"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg(),
             "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
             "verdict": judge(run), "run": run}
  # The raw step timelines (one interval per step: megabytes) go beside the summary, gzipped.
  os.makedirs(ctx.results_dir, exist_ok=True)
  timelines_path = os.path.join(ctx.results_dir, TIMELINES_FILE)
  with gzip.open(timelines_path + ".tmp", "wt") as f:
    json.dump(run.pop("timelines"), f)
  os.replace(timelines_path + ".tmp", timelines_path)
  summary["timelines_file"] = TIMELINES_FILE
  ctx.progress(json.dumps(summary["verdict"], indent=1) + "\n" + markdown_row(summary))
  shutil.rmtree(os.path.join(work, "job"), ignore_errors=True)
  return summary


def _failure(summary: dict) -> Optional[str]:
  """The soak's verdict when it is not ok (the run then exits 1)."""
  return None if summary["verdict"]["ok"] else "the soak's verdict is NOT ok"


def _tables(summary: dict) -> List[str]:
  """The row of docs/reliability.md, then every process's RSS and every group's step times."""
  lines = standalone.markdown_table(fault_trials.TABLE_HEADER, []).splitlines()
  lines += [markdown_row(summary), "",
            "| process | samples | after warm-up MiB | end MiB | growth MiB | second half MiB "
            "| tolerance MiB | flat |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for name, r in sorted(summary["verdict"]["rss"].items()):
    cells = [r.get(key, "-") for key in ("after_warmup_mib", "end_mib", "growth_mib",
                                         "second_half_growth_mib", "tolerance_mib")]
    lines.append(f"| {name} | {r['samples']} | " + " | ".join(map(str, cells))
                 + f" | {r['flat']} |")
  lines += ["", "| group | plain steps | p50 ms | p99 ms | max ms | slow | during peer events "
            "| unexplained | in own windows | ok |", "|" + " --- |" * 10]
  for group, s in sorted(summary["verdict"]["step_times"].items()):
    lines.append(f"| {group} | " + " | ".join(str(s[key]) for key in (
        "plain_steps", "plain_p50_ms", "plain_p99_ms", "plain_max_ms", "plain_slow",
        "during_peer_events", "unexplained", "steps_in_own_windows", "ok")) + " |")
  if summary.get("timelines_file"):
    lines += ["", f"Raw step timelines: `{summary['timelines_file']}`."]
  return lines


BENCHMARK = registry.Benchmark(
    "soak", measure_soak, tables=_tables, failure=_failure,
    title="Soak: 2-way codistillation with teacher refreshes every few seconds")
