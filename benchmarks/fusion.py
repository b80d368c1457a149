"""``fusion`` suite: step time of unfused vs backward- vs forward-fused optimizer updates.

Models (synthetic data, static batch shapes): the project's CTR model with large embeddings
(26 x Embedding(20000, 16), MLP 256-128) with Adam and with Adagrad, an MLP (3 x 1024) with
Adam, and an LSTM language model (Embedding(10000, 64) -> LSTM(256) -> Dense softmax over the
vocabulary) with Adam, which stands in for the project's LM until issue 5 lands (builders in
``benchmarks/models.py``). Each model trains as arms ``none``, ``backward``, ``forward`` and
``grads_only`` (forward and backward pass without any update: the step time that fusion cannot
touch), with ``jit_compile`` off and on. All arms run interleaved in one process: ``--rounds``
rounds of ``--steps`` steps per arm, so machine noise hits them alike; the report is the best
(least disturbed) and the median round per arm, and fused/unfused speedups from both.

  .venv/bin/python -m benchmarks.fusion [--rounds=7 --steps=30 --models=ctr_adam,mlp_adam]
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Dict, List

import tensorflow as tf
import tf_keras as keras
from absl import app
from absl import flags

from benchmarks.models import MODELS, Arm
from tf_codistill import fusion as fusion_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
flags.DEFINE_integer("steps", 30, "Steps per arm per round.")
flags.DEFINE_integer("rounds", 7, "Interleaved rounds.")
flags.DEFINE_list("models", ["ctr_adam", "ctr_adagrad", "mlp_adam", "lstm_lm_adam"],
                  "Models to measure.")
flags.DEFINE_list("modes", ["none", "backward", "forward", "grads_only"], "Arms per model.")
flags.DEFINE_list("jit", ["0", "1"], "jit_compile settings (0/1).")
flags.DEFINE_float("scale", 1.0, "Scales model sizes and batches down for smoke runs (0 < s <= 1).")
flags.DEFINE_string("out", os.path.join(REPO, "benchmarks", "results", "fusion", "summary.json"),
                    "JSON output.")
FLAGS = flags.FLAGS

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
  return fusion_lib.fuse(model, mode) if mode in ("backward", "forward") else model


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
  for r in range(rounds):
    for key, model in arms.items():
      start = time.perf_counter()
      model.fit(data[key], steps_per_epoch=steps, epochs=1, verbose=0)
      rates[key].append(steps / (time.perf_counter() - start))
    print(f"round {r + 1}/{rounds} done, load {os.getloadavg()[0]:.1f}", flush=True)
  return {key: {"ms_per_step_best": 1e3 / max(r), "ms_per_step_median": 1e3 / statistics.median(r),
                "steps_per_sec": r} for key, r in rates.items()}


def speedups(steps: Dict[str, dict]) -> Dict[str, dict]:
  """Per model and jit setting: unfused / fused step time for each fused mode (best, median),
  and the share of the unfused step spent outside the forward and backward pass."""
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
      continue
    group[mode] = {stat: base[f"ms_per_step_{stat}"] / steps[key][f"ms_per_step_{stat}"]
                   for stat in ("best", "median")}
  return out


def main(argv):
  del argv
  load_before = os.getloadavg()
  start = time.time()
  steps = measure(FLAGS.models, FLAGS.modes, [bool(int(j)) for j in FLAGS.jit], FLAGS.steps,
                  FLAGS.rounds, FLAGS.scale)
  ratios = speedups(steps)
  best_key, best = None, 0.0
  for group, figures in ratios.items():
    for mode in ("backward", "forward"):
      if mode in figures and figures[mode]["best"] > best:
        best_key, best = f"{group}/{mode}", figures[mode]["best"]
  summary = {
      "suite": "fusion",
      "command": "python -m benchmarks.fusion " + " ".join(
          f"--{k}={','.join(v) if isinstance(v, list) else v}" for k, v in
          (("rounds", FLAGS.rounds), ("steps", FLAGS.steps), ("models", FLAGS.models),
           ("jit", FLAGS.jit), ("scale", FLAGS.scale))),
      "config": {"steps": FLAGS.steps, "rounds": FLAGS.rounds, "scale": FLAGS.scale,
                 "cpus": os.cpu_count(), "tensorflow": tf.__version__},
      "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
      "wall_s": time.time() - start,
      "step_time": steps,
      "speedup_unfused_over_fused": ratios,
      "goals": {"best_fusion_speedup": best, "best_fusion_arm": best_key,
                "target": 1.10, "met": best >= 1.10},
  }
  print(f"\n{'model/jit':<22} {'unfused ms':>10} {'backward':>16} {'forward':>16} {'update share':>13}")
  for group, figures in ratios.items():
    unfused = steps[f"{group}/none"]
    cells = [f"{figures[m]['best']:.2f} ({figures[m]['median']:.2f})" if m in figures else "n/a"
             for m in ("backward", "forward")]
    share = figures.get("update_share_best")
    print(f"{group:<22} {unfused['ms_per_step_best']:>10.1f} {cells[0]:>16} {cells[1]:>16} "
          f"{'n/a' if share is None else f'{share:.0%}':>13}")
  print(f"speedups are unfused/fused step time, best round (median round); "
        f"best_fusion_speedup {best:.3f} ({best_key})")
  os.makedirs(os.path.dirname(FLAGS.out), exist_ok=True)
  with open(FLAGS.out, "w") as f:
    json.dump(summary, f, indent=2)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
