"""The results index (``benchmarks/results/README.md``): "Does codistillation help?" per real data
set run under the pre-registered protocol, then every benchmark's goal figures, read from each
``<name>/summary.json`` (``benchmarks.run`` rewrites it after every run)."""

from __future__ import annotations

import os
import re
from typing import Dict, List, Mapping, Optional

from benchmarks import machine
from benchmarks import registry
from benchmarks import report

REAL_DATA = {"fashion_mnist": "Fashion-MNIST", "adult": "Adult census", "kjv": "King James Bible",
             "debian_english": "English text from Debian (16M words)",
             "debian_kernel": "Linux kernel C source"}
# The project's goals across data sets: (goal, how many real data sets must meet it).
ACROSS_DATA_SETS = (("codistill_minus_best_sync_loss", 2), ("codistill_steps_ratio", 1),
                    ("churn_reduction", 2))
SAME_DATA = "codistill_same_minus_best_sync_loss"  # both groups on all the data
CAPTURED = "ensemble_gain_captured"  # what codistillation took of what an ensemble gains
# The alternatives between groups (parameter averaging), in the suites that run them.
ALTERNATIVES = (("diloco_h500_minus_best_sync_loss", "DiLoCo (H = 10K): best val loss − best sync"),
                ("local_sgd_h500_minus_best_sync_loss",
                 "local SGD (H = 10K): best val loss − best sync"),
                ("best_cross_group_steps_ratio",
                 "best method sending >= 100x fewer bytes than all-reduce: steps / sync"))


def _summaries(results_root: str) -> Dict[str, dict]:
  """Every ``<name>/summary.json``, keyed by benchmark name (earlier variants under
  ``<name>/history/`` are not figures of record, and are left out)."""
  out = {}
  for name in sorted(os.listdir(results_root)):
    path = os.path.join(results_root, name, "summary.json")
    if os.path.isfile(path):
      out[name] = machine.read_json(path)
  return out


def _cpu_cell(summary: dict) -> str:
  """The CPU model(s) a summary's figures were taken on, or "not recorded"."""
  return " / ".join(sorted(set(report.cpu_models(summary)) - {"not recorded"})) or "not recorded"


def _tensorflow_cell(summary: dict) -> str:
  """The TensorFlow version(s) a summary's figures were taken on, or "not recorded"."""
  return " / ".join(report.tensorflow_versions(summary)) or "not recorded"


def _cell(summary: dict, goal: str) -> str:
  """A goal's value, interval and verdict in one table cell."""
  goals, verdict = summary.get("goals") or {}, (summary.get("goal_verdicts") or {}).get(goal)
  shown = report.format_value(goals.get(goal))
  interval = report.format_interval(goals, goal)
  met = "" if not verdict else (" **missed**" if verdict.get("missing") else
                                (" met" if verdict["met"] else " **not met**"))
  return f"{shown} {interval}{met}".strip()


def in_progress(results_root: str) -> Dict[str, str]:
  """{suite: its data} of the suites on real data whose runs are recorded (a report.md) but whose
  summary is not written yet (an arm still to run)."""
  found = {}
  for name in registry.suites():
    folder = os.path.join(results_root, name)
    if (not os.path.exists(os.path.join(folder, "report.md"))
        or os.path.exists(os.path.join(folder, "summary.json"))):
      continue
    with open(os.path.join(registry.SUITES_DIR, f"{name}.gin")) as f:
      data = re.search(r"^bench\.Suite\.data = '(\w+)'", f.read(), re.MULTILINE)
    if data and data.group(1) in REAL_DATA:
      found[name] = data.group(1)
  return found


