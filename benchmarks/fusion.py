"""``fusion`` suite: step time of unfused vs fused optimizer updates, and what each part buys.

Models (synthetic data, static batch shapes): the project's CTR model with large embeddings
(26 x Embedding(20000, 16), MLP 256-128) with Adam and with Adagrad, an MLP (3 x 1024) with
Adam, and the project's LSTM language model (``tf_codistill.models.lstm_lm`` at the lm suite's
size; its XLA arms use the same architecture on ``RNN(LSTMCell)``, ``lstm_lm_rnn_adam``, since
tf_keras' ``LSTM`` layer recompiles every step under XLA; builders in ``benchmarks/models.py``).
Each model trains as arms ``none`` (tf_keras' updates), ``kernels`` (the fused kernels, every
update after the whole backward pass: no fusion schedule), ``backward`` and ``forward`` (kernels
and schedule) and ``grads_only`` (forward and backward pass without any update: the step time
that fusion cannot touch), with ``jit_compile`` off and on. Each (model, jit) group runs in its
own subprocess (memory is returned between groups), and within it the arms run interleaved
through the step-time harness (``benchmarks/step_times.py``): per-step times inside one ``fit``
per arm and round, ``rounds`` rounds of ``steps`` steps (order rotated every round).
Speedups are the median over rounds of the within-round ratio of median step times (``paired``,
with a 90% bootstrap interval: the headline), and from each arm's best and median round; the
kernels' share is ``kernels`` over ``none``, the schedule's ``backward`` over ``kernels``.
Writes ``benchmarks/results/fusion/summary.json`` and ``report.md``.

  python -m benchmarks.run fusion
  python -m benchmarks.run fusion --gin_bindings='bench.fusion.rounds = 7' \
      --gin_bindings="bench.fusion.models = ['ctr_adam', 'mlp_adam']"
"""

from __future__ import annotations

import functools
import gc
import json
import os
import statistics
import subprocess
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import gin
import tensorflow as tf
import tf_keras as keras

from benchmarks import machine
from benchmarks import registry
from benchmarks import standalone
from benchmarks import step_times
from benchmarks import verdicts
from benchmarks.models import MODELS
from benchmarks.models import NO_JIT
from benchmarks.models import Arm
from tf_codistill.optim import fused_models
from tf_codistill.optim import fusion as fusion_lib


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


FUSED = tuple(m for m in fusion_lib.MODES if m != "none")  # kernels, backward, forward


def build_arm(arm: Arm, mode: str, jit: bool, weights) -> keras.Model:
  """One compiled model of ``arm`` in ``mode`` with the shared initial ``weights``."""
  make, _, optimizer, loss = arm
  model = make()
  model.set_weights(weights)
  if mode == "grads_only":
    model = GradsOnly(model)
  model.compile(optimizer(), loss, jit_compile=jit)
  return fused_models.fuse(model, mode) if mode in FUSED else model


def measure(models: Sequence[str], modes: Sequence[str], jits: Sequence[bool], steps: int,
            rounds: int, scale: float = 1.0,
            progress: Callable[[str], None] = functools.partial(print, flush=True)
            ) -> Dict[str, dict]:
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
    progress(f"warm-up {key}: {time.perf_counter() - start:.1f}s")
  times = step_times.interleave(
      {key: (lambda m=model, d=data[key]: step_times.fit_step_times(m, d, steps))
       for key, model in arms.items()}, rounds)
  # Per round: steps/s from the round's median step time (fit's set-up is not in it).
  rates = {key: [1.0 / statistics.median(r) for r in rounds_] for key, rounds_ in times.items()}
  progress(f"{rounds} rounds done, load {os.getloadavg()[0]:.1f}")
  del arms, data
  keras.backend.clear_session()
  gc.collect()
  return {key: {"ms_per_step_best": 1e3 / max(r), "ms_per_step_median": 1e3 / statistics.median(r),
                "steps_per_sec": r} for key, r in rates.items()}


