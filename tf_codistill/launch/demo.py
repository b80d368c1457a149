"""The embedded default job: generate Criteo-format data, train 2-way codistillation and a baseline.

Everything runs through the same launcher, binaries and gin configs a user would use; the demo
only picks small sizes and prints a table of validation log loss and AUC per group.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import threading
import time
from typing import Dict, List, Sequence, Tuple

import tensorflow as tf

from data_pipelines import make_criteo_like
from tf_codistill import layout
from tf_codistill.launch import gin_config as config
from tf_codistill.launch import launcher

_DEMO_BINDINGS = (
    "trainer.train.train_steps = {steps}",
    "trainer.train.steps_per_epoch = {steps_per_epoch}",
    "trainer.train.eval_steps = None",
    "tfc.Data.train_files = ['{data}/train-*']",
    "tfc.Data.eval_files = ['{data}/eval-*']",
    "trainer.train.verbose = 0",
    # Small enough to run in minutes on 2 cores, large enough that no group repeats its shard.
    "NUM_BUCKETS = 5000",
    "models.ctr_model.embedding_dim = 8",
)
# Two groups share the machine's cores: one intra-op thread each avoids oversubscription.
_SHARED_CORES = ("trainer.train.intra_op_threads = 1", "trainer.train.inter_op_threads = 1")


def generate_data(data_dir: str, train_rows: int, eval_rows: int, seed: int = 0) -> None:
  """Writes the demo's train and eval files from one planted ground-truth model."""
  make_criteo_like.generate(data_dir, train_rows, num_files=4, seed=seed, prefix="train")
  make_criteo_like.generate(data_dir, eval_rows, num_files=1, seed=seed + 1, prefix="eval")


def sample_data_files(data_dir: str) -> Tuple[List[str], List[str]]:
  """The (train, eval) file patterns of the sample data in ``data_dir``."""
  return [os.path.join(data_dir, "train-*")], [os.path.join(data_dir, "eval-*")]


def sample_data(data_dir: str, train_rows: int = 400_000,
                eval_rows: int = 20_000) -> Tuple[List[str], List[str]]:
  """Generated Criteo-format files for a job started without data; reused when already there."""
  train, evaluation = sample_data_files(data_dir)
  if not (tf.io.gfile.glob(train[0]) and tf.io.gfile.glob(evaluation[0])):
    generate_data(data_dir, train_rows, eval_rows)
  return train, evaluation


def _follow_progress(job_dirs: Dict[str, str], stop: threading.Event, interval: float = 2.0):
  """Prints each group's per-epoch progress lines as the groups write them."""
  seen: Dict[str, int] = {}
  while True:
    for label, path in job_dirs.items():
      progress = layout.RunDir(path).progress
      if not os.path.exists(progress):
        continue
      with open(progress) as f:
        lines = f.read().splitlines()
      for line in lines[seen.get(progress, 0):]:
        r = json.loads(line)
        print(f"  [{label}] step {r['step']:>5}/{r['total_steps']}  loss {r['loss']:.4f}  "
              f"val_logloss {r.get('val_logloss', float('nan')):.4f}  "
              f"alpha {r.get('alpha', 0.0):.1f}  staleness {r.get('teacher_staleness', -1):.0f}",
              flush=True)
      seen[progress] = len(lines)
    if stop.wait(interval):
      return


def _run_job(title: str, model_dir: str, num_groups: int, gin_file: str,
             bindings: Sequence[str]) -> List[dict]:
  print(f"{title}: {num_groups} group(s), logs under {model_dir}", flush=True)
  labels = {f"{title} g{g}": layout.group_dir(model_dir, g) for g in range(num_groups)}
  stop = threading.Event()
  follower = threading.Thread(target=_follow_progress, args=(labels, stop), daemon=True)
  follower.start()
  try:
    dirs = launcher.launch_groups(model_dir, num_groups, gin_files=[gin_file],
                                  gin_bindings=bindings)
  finally:
    stop.set()
    follower.join()
  results = []
  for g in sorted(dirs):
    with open(layout.RunDir(dirs[g]).results) as f:
      results.append(json.load(f))
  return results


def run_demo(work_dir: str = "demo_run", *, train_rows: int = 1_600_000, eval_rows: int = 50_000,
             steps: int = 1500, steps_per_epoch: int = 250) -> List[dict]:
  """Runs the demo end to end in ``work_dir`` (recreated) and returns one row per model."""
  start = time.time()
  print(stack_line(), flush=True)
  shutil.rmtree(work_dir, ignore_errors=True)
  data_dir = os.path.join(work_dir, "data")
  print(f"Generating {train_rows} training and {eval_rows} validation rows "
        f"(Criteo TSV format) in {data_dir}", flush=True)
  generate_data(data_dir, train_rows, eval_rows)
  bindings = [b.format(steps=steps, steps_per_epoch=steps_per_epoch, data=data_dir)
              for b in _DEMO_BINDINGS]
  gin_dir = os.path.join(config.REPO_GIN_DIR, "criteo")
  rows = []
  for r in _run_job("baseline", os.path.join(work_dir, "baseline"), 1,
                    os.path.join(gin_dir, "baseline.gin"), bindings):
    rows.append({"model": "baseline", **r})
  for r in _run_job("codistill", os.path.join(work_dir, "codistill"), 2,
                    os.path.join(gin_dir, "codistill_2way.gin"), bindings + list(_SHARED_CORES)):
    rows.append({"model": f"codistill group {r['group']}", **r})
  print()
  print(format_table(rows))
  print(f"\nDemo finished in {time.time() - start:.0f}s; models, logs and TensorBoard "
        f"summaries are under {work_dir}/")
  return rows


def stack_line() -> str:
  """What the demo runs on: tf-codistill's, TensorFlow's, tf_keras's and Python's versions."""
  import tf_keras  # pylint: disable=g-import-not-at-top

  from tf_codistill import __version__  # pylint: disable=g-import-not-at-top
  return (f"tf-codistill {__version__} on TensorFlow {tf.__version__}, "
          f"tf_keras {tf_keras.__version__}, Python {platform.python_version()}")


def format_table(rows: Sequence[dict]) -> str:
  """A plain-text table of the demo's results."""
  header = (f"{'model':<20} {'steps':>6} {'val logloss':>12} {'val AUC':>8} {'examples/s':>11} "
            f"{'teacher loads':>14}")
  lines = [header, "-" * len(header)]
  for r in rows:
    loads = r.get("teacher_loads", "-")
    rate = r.get("examples_per_sec") or float("nan")
    lines.append(f"{r['model']:<20} {r['steps']:>6} {r['val_logloss']:>12.4f} "
                 f"{r['val_auc']:>8.4f} {rate:>11.0f} {loads!s:>14}")
  return "\n".join(lines)
