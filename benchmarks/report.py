"""A suite's Markdown report and PNG plots, generated from its summary.json and recorded curves."""

from __future__ import annotations

import collections
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from benchmarks import machine
from benchmarks import runner
from benchmarks import standalone
from benchmarks import suite_spec as spec

_LOSS_NAMES = {"val_logloss": "log loss", "val_loss": "cross-entropy"}


def _fmt(stat: Optional[dict], digits: int = 4, scale: float = 1.0) -> str:
  """mean ± std [min, max] (n) of a runner._stat, or 'n/a'."""
  if not stat:
    return "n/a"
  mean, lo, hi = stat["mean"] * scale, stat["min"] * scale, stat["max"] * scale
  if stat["n"] == 1:
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} ± {stat['std'] * scale:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def format_value(value) -> str:
  if value is None:
    return "not reached"
  return f"{value:.4f}" if isinstance(value, float) else str(value)


def format_interval(goals: dict, name: str, verdict: Optional[dict] = None) -> str:
  """A goal's 90% bootstrap interval as [low, high] (an open upper end: not reached): a suite's
  ``<name>_interval`` goal, or a registered benchmark's verdict ``interval90``."""
  interval = goals.get(f"{name}_interval") or (verdict or {}).get("interval90")
  if not interval:
    return ""
  return "[" + ", ".join("not reached" if v is None else f"{v:.4f}" for v in interval) + "]"


def _verdict(verdict: Optional[dict]) -> Tuple[str, str]:
  """(goal, met) cells: a goal whose value is missing is **missed**, never blank."""
  if not verdict:
    return "", ""
  op, value, *bound = verdict["threshold"]
  threshold = f"{op} {value}" + (f", 90% interval {op[0]} {bound[0]}" if bound else "")
  if verdict.get("missing"):
    return threshold, "**missed** (no value)"
  return threshold, "yes" if verdict["met"] else "**no**"


def goal_rows(summary: dict) -> List[Tuple[str, str, str, str, str, str]]:
  """(goal, value, 90% interval, spread, threshold, met) of every goal, thresholded ones with a
  missing value included as missed."""
  goals = summary.get("goals") or {}
  verdicts = summary.get("goal_verdicts") or {}
  names = [n for n in goals if not n.endswith("_interval")]
  names += [n for n in verdicts if n not in names]
  rows = []
  for name in names:
    threshold, met = _verdict(verdicts.get(name))
    rows.append((name, format_value(goals.get(name)),
                 format_interval(goals, name, verdicts.get(name)),
                 _fmt((summary.get("goal_spreads") or {}).get(name)), threshold, met))
  return rows


def plot_curves(summary: dict, results_dir: str) -> List[str]:
  """Validation loss vs steps and vs wall time, one line per arm (mean over its runs)."""
  written = []
  loss_key = summary.get("loss_key", spec.LOSS_KEY)
  curves = {name: [runner.read_curve(os.path.join(results_dir, r["curve"])) for r in arm["runs"]]
            for name, arm in summary["arms"].items()}
  finals = [a["final_val_loss"]["min"] for a in summary["arms"].values() if a["final_val_loss"]]
  finals += [a["best_val_loss"]["min"] for a in summary["arms"].values()
             if a.get("best_val_loss")]  # an overfitting run's best lies below its end
  starts = [runs[0][0].get(loss_key) for runs in curves.values() if runs and runs[0]]
  for x_key, x_label, name in (("step", "steps (per group)", "val_loss_vs_steps.png"),
                               ("wall_time_s", "wall time (s)", "val_loss_vs_wall_time.png")):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm_name, arm_curves in curves.items():
      points = [[(c[x_key], c[loss_key]) for c in curve if loss_key in c]
                for curve in arm_curves]
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
    if finals and starts:
      # Zoom on the part of the curves where arms differ.
      top = sorted(s for s in starts if s is not None)[len(starts) // 2]
      ax.set_ylim(min(finals) - 0.002, max(top, min(finals) + 0.01))
    written.append(_save(fig, ax, x_label, f"validation {_LOSS_NAMES.get(loss_key, loss_key)}",
                         f"{summary['suite']}: validation loss vs {x_label.split(' (')[0]}",
                         os.path.join(results_dir, name)))
  return written


def _save(fig, ax, x_label: str, y_label: str, title: str, path: str) -> str:
  """Labels, grids and saves a plot to ``path`` (PNG); returns the path."""
  ax.set_xlabel(x_label)
  ax.set_ylabel(y_label)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _load_lines(summary: dict) -> List[str]:
  """The machine's load around the runs, and which runs started above the number of cores."""
  runs = [r for a in summary["arms"].values() for r in a["runs"]]
  cores = (summary.get("machine") or {}).get("cores") or os.cpu_count()
  lines = []
  for key, when in (("load_avg_1m_before", "before"), ("load_avg_1m_at_end", "at the end of")):
    loads = [r[key] for r in runs if r.get(key) is not None]
    if loads:
      lines.append(f"- machine load {when} each run (1-minute load average, {cores} cores): "
                   f"{min(loads):.2f} to {max(loads):.2f}")
  marked = sorted({f"`{n}`" for n, a in summary["arms"].items() for r in a["runs"]
                   if r.get("started_above_nproc_load")})
  if marked:
    lines.append(f"- **taken above {cores} cores' load (--allow_load): {', '.join(marked)}**; "
                 "their wall times and examples/s are not trustworthy")
  elif runs and not any(r.get("load_avg_1m_before") is not None for r in runs):
    lines.append("- load before each run not recorded (runs predate the load checks)")
  resumed = [f"`{n}` seed {r.get('seed')} group {r.get('group', 0)} (from step "
             f"{', '.join(str(_resumed_at(p, r)) for p in r['parts'][1:])})"
             for n, a in summary["arms"].items() for r in a["runs"] if r.get("parts")]
  if resumed:
    lines.append(f"- resumed after a stop from their checkpoints (each part's start, commit and "
                 f"load in its record): {', '.join(resumed)}")
  return lines + _cpu_lines(summary)


def _resumed_at(part: dict, run: dict) -> int:
  return part["from_step"].get(str(run.get("group", 0)), 0)


def _runs(summary: dict) -> List[dict]:
  """Every run a suite's summary records (none for a registered benchmark's)."""
  return [r for a in (summary.get("arms") or {}).values() if isinstance(a, dict)
          for r in a.get("runs") or [] if isinstance(r, dict)]


def cpu_models(summary: dict) -> collections.Counter:
  """Runs per CPU model ("not recorded" for runs from before the record), or the standalone
  script's one model from its ``machine`` block when it has no runs."""
  runs = _runs(summary)
  counts = collections.Counter(_run_cpu_models(r) for r in runs)
  if not runs and (summary.get("machine") or {}).get("cpu_model"):
    counts[summary["machine"]["cpu_model"]] = 1
  return counts


def tensorflow_versions(summary: dict) -> List[str]:
  """The TensorFlow versions a summary's figures were taken on (its runs', else its ``machine``
  block's); empty where none was recorded."""
  versions = {r.get("tensorflow") for r in _runs(summary)}
  versions.add((summary.get("machine") or {}).get("tensorflow"))
  return sorted(v for v in versions if v)


def _run_cpu_models(run: dict) -> str:
  """The CPU model a run was taken on; a run resumed on other models names them all ("A + B")."""
  models = {p.get("cpu_model") for p in run.get("parts") or [] if isinstance(p, dict)}
  models = sorted(m for m in models | {run.get("cpu_model")} if m)
  return " + ".join(models) or "not recorded"


def _cpu_lines(summary: dict) -> List[str]:
  """Which CPU model the runs were taken on; runs resumed on another machine kind are named, as
  their wall times and examples/s cannot be compared with the others'."""
  counts = cpu_models(summary)
  if len(counts) == 1:
    return [f"- CPU: {next(iter(counts))}"] if "not recorded" not in counts else []
  shown = ", ".join(f"{model} ({n} runs)" for model, n in counts.most_common())
  return [f"- **runs taken on {len(counts)} CPU models: {shown}**; wall times and examples/s "
          "are comparable only between runs on the same one"]


def _protocol_lines(summary: dict) -> List[str]:
  """The pre-registered protocol's record: the scaling phase (B*) and each arm's tuned rate."""
  record = summary.get("protocol")
  if not record:
    return []
  lines = ["## Protocol record", ""]
  scaling = record.get("scaling")
  if scaling and scaling.get("given"):
    lines += [f"**B\\* = {scaling['b_star']}**, given (taken from another suite's scaling phase: "
              f"the suite's description says which).", ""]
  elif scaling:
    lines += [f"Synchronous scaling (each batch tuned over learning rates "
              f"{record['learning_rates']}, tuning seed {record['tuning_seed']}): common target "
              f"{scaling['target']:.4f} (the worst batch's best loss).", "",
              "| batch | learning rate | best val loss | steps to common target | "
              "steps(2B) / steps(B) |", "| --- | --- | --- | --- | --- |"]
    for batch, choice in scaling["batches"].items():
      ratio = scaling["doubling_ratio"].get(batch, scaling["doubling_ratio"].get(int(batch)))
      steps = scaling["steps_to_target"].get(batch, scaling["steps_to_target"].get(int(batch)))
      lines.append(f"| {batch} | {choice['learning_rate']:g} | "
                   f"{choice['grid'][format(choice['learning_rate'], 'g')]:.4f} | "
                   f"{steps} | {'' if ratio is None else f'{ratio:.3f}'} |")
    stopped = ("doubling past it cuts steps by less than "
               f"{scaling['min_cut']:.0%}" if scaling["scaling_stopped"] else
               "every doubling in the grid still cut steps by at least "
               f"{scaling['min_cut']:.0%}: B* is the largest batch whose double was measured")
    lines += ["", f"**B\\* = {scaling['b_star']}** ({stopped}).", ""]
  if record.get("tuning"):
    lines += ["| arm | learning rate chosen | best val loss per rate (tuning seed) |",
              "| --- | --- | --- |"]
    for name, choice in record["tuning"].items():
      grid = ", ".join(f"{lr}: {loss:.4f}" for lr, loss in choice["grid"].items())
      lines.append(f"| `{name}` | {choice['learning_rate']:g} | {grid} |")
    lines.append("")
  return lines


def markdown(summary: dict, command: str, plots: Sequence[str]) -> str:
  """The report: description, command, goal figures, per-arm table, churn, plots."""
  loss_name = _LOSS_NAMES.get(summary.get("loss_key", spec.LOSS_KEY), "loss")
  softmax = summary.get("output") == "softmax"
  lines = _header_lines(summary, command, loss_name)
  rows = goal_rows(summary)
  if rows:
    lines += ["## Goals", "", "| goal | value | 90% interval (bootstrap over seeds or pairs) | "
              "spread over runs (mean ± std [min, max]) | goal | met |",
              "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| `{name}` | " + " | ".join(cells) + " |" for name, *cells in rows]
    lines.append("")
  lines += _protocol_lines(summary)
  lines += _arm_lines(summary, softmax, loss_name)
  lines += _churn_lines(summary, softmax, loss_name)
  lines += _matched_churn_lines(summary, softmax, loss_name)
  if plots:
    lines += ["## Plots", ""]
    lines += [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots]
    lines.append("")
  lines += ["Per-run curves (JSON lines: step, wall time, losses, AUC, examples/s, teacher "
            "staleness) are in `runs/<arm>/seed_<s>_group_<g>.jsonl`, final results next to them.",
            ""]
  return "\n".join(lines)


_DATA = {"criteo_like": "generated Criteo-format TSV (planted model, data_pipelines/"
         "make_criteo_like.py)", "adult": "UCI Adult census (real data; data_pipelines/README.md)",
         "kjv": "the King James Bible, word tokens (real data; data_pipelines/README.md)",
         "fashion_mnist": "Fashion-MNIST as ImageNet-style TFRecords (real data; "
         "data_pipelines/README.md)",
         "debian_english": "English text from 11 Debian packages, byte-level BPE tokens (real "
         "data; data_pipelines/debian_text.py)",
         "debian_kernel": "the C source of Linux 6.1 from Debian, byte-level BPE tokens (real "
         "data; data_pipelines/debian_text.py)"}


def _header_lines(summary: dict, command: str, loss_name: str) -> List[str]:
  """Title, description, the regenerating command, data, bindings, target and machine load."""
  lines = [f"# Benchmark suite `{summary['suite']}`", ""]
  if summary.get("description"):
    lines += [summary["description"].strip(), ""]
  lines += ["Regenerate (numbers below come from that run's `summary.json`, never typed in):", "",
            "```sh", command, "```", ""]
  lines += [f"- data: {_DATA.get(summary['data'], summary['data'])}",
            f"- shared bindings: `{'`, `'.join(summary['common_bindings']) or 'none'}`"]
  if summary.get("target_loss") is not None:
    origin = (f" (final loss of `{summary['target_from_arm']}`)" if summary.get("target_from_arm")
              else "")
    lines.append(f"- target validation {loss_name}: {summary['target_loss']:.4f}{origin}")
  if summary.get("simulated"):
    lines.append(f"- simulated: {summary['simulated']}")
  lines += _load_lines(summary)
  lines.append("")
  return lines


def _arm_lines(summary: dict, softmax: bool, loss_name: str) -> List[str]:
  """The per-arm table and what each arm ran."""
  lines = ["## Arms", "",
           f"| arm | groups x seeds | final val {loss_name} | "
           f"final val {'accuracy' if softmax else 'AUC'} | steps | "
           "steps to target | reached | wall time to target (s) | examples/s per group | "
           "bytes/step to peers |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for name, arm in summary["arms"].items():
    config = arm["config"]
    groups = config["num_groups"] if config["kind"] == "train" else 1
    steps = arm["runs"][0]["steps"] if arm["runs"] else "n/a"
    lines.append(
        f"| `{name}` | {groups} x {arm['seeds']} | {_fmt(arm['final_val_loss'])} | "
        f"{_fmt(arm.get('final_val_accuracy') if softmax else arm['final_val_auc'])} | "
        f"{steps} | {_fmt(arm['steps_to_target'], 0)} | "
        f"{arm['reached_target']}/{len(arm['runs'])} | {_fmt(arm['wall_time_to_target_s'], 1)} | "
        f"{_fmt(arm['examples_per_sec'], 0)} | {_fmt(arm.get('bytes_sent_per_step'), 0)} |")
  lines += ["", "Arm configurations:", ""]
  for name, arm in summary["arms"].items():
    config = arm["config"]
    what = config["label"] or ""
    lines.append(f"- `{name}`: {what}{' — ' if what else ''}{_arm_how(config)}")
  lines.append("")
  return lines


def _arm_how(config: dict) -> str:
  """How an arm ran, from its recorded configuration."""
  bindings = f" + `{'`, `'.join(config['gin_bindings'])}`" if config["gin_bindings"] else ""
  if config["kind"] == "train":
    how = f"`{'`, `'.join(config['gin_files'])}`" + bindings
    if config["strategy"] != "one_device":
      how += (f"; {config['strategy']}, {config['workers_per_group']} workers, "
              f"{config['ps_per_group']} ps per group")
    return how
  if config["kind"] == "ensemble":
    return f"average of {config['ensemble_size']} seeds of `{config['source_arm']}`"
  return (f"student distilling from the trained `{config['source_arm']}` model (frozen, "
          f"published once): `{'`, `'.join(config['gin_files'])}`" + bindings)


def _churn_lines(summary: dict, softmax: bool, loss_name: str) -> List[str]:
  """Churn between retrains at the end of training, per arm that has it."""
  churned = {n: a["churn"] for n, a in summary["arms"].items() if a.get("churn")}
  if not churned:
    return []
  lines = ["## Prediction churn between retrains (different seeds)", "",
           "| arm | pairs | mean abs diff of predicted probabilities | disagreement "
           f"({'argmax' if softmax else 'p > 0.5'}) | final val {loss_name} |",
           "| --- | --- | --- | --- | --- |"]
  for name, churn in churned.items():
    lines.append(f"| `{name}` | {len(churn['pairs'])} | {_fmt(churn['mean_abs_diff'], 5)} | "
                 f"{_fmt(churn['disagreement'], 5)} | "
                 f"{_fmt(summary['arms'][name]['final_val_loss'])} |")
  lines.append("")
  return lines


def _matched_churn_lines(summary: dict, softmax: bool, loss_name: str) -> List[str]:
  """Churn of every arm with prediction histories at one validation loss all its pairs reach."""
  matched = summary.get("churn_at_matched_loss") or {}
  if not matched:
    return []
  lines = [f"### Churn at matched validation {loss_name} ({matched['loss']:.4f})", "",
           "Each independent pair of retrains (seeds 0-1, 2-3, ..., or the arm's churn_pairs) at "
           "its first evaluation at or below the loss every pair of the arms with the most pairs "
           "reaches (arms with fewer pairs that never get there: not reached); 90% bootstrap "
           "intervals over pairs.", "",
           f"| arm | pairs | mean abs diff [90% interval] | disagreement "
           f"({'argmax' if softmax else 'p > 0.5'}) [90% interval] |", "| --- | --- | --- | --- |"]
  for name, arm in matched["arms"].items():
    cells = ["not reached" if arm[m] is None else f"{arm[m]:.5f} "
             + format_interval({m: arm[m], f"{m}_interval": arm[f"{m}_interval"]}, m)
             for m in ("mean_abs_diff", "disagreement")]
    lines.append(f"| `{name}` | {arm['pairs']} | {cells[0]} | {cells[1]} |")
  return lines + [""]


def plot_churn_vs_loss(summary: dict, results_dir: str) -> List[str]:
  """Churn between independent retrains vs their mean validation loss, one line per pair."""
  curves = {n: (a.get("churn") or {}).get("curves") for n, a in summary["arms"].items()}
  curves = {n: c for n, c in curves.items() if c}
  if not curves:
    return []
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, (name, pairs) in enumerate(curves.items()):
    for k, pair in enumerate(pairs):
      points = sorted((p["loss"], p["mean_abs_diff"]) for p in pair)
      ax.plot([x for x, _ in points], [y for _, y in points], color=f"C{i}", alpha=0.8,
              linewidth=1, label=f"{name} ({len(pairs)} pairs)" if k == 0 else None)
  matched = (summary.get("churn_at_matched_loss") or {}).get("loss")
  if matched is not None:
    ax.axvline(matched, color="gray", linestyle="--", linewidth=1, label=f"matched {matched:.4f}")
  ax.invert_xaxis()  # training goes left to right
  return [_save(fig, ax, "mean validation loss of the pair", "churn: mean |p_a - p_b|",
                f"{summary['suite']}: churn between retrains vs validation loss",
                os.path.join(results_dir, "churn_vs_loss.png"))]


def plot_loss_vs_bytes(summary: dict, results_dir: str) -> List[str]:
  """Best validation loss against the bytes a group sends its peers a step, one point per
  multi-group arm (measured), and the sync arms at a 2-worker ring all-reduce of the gradient
  (the float32 trainable parameter bytes a step: counted, not measured)."""
  points = []
  for name, arm in summary["arms"].items():
    loss, sent = arm.get("best_val_loss"), arm.get("bytes_sent_per_step")
    params = [r.get("trainable_parameter_bytes") for r in arm["runs"]]
    if loss and sent:
      points.append((name, sent["mean"], loss["mean"], "o"))
    elif loss and name in summary.get("sync_arms", []) and params and params[0]:
      points.append((f"{name} (all-reduce, counted)", float(params[0]), loss["mean"], "x"))
  if not any(marker == "o" for *_, marker in points):
    return []
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, (name, sent, loss, marker) in enumerate(points):
    ax.scatter([sent], [loss], color=f"C{i}", marker=marker, label=name)
  ax.set_xscale("log")
  return [_save(fig, ax, "bytes sent to peers per step per group (log)",
                f"best validation {summary.get('loss_key', 'loss')} (mean over seeds)",
                f"{summary['suite']}: quality against communication",
                os.path.join(results_dir, "loss_vs_bytes.png"))]


def write_report(summary: dict, results_dir: str, command: str) -> Dict[str, List[str]]:
  """Writes report.md and the plots into ``results_dir``; returns the paths."""
  plots = (plot_curves(summary, results_dir) + plot_churn_vs_loss(summary, results_dir)
           + plot_loss_vs_bytes(summary, results_dir))
  path = machine.write_text(os.path.join(results_dir, "report.md"),
                            markdown(summary, command, plots))
  return {"report": [path], "plots": plots}


def machine_lines(summary: dict) -> List[str]:
  """Where and how loaded a registered benchmark's figures were taken (its ``machine`` record)."""
  m = summary.get("machine") or {}
  if not m:
    return ["- machine load not recorded"]
  lines = [f"- CPU: {m.get('cpu_model', 'not recorded')}, {m.get('cores', '?')} cores; "
           f"TensorFlow {m.get('tensorflow', 'not recorded')}",
           f"- 1-minute load average before / after: "
           f"{m.get('load_avg_1m_before', float('nan')):.2f} / "
           f"{m.get('load_avg_1m_after', float('nan')):.2f}; CPU used by other processes: "
           f"{100 * m.get('foreign_cpu_share', 0.0):.1f}% of the cores' time"]
  if m.get("above_nproc_load"):
    lines.append("- **taken on a loaded machine** (above the cores' load, or others busy): the "
                 "figures are not trustworthy")
  return lines


def in_progress_lines(summary: dict) -> List[str]:
  """What a summary of a benchmark still running across invocations lacks (none when complete):
  its figures are the recorded runs', each with its own load in its record."""
  if summary.get("complete", True):
    return []
  missing = summary.get("missing", [])
  named = ", ".join(missing) if len(missing) <= 8 else "summary.json's `missing` lists them"
  return [f"- **in progress**: {len(missing)} run(s) not recorded yet ({named}); "
          "the figures below are those of the runs recorded so far, each run's load before "
          "and after it in its own record (this summary was written from the records by "
          "`--report_only`, not by a run)"]


def write_benchmark_report(summary: dict, results_dir: str, title: str,
                           body: Sequence[str] = (), holds_machine: bool = True,
                           name: str = "") -> str:
  """report.md of a registered benchmark (``name``): its command, machine, goals, then ``body``
  (its own tables) and its settings; returns the path. ``holds_machine`` False: a benchmark
  that runs others, each holding the machine and recording its own load."""
  lines = [f"# {title}", "", standalone.command_line(summary, name), ""]
  lines += in_progress_lines(summary) or (machine_lines(summary) if holds_machine else [
      "- machine: each benchmark it ran held the machine alone and recorded its own load "
      "(before / after: its table's last row)"])
  lines += [""]
  rows = goal_rows(summary)
  if rows:
    lines += ["| goal figure | value | 90% interval | spread | goal | met |",
              "| --- | --- | --- | --- | --- | --- |"]
    lines += ["| `" + name + "` | " + " | ".join(cells) + " |" for name, *cells in rows] + [""]
  lines += list(body)
  config = summary.get("config")
  if isinstance(config, dict) and config:
    lines += ["", "## Settings", "", "| setting | value |", "| --- | --- |"]
    lines += [f"| {key} | `{json.dumps(value)}` |" for key, value in sorted(config.items())]
  return machine.write_text(os.path.join(results_dir, "report.md"),
                            "\n".join(lines).rstrip() + "\n")