def _paired(arm: dict, base: dict) -> dict:
  """``arm``'s steps/s over ``base``'s, round by round: the median and its 90% interval."""
  per_round = [a / b for a, b in zip(arm["steps_per_sec"], base["steps_per_sec"])]
  return {"paired": statistics.median(per_round),
          "interval90": step_times.bootstrap_median(per_round)}


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
    if mode == "grads_only":
      for stat in ("best", "median"):
        unfused, grads = base[f"ms_per_step_{stat}"], steps[key][f"ms_per_step_{stat}"]
        group[f"update_share_{stat}"] = max(0.0, 1 - grads / unfused)
      group["update_share_paired"] = max(0.0, 1 - 1 / _paired(steps[key], base)["paired"])
      continue
    group[mode] = {**{stat: base[f"ms_per_step_{stat}"] / steps[key][f"ms_per_step_{stat}"]
                      for stat in ("best", "median")}, **_paired(steps[key], base)}
  for key in steps:  # the schedule's share: backward over kernels, within each round
    name, jit, mode = key.split("/")
    kernels = steps.get(f"{name}/{jit}/kernels")
    if mode == "backward" and kernels is not None:
      out[f"{name}/{jit}"]["schedule_backward_over_kernels"] = _paired(steps[key], kernels)
  return out


GOAL = 1.10
GOAL_MODELS = 2  # the goal: best_fusion_speedup >= GOAL on at least this many models


