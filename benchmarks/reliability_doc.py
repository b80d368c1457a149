"""The measured section of docs/reliability.md, from the fault-trial, soak and network-fault
summaries: ``python -m benchmarks.run`` rewrites it after each of those benchmarks (and with
``--report_only``) when it writes to the committed results directory.

The soak with shared CPUs (``bench.soak.pin_groups = False``, run with another --results_dir) has
a row too once its summary is copied to benchmarks/results/soak/shared_cpus.json (soak.py shows
how). Only the part of docs/reliability.md between the ``<!-- measured:begin -->`` and
``<!-- measured:end -->`` markers is replaced; the numbers come from the summaries, never by hand.
"""

from __future__ import annotations

import os
from typing import Sequence

from benchmarks import fault_trials
from benchmarks import machine
from benchmarks import net_fault_trials
from benchmarks import registry
from benchmarks import soak
from benchmarks import standalone

DOC = os.path.join(os.path.dirname(registry.BENCHMARKS_DIR), "docs", "reliability.md")
SOURCES = ("fault_trials", "soak", "net_fault_trials")  # the benchmarks whose summaries it shows
BEGIN, END = "<!-- measured:begin -->", "<!-- measured:end -->"
# The committed summaries the section is made from.
FAULTS_SUMMARY = os.path.join(registry.RESULTS_DIR, "fault_trials", "summary.json")
SOAK_SUMMARY = os.path.join(registry.RESULTS_DIR, "soak", "summary.json")
NET_SUMMARY = os.path.join(registry.RESULTS_DIR, "net_fault_trials", "summary.json")
# The same soak with both groups on every CPU (bench.soak.pin_groups = False), copied here.
SHARED_CPUS_SOAK_SUMMARY = os.path.join(registry.RESULTS_DIR, "soak", "shared_cpus.json")


def _when(faults: dict) -> str:
  """When the kill trials were recorded: the first and last trial's end (a run resumed across
  sessions), else the run's start."""
  ends = sorted(t["finished_utc"] for t in faults.get("trials", []) if t.get("finished_utc"))
  return f"trials recorded {ends[0]} to {ends[-1]}" if ends else faults["started_utc"]


def _load(faults: dict) -> str:
  """The machine's load as the kill trials' summary records it."""
  share = (faults.get("machine") or {}).get("foreign_cpu_share")
  if share is None:  # a summary made before the machine record: the load at its end only
    return (f"load average at the end {faults['load_avg_at_end'][0]:.1f} (machine shared with "
            "other jobs)")
  return (f"each trial's load before it and at its end in its record (every one started at or "
          f"below {max(t.get('load_1m_before') or 0.0 for t in faults['trials']):.1f}), CPU used "
          f"by other processes during the last run {share:.1%}")


def measured_section(faults_path: str = FAULTS_SUMMARY,
                     soak_paths: Sequence[str] = (SOAK_SUMMARY, SHARED_CPUS_SOAK_SUMMARY),
                     net_path: str = NET_SUMMARY) -> str:
  """The table (kill trials, then one row per soak summary) and a paragraph per measurement,
  then the network faults' table where they were measured."""
  soaks = [machine.read_json(path) for path in soak_paths if os.path.exists(path)]
  parts = []
  if os.path.exists(faults_path):
    faults = machine.read_json(faults_path)
    parts.append("\n".join(fault_trials.markdown_table(faults).splitlines()
                           + [soak.markdown_row(summary) for summary in soaks]))
    parts.append(
        f"Kill trials: {standalone.command_line(faults, 'fault_trials')}, {_when(faults)}, "
        f"{faults['wall_s'] / 60:.0f} min of trials, {faults['cpus']} CPUs, {_load(faults)}. "
        "Kill steps per kind: " + "; ".join(
            f"{kind} {row['kill_steps']}" for kind, row in faults["summary"].items()) + ".")
  for summary in soaks:
    run, verdict = summary["run"], summary["verdict"]
    rss = "; ".join(f"{name} {r['after_warmup_mib']:.0f} -> {r['end_mib']:.0f} MiB "
                    f"({r['second_half_growth_mib']:+.1f} in the second half)"
                    for name, r in sorted(verdict["rss"].items()) if r.get("flat") is not None)
    times = "; ".join(
        f"group {g}: plain step p50 {s['plain_p50_ms']:.1f} ms, p99 {s['plain_p99_ms']:.1f} ms, "
        f"max {s['plain_max_ms']:.1f} ms, {s['plain_slow']} of {s['plain_steps']} over "
        f"{s['rule']['slow_x_median']:g}x the median ({s['during_peer_events']} during the other "
        f"group's refresh/publish/epoch end, {s['unexplained']} unexplained), "
        f"{s['steps_in_own_windows']} steps overlapping its own refresh/publish"
        for g, s in sorted(verdict["step_times"].items()) if s["plain_steps"])
    parts.append(
        f"Soak: {standalone.command_line(summary, 'soak')}, {summary['started_utc']}, "
        f"{run['duration_s'] / 60:g} min of training ({run['wall_s'] / 60:.1f} min wall), "
        f"warm-up {run['warmup_s']:g} s, RSS "
        f"sampled every {run['sample_s']:g} s; load average at the end "
        f"{summary['load_avg_at_end'][0]:.1f}. RSS after warm-up -> end: {rss}. Step times "
        f"(each scheduled step, timed as it finished on its worker): {times}."
        + (f" {summary['note']}" if summary.get("note") else ""))
  if os.path.exists(net_path):
    net = machine.read_json(net_path)
    parts.append(net_fault_trials.markdown_table(net))
    if net.get("complete", True):
      parts.append(
          f"Network fault trials: `{net['command']}`, {net['started_utc']}, "
          f"{net['wall_s'] / 60:.0f} min, {net['cpus']} CPUs, load average at the end "
          f"{net['load_avg_at_end'][0]:.1f}, stall watchdog {net['stall_timeout_s']:g} s.")
    else:
      parts.append(
          f"Network fault trials, **partial**: {len(net['trials'])} trials recorded, "
          f"{len(net['missing'])} not yet (the table counts the recorded ones); "
          f"`{net['command']}`, {net['wall_s'] / 60:.0f} min of trials recorded, stall watchdog "
          f"{net['stall_timeout_s']:g} s; each trial's load before it and at its end is in its "
          "record (`benchmarks/results/net_fault_trials/trials/`).")
  return "\n\n".join(parts) if parts else "(no measurements yet)"


def write(doc: str = DOC) -> str:
  """Rewrites ``doc``'s measured section from the committed summaries; returns its path."""
  with open(doc) as f:
    text = f.read()
  if BEGIN not in text or END not in text:
    raise ValueError(f"{doc} has no {BEGIN} ... {END} section")
  head, rest = text.split(BEGIN, 1)
  _, tail = rest.split(END, 1)
  return machine.write_text(doc, f"{head}{BEGIN}\n{measured_section()}\n{END}{tail}")
