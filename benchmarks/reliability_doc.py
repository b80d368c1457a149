"""Regenerates the measured table of docs/reliability.md from the fault-trial and soak summaries.

  .venv/bin/python -m benchmarks.fault_trials --trials=10   # benchmarks/results/fault_trials/
  .venv/bin/python -m benchmarks.soak --duration_s=1200     # benchmarks/results/soak/
  .venv/bin/python -m benchmarks.reliability_doc            # rewrites the table in the doc

Only the part of docs/reliability.md between the ``<!-- measured:begin -->`` and
``<!-- measured:end -->`` markers is replaced; the numbers come from the summaries, never by hand.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Sequence

from benchmarks import fault_trials
from benchmarks import soak
from benchmarks import standalone

DOC = os.path.join(standalone.REPO, "docs", "reliability.md")
BEGIN, END = "<!-- measured:begin -->", "<!-- measured:end -->"


def measured_section(faults_path: str = standalone.results_path("fault_trials"),
                     soak_paths: Sequence[str] = (soak.DEFAULT_OUT, soak.SHARED_CPUS_OUT)) -> str:
  """The table (kill trials, then one row per soak summary) and a paragraph per measurement."""
  soaks = []
  for path in soak_paths:
    if os.path.exists(path):
      with open(path) as f:
        soaks.append(json.load(f))
  parts = []
  if os.path.exists(faults_path):
    with open(faults_path) as f:
      faults = json.load(f)
    parts.append("\n".join(fault_trials.markdown_table(faults).splitlines()
                           + [soak.markdown_row(summary) for summary in soaks]))
    parts.append(
        f"Kill trials: `{faults['command']}`, {faults['started_utc']}, {faults['wall_s'] / 60:.0f} "
        f"min, {faults['cpus']} CPUs, load average at the end {faults['load_avg_at_end'][0]:.1f} "
        f"(machine shared with other jobs). Kill steps per kind: " + "; ".join(
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
        f"Soak: `{summary['command']}`, {summary['started_utc']}, {run['duration_s'] / 60:g} min "
        f"of training ({run['wall_s'] / 60:.1f} min wall), warm-up {run['warmup_s']:g} s, RSS "
        f"sampled every {run['sample_s']:g} s; load average at the end "
        f"{summary['load_avg_at_end'][0]:.1f}. RSS after warm-up -> end: {rss}. Step times "
        f"(each scheduled step, timed as it finished on its worker): {times}."
        + (f" {summary['note']}" if summary.get("note") else ""))
  return "\n\n".join(parts) if parts else "(no measurements yet)"


def main() -> None:
  with open(DOC) as f:
    text = f.read()
  if BEGIN not in text or END not in text:
    sys.exit(f"{DOC} has no {BEGIN} ... {END} section")
  head, rest = text.split(BEGIN, 1)
  _, tail = rest.split(END, 1)
  with open(DOC, "w") as f:
    f.write(f"{head}{BEGIN}\n{measured_section()}\n{END}{tail}")
  print(f"updated {DOC}")


if __name__ == "__main__":
  main()
