"""A suite's Markdown report and PNG plots, generated from its summary.json and recorded curves."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from benchmarks import runner


_LOSS_NAMES = {"val_logloss": "log loss", "val_loss": "cross-entropy"}


def _fmt(stat: Optional[dict], digits: int = 4, scale: float = 1.0) -> str:
  """mean ± std [min, max] (n) of a runner._stat, or 'n/a'."""
  if not stat:
    return "n/a"
  mean, lo, hi = stat["mean"] * scale, stat["min"] * scale, stat["max"] * scale
  if stat["n"] == 1:
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} ± {stat['std'] * scale:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def plot_curves(summary: dict, results_dir: str) -> List[str]:
  """Validation loss vs steps and vs wall time, one line per arm (mean over its runs)."""
  written = []
  loss_key = summary.get("loss_key", runner.LOSS_KEY)
  for x_key, x_label, name in (("step", "steps (per group)", "val_loss_vs_steps.png"),
                               ("wall_time_s", "wall time (s)", "val_loss_vs_wall_time.png")):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm_name, arm in summary["arms"].items():
      curves = [runner.read_curve(os.path.join(results_dir, r["curve"])) for r in arm["runs"]]
      points = [[(c[x_key], c[loss_key]) for c in curve if loss_key in c]
                for curve in curves]
      points = [p for p in points if p]
      if not points:
        continue
      if len(points[0]) == 1:  # a computed arm (ensemble): one point per run
        ax.scatter([p[0][0] for p in points], [p[0][1] for p in points], label=arm_name,
                   marker="*", s=80, zorder=3)
        continue
      n = min(len(p) for p in points)
      xs = [sum(p[i][0] for p in points) / len(points) for i in range(n)]
      ys = [sum(p[i][1] for p in points) / len(points) for i in range(n)]
      ax.plot(xs, ys, label=f"{arm_name} ({len(points)} run{'s' * (len(points) > 1)})")
    if summary.get("target_loss") is not None:
      ax.axhline(summary["target_loss"], color="gray", linestyle="--", linewidth=1,
                 label=f"target {summary['target_loss']:.4f}")
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"validation {_LOSS_NAMES.get(loss_key, loss_key)}")
    ax.set_title(f"{summary['suite']}: validation loss vs {x_label.split(' (')[0]}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    finals = [a["final_val_loss"]["min"] for a in summary["arms"].values() if a["final_val_loss"]]
    starts = [c.get(loss_key) for a in summary["arms"].values() for r in a["runs"][:1]
              for c in runner.read_curve(os.path.join(results_dir, r["curve"]))[:1]]
    if finals and starts:
      # Zoom on the part of the curves where arms differ.
      top = sorted(s for s in starts if s is not None)[len(starts) // 2]
      ax.set_ylim(min(finals) - 0.002, max(top, min(finals) + 0.01))
    fig.tight_layout()
    path = os.path.join(results_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
  return written


def markdown(summary: dict, command: str, plots: Sequence[str]) -> str:
  """The report: description, command, goal figures, per-arm table, churn, plots."""
  lines = [f"# Benchmark suite `{summary['suite']}`", ""]
  if summary.get("description"):
    lines += [summary["description"].strip(), ""]
  lines += ["Regenerate (numbers below come from that run's `summary.json`, never typed in):", "",
            "```sh", command, "```", ""]
  data = {"criteo_like": "generated Criteo-format TSV (planted model, data_pipelines/"
          "make_criteo_like.py)", "adult": "UCI Adult census (real data; data_pipelines/README.md)",
          "kjv": "the King James Bible, word tokens (real data; data_pipelines/README.md)",
          "fashion_mnist": "Fashion-MNIST as ImageNet-style TFRecords (real data; "
          "data_pipelines/README.md)"}
  loss_name = _LOSS_NAMES.get(summary.get("loss_key", runner.LOSS_KEY), "loss")
  softmax = summary.get("output") == "softmax"
  lines += [f"- data: {data.get(summary['data'], summary['data'])}",
            f"- shared bindings: `{'`, `'.join(summary['common_bindings']) or 'none'}`"]
  if summary.get("target_loss") is not None:
    origin = (f" (final loss of `{summary['target_from_arm']}`)" if summary.get("target_from_arm")
              else "")
    lines.append(f"- target validation {loss_name}: {summary['target_loss']:.4f}{origin}")
  if summary.get("simulated"):
    lines.append(f"- simulated: {summary['simulated']}")
  loads = [r["load_avg_1m_at_end"] for a in summary["arms"].values() for r in a["runs"]
           if r.get("load_avg_1m_at_end") is not None]
  if loads:
    lines.append(f"- machine load (1-minute load average at the end of each run, "
                 f"{os.cpu_count()} cores): {min(loads):.1f} to {max(loads):.1f}; wall times and "
                 f"examples/s are only comparable between runs at similar load")
  lines.append("")
  if summary["goals"]:
    lines += ["## Goals", "", "| goal | value | spread over runs (mean ± std [min, max]) | goal | met |",
              "| --- | --- | --- | --- | --- |"]
    for name, value in summary["goals"].items():
      verdict = summary["goal_verdicts"].get(name)
      threshold = f"{verdict['threshold'][0]} {verdict['threshold'][1]}" if verdict else ""
      met = ("yes" if verdict["met"] else "**no**") if verdict else "n/a"
      shown = "not reached" if value is None else f"{value:.4f}"
      lines.append(f"| `{name}` | {shown} | {_fmt(summary['goal_spreads'].get(name))} | "
                   f"{threshold} | {met} |")
    lines.append("")
  lines += ["## Arms", "",
            f"| arm | groups x seeds | final val {loss_name} | "
            f"final val {'accuracy' if softmax else 'AUC'} | steps | "
            "steps to target | reached | wall time to target (s) | examples/s per group |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for name, arm in summary["arms"].items():
    config = arm["config"]
    groups = config["num_groups"] if config["kind"] == "train" else 1
    steps = arm["runs"][0]["steps"] if arm["runs"] else "n/a"
    lines.append(
        f"| `{name}` | {groups} x {arm['seeds']} | {_fmt(arm['final_val_loss'])} | "
        f"{_fmt(arm.get('final_val_accuracy') if softmax else arm['final_val_auc'])} | {steps} | {_fmt(arm['steps_to_target'], 0)} | "
        f"{arm['reached_target']}/{len(arm['runs'])} | {_fmt(arm['wall_time_to_target_s'], 1)} | "
        f"{_fmt(arm['examples_per_sec'], 0)} |")
  lines.append("")
  lines += ["Arm configurations:", ""]
  for name, arm in summary["arms"].items():
    config = arm["config"]
    what = config["label"] or ""
    if config["kind"] == "train":
      how = (f"`{'`, `'.join(config['gin_files'])}`"
             + (f" + `{'`, `'.join(config['gin_bindings'])}`" if config["gin_bindings"] else ""))
      if config["strategy"] != "one_device":
        how += (f"; {config['strategy']}, {config['workers_per_group']} workers, "
                f"{config['ps_per_group']} ps per group")
    elif config["kind"] == "ensemble":
      how = f"average of {config['ensemble_size']} seeds of `{config['source_arm']}`"
    else:
      how = (f"student distilling from the trained `{config['source_arm']}` model (frozen, "
             f"published once): `{'`, `'.join(config['gin_files'])}`"
             + (f" + `{'`, `'.join(config['gin_bindings'])}`" if config["gin_bindings"] else ""))
    lines.append(f"- `{name}`: {what}{' — ' if what else ''}{how}")
  lines.append("")
  churned = {n: a["churn"] for n, a in summary["arms"].items() if a.get("churn")}
  if churned:
    lines += ["## Prediction churn between retrains (different seeds)", "",
              "| arm | pairs | mean abs diff of predicted probabilities | disagreement "
              f"({'argmax' if softmax else 'p > 0.5'}) | final val {loss_name} |",
              "| --- | --- | --- | --- | --- |"]
    for name, churn in churned.items():
      lines.append(f"| `{name}` | {len(churn['pairs'])} | {_fmt(churn['mean_abs_diff'], 5)} | "
                   f"{_fmt(churn['disagreement'], 5)} | "
                   f"{_fmt(summary['arms'][name]['final_val_loss'])} |")
    lines.append("")
  if plots:
    lines += ["## Plots", ""]
    lines += [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots]
    lines.append("")
  lines += ["Per-run curves (JSON lines: step, wall time, losses, AUC, examples/s, teacher "
            "staleness) are in `runs/<arm>/seed_<s>_group_<g>.jsonl`, final results next to them.",
            ""]
  return "\n".join(lines)


def write_report(summary: dict, results_dir: str, command: str) -> Dict[str, List[str]]:
  """Writes report.md and the plots into ``results_dir``; returns the paths."""
  plots = plot_curves(summary, results_dir)
  path = os.path.join(results_dir, "report.md")
  with open(path, "w") as f:
    f.write(markdown(summary, command, plots))
  return {"report": [path], "plots": plots}


def index_markdown(results_root: str) -> str:
  """One table of every suite's goal figures, read from each ``<suite>/summary.json``."""
  lines = ["# Benchmark results", "",
           "Generated from each suite's `summary.json` by `benchmarks.run` after every suite run "
           "(numbers are never typed in). Each suite's `report.md` starts with the command that "
           "regenerates it.", "",
           "| suite | goal figure | value | spread (mean ± std [min, max]) | goal | met |",
           "| --- | --- | --- | --- | --- | --- |"]
  for name in sorted(os.listdir(results_root)):
    path = os.path.join(results_root, name, "summary.json")
    if not os.path.isfile(path):
      continue
    with open(path) as f:
      summary = json.load(f)
    goals = summary.get("goals") or {}
    link = f"[`{name}`]({name}/report.md)" if os.path.exists(
        os.path.join(results_root, name, "report.md")) else f"`{name}`"
    if not goals:
      lines.append(f"| {link} | (no goal figures) | | | | |")
    for goal, value in goals.items():
      verdict = (summary.get("goal_verdicts") or {}).get(goal)
      threshold = f"{verdict['threshold'][0]} {verdict['threshold'][1]}" if verdict else ""
      met = ("yes" if verdict["met"] else "**no**") if verdict else ""
      shown = "not reached" if value is None else (f"{value:.4f}" if isinstance(value, float)
                                                   else str(value))
      spread = _fmt((summary.get("goal_spreads") or {}).get(goal))
      lines.append(f"| {link} | `{goal}` | {shown} | {spread} | {threshold} | {met} |")
  return "\n".join(lines) + "\n"


def write_index(results_root: str) -> str:
  """Writes ``results_root/README.md`` (the index of all suites' goals); returns its path."""
  path = os.path.join(results_root, "README.md")
  with open(path, "w") as f:
    f.write(index_markdown(results_root))
  return path


def update_index_for(summary_path: str) -> Optional[str]:
  """Rewrites the committed index when ``summary_path`` lies in ``benchmarks/results/<suite>/``
  (a run written elsewhere leaves it alone); returns its path, or None."""
  results = os.path.dirname(os.path.dirname(os.path.abspath(summary_path)))
  if results != os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"):
    return None
  return write_index(results)
