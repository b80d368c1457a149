"""``fusion`` suite: step time of unfused vs backward- vs forward-fused optimizer updates.

Models (synthetic data, static batch shapes): the project's CTR model with large embeddings
(26 x Embedding(20000, 16), MLP 256-128) with Adam and with Adagrad, an MLP (3 x 1024) with
Adam, and an LSTM language model (Embedding(10000, 64) -> LSTM(256) -> Dense softmax over the
vocabulary) with Adam, a stand-in for the project's LM (builders in
``benchmarks/models.py``). Each model trains as arms ``none``, ``backward``, ``forward`` and
``grads_only`` (forward and backward pass without any update: the step time that fusion cannot
touch), with ``jit_compile`` off and on. Each (model, jit) group runs in its own subprocess
(so memory is returned between groups: the whole suite stays under ~2 GB RSS), and within it the
four arms run interleaved: ``--rounds`` rounds of ``--steps`` steps per arm (order rotated every
round), so machine noise hits them alike. Speedups are reported as the median over rounds of the
within-round ratio (``paired``: the headline), and from each arm's best and median round. Writes ``benchmarks/results/fusion/summary.json`` and
``report.md``.

  .venv/bin/python -m benchmarks.fusion [--rounds=7 --steps=10 --models=ctr_adam,mlp_adam]
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import tensorflow as tf
import tf_keras as keras
from absl import flags

from benchmarks.models import MODELS, Arm
from benchmarks import machine
from benchmarks import standalone
from tf_codistill import fused_models

REPO = standalone.REPO
FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line (defined only when run as a script, so that the suites' modules can be
  imported side by side)."""
  flags.DEFINE_integer("steps", 10, "Steps per arm per round.")
  flags.DEFINE_integer("rounds", 7, "Interleaved rounds.")
  flags.DEFINE_list("models", ["ctr_adam", "ctr_adagrad", "mlp_adam", "lstm_lm_adam"],
                    "Models to measure.")
  flags.DEFINE_list("modes", ["none", "backward", "forward", "grads_only"], "Arms per model.")
  flags.DEFINE_list("jit", ["0", "1"], "jit_compile settings (0/1).")
  flags.DEFINE_float("scale", 1.0, "Scales model sizes and batches down for smoke runs (0 < s <= 1).")
  standalone.define_flags("fusion", work_dir=False)
  flags.DEFINE_boolean("report_only", False, "Only rewrite report.md from the summary.json at "
                       "--out (after a change of the report's layout).")
  flags.DEFINE_string("group", None, "Internal: measure only this 'model/jit' group in this "
                      "process and write its step times to --out.")


class GradsOnly(keras.Model):
  """Forward and backward pass of a model, no update (the gradients' sum is reported so that
  nothing is pruned): the part of the step fusion cannot change."""

  def __init__(self, inner: keras.Model):
    super().__init__()
    self.inner = inner

  def call(self, x, training=None):
    return self.inner(x, training=training)

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      loss = self.compiled_loss(y, self.inner(x, training=True))
    grads = tape.gradient(loss, self.inner.trainable_variables)
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]
    return {"grad_sum": tf.add_n([tf.reduce_sum(v) for v in values])}


def build_arm(arm: Arm, mode: str, jit: bool, weights) -> keras.Model:
  """One compiled model of ``arm`` in ``mode`` with the shared initial ``weights``."""
  make, _, optimizer, loss = arm
  model = make()
  model.set_weights(weights)
  if mode == "grads_only":
    model = GradsOnly(model)
  model.compile(optimizer(), loss, jit_compile=jit)
  return fused_models.fuse(model, mode) if mode in ("backward", "forward") else model