def _run_group(spec: dict, work_dir: str) -> Tuple[Dict[str, dict], float]:
  """Measures one (model, jit) group in a fresh subprocess (``child(spec)``): (step times, its
  peak RSS in MB)."""
  os.makedirs(work_dir, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
    out = os.path.join(tmp, "steps.json")
    proc = subprocess.Popen(registry.child_command("fusion", {**spec, "out": out}),
                            cwd=standalone.REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
      raise RuntimeError(f"group {spec['model']}/{'xla' if spec['jit'] else 'graph'} exited "
                         f"{proc.returncode}")
    return machine.read_json(out), usage.ru_maxrss / 1024  # Linux: kilobytes


def child(spec: dict) -> None:
  """One (model, jit) group, in the process ``_run_group`` started: ``spec`` holds the model,
  jit, modes, steps, rounds and scale, and ``out``, where its step times go (JSON)."""
  steps = measure([spec["model"]], spec["modes"], [bool(spec["jit"])], spec["steps"],
                  spec["rounds"], spec["scale"])
  machine.write_text(spec["out"], json.dumps(steps))


def _explain(group: str, figures: dict) -> str:
  """Whether fusion reached the goal in ``group`` and what bounds it, from the measured figures."""
  modes = [m for m in FUSED if m in figures]
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


MODES_SHOWN = ("none", "kernels", "backward", "forward", "grads_only")


def _paired_cell(figure: Optional[dict]) -> str:
  if figure is None:
    return "n/a"
  low, high = figure.get("interval90", [float("nan")] * 2)
  return f"x{figure['paired']:.3f} [{low:.2f}, {high:.2f}]"


def _models_goal_row(summary: dict) -> str:
  by_model = summary.get("best_fusion_speedup_by_model", {})
  value = summary["goals"].get("models_with_fusion_speedup")
  met = summary["goal_verdicts"].get("models_with_fusion_speedup", {}).get("met")
  shown = ", ".join(f"{m} x{v:.2f}" for m, v in by_model.items())
  return (f"| `models_with_fusion_speedup` (models whose best fused arm, any jit, is >= "
          f"x{GOAL} paired: {shown}) | {'missing' if value is None else value} | - | >= "
          f"{GOAL_MODELS} | {'yes' if met else '**no**'} |")


def _goals(ratios: Dict[str, dict]) -> dict:
  """The best fused arm overall, and per model (any jit): the goal figures."""
  best_key, best, by_model = None, 0.0, {}
  for group, figures in ratios.items():
    for mode in FUSED:
      if mode in figures:
        paired = figures[mode]["paired"]
        model = group.split("/")[0]
        by_model[model] = max(by_model.get(model, 0.0), paired)
        if paired > best:
          best_key, best = f"{group}/{mode}", paired
  best_rounds = max((figures[m]["best"] for figures in ratios.values()
                     for m in FUSED if m in figures), default=0.0)
  count = sum(v >= GOAL for v in by_model.values())
  return {"best_fusion_arm": best_key, "best_fusion_speedup_best_rounds": best_rounds,
          "best_fusion_speedup_by_model": by_model,
          "goals": {"best_fusion_speedup": best, "models_with_fusion_speedup": count},
          "goal_verdicts": verdicts.judge(
              {"best_fusion_speedup": best, "models_with_fusion_speedup": count},
              {"best_fusion_speedup": (">=", GOAL),
               "models_with_fusion_speedup": (">=", GOAL_MODELS)})}


def _step_time_table(summary: dict) -> List[str]:
  """Every arm's ms per step (best round / median round), a row per group, as Markdown."""
  lines = ["| model/jit | " + " | ".join(MODES_SHOWN) + " |",
           "| --- | " + " | ".join("---" for _ in MODES_SHOWN) + " |"]
  for group in summary["speedup_unfused_over_fused"]:
    steps = [summary["step_time"].get(f"{group}/{mode}") for mode in MODES_SHOWN]
    lines.append(f"| `{group}` | " + " | ".join(
        "n/a" if s is None else f"{s['ms_per_step_best']:.1f} / {s['ms_per_step_median']:.1f}"
        for s in steps) + " |")
  return lines


def _speedup_table(ratios: Dict[str, dict]) -> List[str]:
  """Every group's paired speedups with their intervals and its update share, as Markdown."""
  lines = ["| model/jit | kernels | backward | forward | schedule | update share (paired) |",
           "| --- | --- | --- | --- | --- | --- |"]
  for group, figures in ratios.items():
    cells = [_paired_cell(figures.get(m)) for m in (*FUSED, "schedule_backward_over_kernels")]
    share = figures.get("update_share_paired")
    lines.append(f"| `{group}` | " + " | ".join(cells) +
                 f" | {'n/a' if share is None else f'{share:.0%}'} |")
  return lines


def write_report(summary: dict, results_dir: str) -> None:
  """``results_dir``/report.md: the regenerating command, step times, speedups and the goal,
  from ``summary``."""
  ratios, goals, cfg = summary["speedup_unfused_over_fused"], summary["goals"], summary["config"]
  lines = [
      "# Benchmark suite `fusion`", "",
      "Step time of unfused (`none`, tf_keras' own optimizer updates) vs fused optimizer "
      "updates (`tf_codistill.optim.fusion`): `kernels` (the fused kernels alone, "
      "every update after "
      "the whole backward pass), `backward` and `forward` (kernels and fusion schedule), and of "
      "`grads_only` (forward and backward pass, no update: what fusion cannot touch), with "
      "`jit_compile` off (`graph`) and on (`xla`). Synthetic data, static batch shapes; the arms "
      "of each (model, jit) group run interleaved in one process (one process per group), timed "
      "per step inside one `fit` per arm and round (`benchmarks/step_times.py`), so the ratios "
      "are side by side.", "",
      "Regenerate (numbers below come from that run's `summary.json`, never typed in):", "",
      "```sh", summary["command"], "```", "",
      f"- {cfg['rounds']} interleaved rounds of {cfg['steps']} steps per arm (arm order "
      "rotated every round) after a warm-up; "
      f"scale {cfg['scale']}; TensorFlow {cfg['tensorflow']}; {cfg['cpus']} CPU cores",
      "- machine load (1-minute load average, shared machine): "
      f"{summary['load_avg_before'][0]:.2f} "
      f"before, {summary['load_avg_after'][0]:.2f} after; per group at its end: "
      + ", ".join(f"{g} {v['load_avg_1min']:.1f}" for g, v in summary["groups"].items()),
      "- peak RSS per group process (MB): "
      + ", ".join(f"{g} {v['peak_rss_mb']:.0f}" for g, v in summary["groups"].items()),
      f"- wall time: {summary['wall_s']:.0f} s", "",
      "## Goals", "",
      "| goal | value | arm | goal | met |", "| --- | --- | --- | --- | --- |",
      f"| `best_fusion_speedup` (unfused / best fused step time, paired median over rounds; "
      f"best rounds: x{summary['best_fusion_speedup_best_rounds']:.3f}) | "
      f"{goals['best_fusion_speedup']:.3f} | `{summary['best_fusion_arm']}` | >= {GOAL} | "
      f"{'yes' if summary['goal_verdicts']['best_fusion_speedup']['met'] else '**no**'} |",
      _models_goal_row(summary), "",
      "## Step time (ms per step: best round / median round)", "", *_step_time_table(summary),
      "", "## Speedup (unfused / fused step time) and what each part buys", "",
      "`paired`: median over rounds of the ratio within a round (the arms of a round ran "
      "next to each other; the headline statistic), with its 90% bootstrap interval. "
      "`kernels` is what the fused kernels buy alone; `schedule` is `backward` over "
      "`kernels` in the same rounds: what the fusion schedule adds on top.", "",
      *_speedup_table(ratios)]
  lines += ["", "## Where fusion helps and where it does not", ""]
  lines += [f"- {_explain(group, figures)}" for group, figures in ratios.items()
            if any(m in figures for m in FUSED)]
  lines += ["", "Ratios above 1 mean the fused step is faster. Ratios near 1 (within a few "
            "percent) are within this shared machine's noise; where `best` and `median` "
            "disagree the rounds were disturbed by other jobs, and `paired` is the figure to "
            "trust.",
            "`lstm_lm_adam` is the project's LM (tf_keras' `LSTM` layer), measured without "
            "`jit_compile` only: that layer makes XLA recompile the train step on every call; "
            "`lstm_lm_rnn_adam` is the same architecture on `RNN(LSTMCell)`, which XLA compiles "
            "once (see `benchmarks/models.py`).", ""]
  machine.write_text(os.path.join(results_dir, "report.md"), "\n".join(lines))


def _measure_groups(ctx: registry.Context, settings: dict, models: Sequence[str],
                    jits: Sequence[bool]) -> Tuple[Dict[str, dict], Dict[str, dict], dict]:
  """Every (model, jit) group, each in a process of its own: the step times, per group its peak
  RSS, wall time and load at its end, and the groups skipped (why)."""
  steps: Dict[str, dict] = {}
  groups: Dict[str, dict] = {}
  skipped = {}
  for name in models:
    for jit in jits:
      group = f"{name}/{'xla' if jit else 'graph'}"
      if jit and name in NO_JIT:
        skipped[group] = ("tf_keras' LSTM layer makes XLA recompile the train step at every "
                          "call; lstm_lm_rnn_adam is the same architecture for XLA")
        ctx.progress(f"{group}: skipped ({skipped[group]})")
        continue
      t0 = time.time()
      measured, peak = _run_group({**settings, "model": name, "jit": jit}, ctx.work_dir)
      steps.update(measured)
      groups[group] = {"peak_rss_mb": peak, "wall_s": time.time() - t0,
                       "load_avg_1min": os.getloadavg()[0]}
      ctx.progress(f"{group}: peak RSS {peak:.0f} MB, {time.time() - t0:.0f} s")
  return steps, groups, skipped


@gin.configurable("fusion", module="bench", denylist=["ctx"])
def measure_fusion(ctx: registry.Context, steps: int = 10, rounds: int = 7,
                   models: Sequence[str] = ("ctr_adam", "ctr_adagrad", "mlp_adam",
                                            "lstm_lm_adam"),
                   modes: Sequence[str] = ("none", "kernels", "backward", "forward",
                                           "grads_only"),
                   jit: Sequence[bool] = (False, True), scale: float = 1.0) -> dict:
  """Step times of every (model, jit) group, each in a fresh process; the speedups and goals.

  Args:
    ctx: the run's context (the groups' scratch files go under its work_dir).
    steps: steps per arm per round.
    rounds: interleaved rounds.
    models: models to measure (``benchmarks.models.MODELS``).
    modes: arms per model.
    jit: jit_compile settings (False: graph, True: XLA), a group per model and setting.
    scale: scales model sizes and batches down for smoke runs (0 < s <= 1).
  """
  registry.check_choices("bench.fusion.models", models, tuple(MODELS))
  registry.check_choices("bench.fusion.modes", modes, MODES_SHOWN)
  registry.check_choices("bench.fusion.jit", jit, (False, True))
  if not 0 < scale <= 1:
    raise ValueError(f"bench.fusion.scale={scale!r}: 0 < scale <= 1")
  load_before = os.getloadavg()
  start = time.time()
  settings = {"steps": steps, "rounds": rounds, "scale": scale, "modes": list(modes)}
  step_time, groups, skipped = _measure_groups(ctx, settings, models, [bool(j) for j in jit])
  ratios = speedups(step_time)
  summary = {
      "suite": "fusion",
      "config": {"steps": steps, "rounds": rounds, "scale": scale,
                 "cpus": os.cpu_count(), "tensorflow": tf.__version__},
      "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
      "wall_s": time.time() - start,
      "groups": groups, "skipped_groups": skipped,
      "step_time": step_time,
      "speedup_unfused_over_fused": ratios,
      "best_fusion_speedup_by_group": {
          group: max(figures.get(m, {}).get("paired", 0.0) for m in FUSED)
          for group, figures in ratios.items()},
      **_goals(ratios),
  }
  ctx.progress("\n".join([*_step_time_table(summary), "", *_speedup_table(ratios),
                          f"best_fusion_speedup {summary['goals']['best_fusion_speedup']:.3f} "
                          f"({summary['best_fusion_arm']}); models at >= x{GOAL}: "
                          f"{summary['goals']['models_with_fusion_speedup']}"]))
  return summary


BENCHMARK = registry.Benchmark("fusion", measure_fusion, report=write_report, child=child)