def helps_section(summaries: Mapping[str, dict], running: Optional[Mapping[str, str]] = None
                  ) -> List[str]:
  """"Does codistillation help?": per real data set run under the pre-registered protocol, what
  codistillation reached against the best synchronous arm, and the goals across data sets;
  ``running``: the suites still in progress (in_progress)."""
  running = running or {}
  protocol_runs = {n: s for n, s in summaries.items()
                   if s.get("target_rule") == "best_sync" and s.get("data") in REAL_DATA}
  lines = ["## Does codistillation help?", "",
           "Suites run under the pre-registered protocol (sync scaling to find B*, the sync "
           "arms tuned over a learning-rate grid and every other arm run at sync B*'s rate, "
           "several seeds, 90% bootstrap intervals; each suite's description states it). A goal "
           "whose value is missing is missed.", ""]
  if protocol_runs:
    lines += ["| data set | suite | B* | best val loss: codistillation − best sync | "
              "steps to best sync's best loss: codistillation / sync | churn reduction at "
              "matched loss | the same on all the data: best val loss − best sync | share of "
              "the ensemble's gain captured | "
              + " | ".join(title for _, title in ALTERNATIVES) + " | curves |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, summary in protocol_runs.items():
      scaling = (summary.get("protocol") or {}).get("scaling") or {}
      b_star = f"{scaling['b_star']} (given)" if scaling.get("given") else scaling.get("b_star", "")
      lines.append(f"| {REAL_DATA[summary['data']]} | [`{name}`]({name}/report.md) | "
                   f"{b_star or '(set)'} | "
                   + " | ".join(_cell(summary, g) for g, _ in ACROSS_DATA_SETS)
                   + "".join(f" | {_cell(summary, g) if g in summary['goals'] else 'n/a'}"
                             for g in (SAME_DATA, CAPTURED, *(g for g, _ in ALTERNATIVES)))
                   + f" | [loss vs steps]({name}/val_loss_vs_steps.png) |")
    lines += ["", "Codistillation's groups train on disjoint halves of the data (the paper's "
              "setting); the last column is 2-way codistillation with both groups on all the "
              "data. B* (set): taken from another suite's scaling phase (its description says "
              "which).", ""]
  for goal, needed in ACROSS_DATA_SETS:
    met = sorted({REAL_DATA[s["data"]] for s in protocol_runs.values()
                  if ((s.get("goal_verdicts") or {}).get(goal) or {}).get("met")})
    lines.append(f"- `{goal}` met on {len(met)} real data set(s)"
                 f"{': ' + ', '.join(met) if met else ''}"
                 f" (needed: {needed}): **{'met' if len(met) >= needed else 'missed'}**")
  if running:
    lines.append("- in progress under the protocol (runs recorded, figures once every arm has "
                 "run): " + ", ".join(f"{REAL_DATA[data]} ([`{name}`]({name}/report.md))"
                                      for name, data in sorted(running.items())))
  missing = sorted(set(REAL_DATA.values())
                   - {REAL_DATA[s["data"]] for s in protocol_runs.values()}
                   - {REAL_DATA[data] for data in running.values()})
  if missing:
    lines.append(f"- not yet run under the protocol: {', '.join(missing)}")
  lines += ["- the other suites below predate the protocol (short runs, untuned baselines, and "
            "many taken at machine loads far above 2 cores); read them as smoke tests", ""]
  return lines


def index_markdown(results_root: str) -> str:
  """The "Does codistillation help?" section, then one table of every benchmark's goal figures,
  read from each ``<name>/summary.json``."""
  summaries = _summaries(results_root)
  lines = ["# Benchmark results", "",
           "Generated from each benchmark's `summary.json` by `benchmarks.run` after every run "
           "(numbers are never typed in). Each `report.md` starts with the command that "
           "regenerates it; earlier variants are under each folder's `history/`.", ""]
  lines += helps_section(summaries, in_progress(results_root))
  lines += ["## Every suite's goal figures", "",
            "| suite | goal figure | value | 90% interval | spread (mean ± std [min, max]) | goal "
            "| met | CPU | TensorFlow |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for name, summary in summaries.items():
    link = f"[`{name}`]({name}/report.md)" if os.path.exists(
        os.path.join(results_root, name, "report.md")) else f"`{name}`"
    rows, where = report.goal_rows(summary), f"{_cpu_cell(summary)} | {_tensorflow_cell(summary)}"
    if not rows:
      lines.append(f"| {link} | (no goal figures) | | | | | | {where} |")
    lines += [f"| {link} | `{goal}` | " + " | ".join(cells) + f" | {where} |"
              for goal, *cells in rows]
  return "\n".join(lines) + "\n"


def write_index(results_root: str) -> str:
  """Writes ``results_root/README.md`` (the index of all suites' goals); returns its path."""
  return machine.write_text(os.path.join(results_root, "README.md"),
                            index_markdown(results_root))