def measure(models: List[str], modes: List[str], jits: List[bool], steps: int, rounds: int,
            scale: float = 1.0) -> Dict[str, dict]:
  """Steps/sec per (model, jit, mode), interleaved round-robin over all arms."""
  arms: Dict[str, keras.Model] = {}
  data: Dict[str, tf.data.Dataset] = {}
  for name in models:
    arm = MODELS[name](scale)
    weights = arm[0]().get_weights()
    for jit in jits:
      for mode in modes:
        key = f"{name}/{'xla' if jit else 'graph'}/{mode}"
        arms[key] = build_arm(arm, mode, jit, weights)
        data[key] = arm[1]
  for key, model in arms.items():  # warm-up: tracing, XLA compilation, first-touch allocations
    start = time.perf_counter()
    model.fit(data[key], steps_per_epoch=max(5, steps // 3), epochs=1, verbose=0)
    print(f"warm-up {key}: {time.perf_counter() - start:.1f}s", flush=True)
  rates: Dict[str, List[float]] = {key: [] for key in arms}
  keys = list(arms)
  for r in range(rounds):
    # Rotate the order every round so that no arm always runs first or last (load drifts).
    for key in keys[r % len(keys):] + keys[:r % len(keys)]:
      model = arms[key]
      start = time.perf_counter()
      model.fit(data[key], steps_per_epoch=steps, epochs=1, verbose=0)
      rates[key].append(steps / (time.perf_counter() - start))
    print(f"round {r + 1}/{rounds} done, load {os.getloadavg()[0]:.1f}", flush=True)
  del arms, data
  keras.backend.clear_session()
  gc.collect()
  return {key: {"ms_per_step_best": 1e3 / max(r), "ms_per_step_median": 1e3 / statistics.median(r),
                "steps_per_sec": r} for key, r in rates.items()}


def speedups(steps: Dict[str, dict]) -> Dict[str, dict]:
  """Per model and jit setting: unfused / fused step time for each fused mode, and the share of
  the unfused step spent in the update (outside the forward and backward pass). Three
  statistics: ``best`` (best round of each arm), ``median`` (median round of each arm) and
  ``paired`` (median over rounds of the ratio within the round: the arms of a round ran next to
  each other, so this one cancels most of the load drift of a shared machine)."""
  out: Dict[str, dict] = {}
  for key in steps:
    name, jit, mode = key.split("/")
    base = steps.get(f"{name}/{jit}/none")
    if base is None or mode == "none":
      continue
    group = out.setdefault(f"{name}/{jit}", {})
    paired = statistics.median(
        f / n for f, n in zip(steps[key]["steps_per_sec"], base["steps_per_sec"]))
    if mode == "grads_only":
      for stat in ("best", "median"):
        unfused, grads = base[f"ms_per_step_{stat}"], steps[key][f"ms_per_step_{stat}"]
        group[f"update_share_{stat}"] = max(0.0, 1 - grads / unfused)
      group["update_share_paired"] = max(0.0, 1 - 1 / paired)
      continue
    group[mode] = {stat: base[f"ms_per_step_{stat}"] / steps[key][f"ms_per_step_{stat}"]
                   for stat in ("best", "median")}
    group[mode]["paired"] = paired
  return out


GOAL = 1.10


def _run_group(name: str, jit: bool, scale: float) -> tuple:
  """Measures one (model, jit) group in a fresh subprocess: (step times, its peak RSS in MB)."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "steps.json")
    args = [sys.executable, "-m", "benchmarks.fusion", f"--group={name}/{int(jit)}",
            f"--out={out}", f"--steps={FLAGS.steps}", f"--rounds={FLAGS.rounds}",
            f"--scale={scale}", f"--modes={','.join(FLAGS.modes)}"]
    proc = subprocess.Popen(args, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
      raise RuntimeError(f"group {name}/{'xla' if jit else 'graph'} exited {proc.returncode}")
    with open(out) as f:
      return json.load(f), usage.ru_maxrss / 1024  # Linux: kilobytes


def _explain(group: str, figures: dict) -> str:
  """Whether fusion reached the goal in ``group`` and what bounds it, from the measured figures."""
  modes = [m for m in ("backward", "forward") if m in figures]
  best_mode = max(modes, key=lambda m: figures[m]["paired"])
  speedup = figures[best_mode]["paired"]
  share = figures.get("update_share_paired")
  facts = []
  if share is not None:
    facts.append(f"the update is {share:.0%} of the unfused step (paired `none` vs `grads_only`), "
                 f"so even a free update could give at most x{1 / max(1e-9, 1 - share):.2f}")
  if share is not None and speedup > 1.05 / max(1e-9, 1 - share):
    return (f"`{group}`: **not credible**: {best_mode} x{speedup:.2f} (paired median) exceeds "
            f"what a free update could give; {'; '.join(facts)}. The rounds were disturbed by "
            "other jobs on this shared machine (its load is above); no conclusion from this group.")
  if speedup >= GOAL:
    return (f"`{group}`: **fusion helps**: {best_mode} x{speedup:.2f} (paired median; best "
            f"rounds x{figures[best_mode]['best']:.2f}); {'; '.join(facts)}. The fused kernels "
            "replace tf_keras' multi-pass element-wise updates (Adam: about ten passes over each "
            "variable and its slots) by one pass per variable.")
  reasons = list(facts)
  if share is not None and share < 1 - 1 / GOAL:
    reasons.append(f"that is below the {GOAL - 1:.0%} the goal needs: this step is dominated by "
                   "the forward and backward pass")
  if group.endswith("/xla"):
    reasons.append("with `jit_compile` XLA already fuses tf_keras' element-wise update ops into "
                   "a few loops per variable, so the unfused update has little locality left to "
                   "gain")
  if "forward" in figures and "backward" in figures and (
      figures["forward"]["paired"] < 0.95 * figures["backward"]["paired"]):
    reasons.append("forward fusion is slower than backward here: it stores every gradient in a "
                   "pending variable and reads it back in the next step (one more pass over "
                   "each gradient; Adam densifies the embedding gradients into whole tables)")
  reasons.append("on 2 shared cores the overlap that fusion allows (updates running while the "
                 "rest of the backward pass computes) finds no idle core")
  return (f"`{group}`: **fusion does not reach x{GOAL:.2f}**: best {best_mode} x{speedup:.2f} "
          f"(paired median; best rounds x{figures[best_mode]['best']:.2f}). Why: "
          + "; ".join(reasons) + ".")


def write_report(summary: dict, path: str) -> None:
  """report.md: the regenerating command, step times, speedups and the goal, from ``summary``."""
  steps, ratios, goals = summary["step_time"], summary["speedup_unfused_over_fused"], summary["goals"]
  cfg = summary["config"]
  lines = [
      "# Benchmark suite `fusion`", "",
      "Step time of unfused (`none`, tf_keras' own optimizer updates) vs backward- and "
      "forward-fused optimizer updates (`tf_codistill.fusion`), and of `grads_only` (forward and "
      "backward pass, no update: what fusion cannot touch), with `jit_compile` off (`graph`) and "
      "on (`xla`). Synthetic data, static batch shapes; the arms of each (model, jit) group run "
      "interleaved in one process (one process per group), so the ratios are side by side.", "",
      "Regenerate (numbers below come from that run's `summary.json`, never typed in):", "",
      "```sh", summary["command"], "```", "",
      f"- {cfg['rounds']} interleaved rounds of {cfg['steps']} steps per arm (arm order "
      "rotated every round) after a warm-up; "
      f"scale {cfg['scale']}; TensorFlow {cfg['tensorflow']}; {cfg['cpus']} CPU cores",
      f"- machine load (1-minute load average, shared machine): {summary['load_avg_before'][0]:.2f} "
      f"before, {summary['load_avg_after'][0]:.2f} after; per group at its end: "
      + ", ".join(f"{g} {v['load_avg_1min']:.1f}" for g, v in summary["groups"].items()),
      "- peak RSS per group process (MB): "
      + ", ".join(f"{g} {v['peak_rss_mb']:.0f}" for g, v in summary["groups"].items()),
      f"- wall time: {summary['wall_s']:.0f} s", "",
      "## Goal", "",
      "| goal | value | arm | goal | met |", "| --- | --- | --- | --- | --- |",
      f"| `best_fusion_speedup` (unfused / best fused step time, paired median over rounds; "
      f"best rounds: x{summary['best_fusion_speedup_best_rounds']:.3f}) | "
      f"{goals['best_fusion_speedup']:.3f} | `{summary['best_fusion_arm']}` | >= {GOAL} | "
      f"{'yes' if summary['goal_verdicts']['best_fusion_speedup']['met'] else '**no**'} |", "",
      "## Step time (ms per step: best round / median round)", "",
      "| model/jit | none | backward | forward | grads_only |", "| --- | --- | --- | --- | --- |"]
  for group in ratios:
    cells = []
    for mode in ("none", "backward", "forward", "grads_only"):
      s = steps.get(f"{group}/{mode}")
      cells.append("n/a" if s is None else
                   f"{s['ms_per_step_best']:.1f} / {s['ms_per_step_median']:.1f}")
    lines.append(f"| `{group}` | " + " | ".join(cells) + " |")
  lines += ["", "## Speedup (unfused / fused step time)", "",
            "`paired`: median over rounds of the ratio within a round (the arms of a round ran "
            "next to each other; the headline statistic). `best`: best round of each arm. "
            "`median`: median round of each arm.", "",
            "| model/jit | backward paired | best | median | forward paired | best | median | "
            "update share (paired) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for group, figures in ratios.items():
    cells = []
    for m in ("backward", "forward"):
      cells += ([f"x{figures[m][stat]:.3f}" for stat in ("paired", "best", "median")]
                if m in figures else ["n/a"] * 3)
    share = figures.get("update_share_paired")
    lines.append(f"| `{group}` | " + " | ".join(cells) +
                 f" | {'n/a' if share is None else f'{share:.0%}'} |")
  lines += ["", "## Where fusion helps and where it does not", ""]
  lines += [f"- {_explain(group, figures)}" for group, figures in ratios.items()
            if any(m in figures for m in ("backward", "forward"))]
  lines += ["", "Ratios above 1 mean the fused step is faster. Ratios near 1 (within a few "
            "percent) are within this shared machine's noise; where `best` and `median` "
            "disagree the rounds were disturbed by other jobs, and `paired` is the figure to "
            "trust.",
            "The LM stand-in uses `keras.layers.RNN(LSTMCell)`: tf_keras' `LSTM` layer makes XLA "
            "recompile the train step on every call under `jit_compile=True` (see "
            "`benchmarks/models.py`).", ""]
  with open(path, "w") as f:
    f.write("\n".join(lines))


def main(argv):
  del argv
  if FLAGS.report_only:
    with open(FLAGS.out) as f:
      write_report(json.load(f), os.path.join(os.path.dirname(FLAGS.out), "report.md"))
    return
  if FLAGS.group:  # child: one (model, jit) group
    name, jit = FLAGS.group.split("/")
    steps = measure([name], FLAGS.modes, [bool(int(jit))], FLAGS.steps, FLAGS.rounds, FLAGS.scale)
    with open(FLAGS.out, "w") as f:
      json.dump(steps, f)
    return
  load_before = os.getloadavg()
  start = time.time()
  steps: Dict[str, dict] = {}
  groups: Dict[str, dict] = {}
  for name in FLAGS.models:
    for jit in [bool(int(j)) for j in FLAGS.jit]:
      group = f"{name}/{'xla' if jit else 'graph'}"
      t0 = time.time()
      measured, peak = _run_group(name, jit, FLAGS.scale)
      steps.update(measured)
      groups[group] = {"peak_rss_mb": peak, "wall_s": time.time() - t0,
                       "load_avg_1min": os.getloadavg()[0]}
      print(f"{group}: peak RSS {peak:.0f} MB, {time.time() - t0:.0f} s", flush=True)
  ratios = speedups(steps)
  best_key, best = None, 0.0
  for group, figures in ratios.items():
    for mode in ("backward", "forward"):
      if mode in figures and figures[mode]["paired"] > best:
        best_key, best = f"{group}/{mode}", figures[mode]["paired"]
  best_rounds = max((figures[m]["best"] for figures in ratios.values()
                     for m in ("backward", "forward") if m in figures), default=0.0)
  summary = {
      "suite": "fusion",
      "command": "python -m benchmarks.fusion " + " ".join(
          f"--{k}={','.join(v) if isinstance(v, list) else v}" for k, v in
          (("rounds", FLAGS.rounds), ("steps", FLAGS.steps), ("models", FLAGS.models),
           ("modes", FLAGS.modes), ("jit", FLAGS.jit), ("scale", FLAGS.scale))),
      "config": {"steps": FLAGS.steps, "rounds": FLAGS.rounds, "scale": FLAGS.scale,
                 "cpus": os.cpu_count(), "tensorflow": tf.__version__},
      "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
      "wall_s": time.time() - start,
      "groups": groups,
      "step_time": steps,
      "speedup_unfused_over_fused": ratios,
      "best_fusion_arm": best_key,
      "best_fusion_speedup_best_rounds": best_rounds,
      "best_fusion_speedup_by_group": {
          group: max(figures.get(m, {}).get("paired", 0.0) for m in ("backward", "forward"))
          for group, figures in ratios.items()},
      "goals": {"best_fusion_speedup": best},
      "goal_verdicts": {"best_fusion_speedup": {"threshold": [">=", GOAL], "met": best >= GOAL}},
  }
  print(f"\n{'model/jit':<22} {'unfused ms':>10} {'backward':>16} {'forward':>16} {'update share':>13}")
  for group, figures in ratios.items():
    unfused = steps[f"{group}/none"]
    cells = [f"{figures[m]['paired']:.2f} ({figures[m]['best']:.2f})" if m in figures else "n/a"
             for m in ("backward", "forward")]
    share = figures.get("update_share_paired")
    print(f"{group:<22} {unfused['ms_per_step_best']:>10.1f} {cells[0]:>16} {cells[1]:>16} "
          f"{'n/a' if share is None else f'{share:.0%}':>13}")
  print(f"speedups are unfused/fused step time, paired median over rounds (best rounds); "
        f"best_fusion_speedup {best:.3f} ({best_key})")
  standalone.write_json(FLAGS.out, summary)
  write_report(summary, os.path.join(os.path.dirname(FLAGS.out), "report.md"))
  from benchmarks import report  # pylint: disable=g-import-not-at-top (matplotlib: only now)
  report.update_index_for(FLAGS.out)
  print(f"wrote {FLAGS.out} and report.md")


if __name__ == "__main__":
  define_flags()
  machine.run_script(main, "benchmarks.fusion")
