"""Why ``fusion='forward'`` is refused under parameter servers, measured on a real local cluster.

Forward fusion keeps each step's gradient in a pending variable and applies it at the start of
the *next* step, right before the layer reads its weights (fusion.py). Under
ParameterServerStrategy every variable, the pending one included, lives on a ps task, and the
coordinator schedules each step function on whichever worker is free. Here each step function
does what forward fusion does, with a gradient that carries an id: it applies the pending
gradient (counting, per id, how often it was applied), computes for a while (``--work``
matmuls, as a forward and backward pass would), then stores its own gradient as pending. After
``coordinator.join()`` the last pending gradient is flushed. With one worker every gradient is
applied exactly once; with two, steps overlap on the shared pending variable, and gradients are
lost (overwritten before any step applied them) or applied twice.

  .venv/bin/python -m benchmarks.forward_fusion_ps [--steps=2000]
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Dict

import numpy as np
import tensorflow as tf
from absl import flags

from benchmarks import local_cluster
from benchmarks import machine
from benchmarks import standalone

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the script's flags (in main only: tests import this module beside others)."""
  flags.DEFINE_integer("steps", 2000, "Step functions scheduled per arm.")
  flags.DEFINE_integer("work", 4, "128x128 matmuls per step between reading and storing pending.")
  flags.DEFINE_string("cluster", "", "Internal: the coordinator's cluster spec (JSON).")
  standalone.define_flags("forward_fusion_ps", work_dir=False)


def _applied_counts(strategy: tf.distribute.Strategy, steps: int, work: int) -> np.ndarray:
  """How often each step's gradient was applied under forward fusion's pending protocol."""
  with strategy.scope():
    pending = tf.Variable(tf.constant(-1, tf.int64), name="pending")
    applied = tf.Variable(tf.zeros([steps], tf.int32), name="applied")
    next_id = tf.Variable(tf.constant(0, tf.int64), name="next_id")

  @tf.function
  def step():
    previous = pending.read_value()
    if previous >= 0:  # forward fusion: the last step's update runs before this step's forward
      applied.scatter_add(tf.IndexedSlices(tf.ones([1], tf.int32), tf.reshape(previous, [1])))
    gradient_id = next_id.assign_add(1) - 1
    x = tf.fill([128, 128], 1e-3)
    for _ in range(work):  # this step's forward and backward pass
      x = tf.matmul(x, x)
    with tf.control_dependencies([x]):
      pending.assign(gradient_id)

  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  for _ in range(steps):
    coordinator.schedule(step)
  coordinator.join()
  last = int(pending.numpy())  # flush(): apply what is still pending
  counts = applied.numpy()
  if last >= 0:
    counts[last] += 1
  return counts


def _arm(workers: int) -> Dict[str, object]:
  cluster = local_cluster.free_cluster({"chief": 1, "worker": workers, "ps": 1})
  with local_cluster.servers(cluster):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.forward_fusion_ps", f"--cluster={json.dumps(cluster)}",
         f"--steps={FLAGS.steps}", f"--work={FLAGS.work}"],
        capture_output=True, text=True, timeout=1800, preexec_fn=local_cluster.die_with_parent)
  if done.returncode:
    raise RuntimeError(f"the coordinator failed: {done.stderr[-3000:]}")
  return {"workers": workers,
          **accounting(np.asarray(json.loads(done.stdout.strip().splitlines()[-1])))}


def accounting(counts: np.ndarray) -> Dict[str, object]:
  """Sorts gradients by how often they were applied: once (correct), never (lost), or more."""
  return {"steps": int(counts.size), "applied_once": int((counts == 1).sum()),
          "lost": int((counts == 0).sum()), "applied_twice_or_more": int((counts > 1).sum()),
          "lost_fraction": float((counts == 0).mean())}


def _coordinate() -> None:
  strategy = local_cluster.ps_strategy(json.loads(FLAGS.cluster))
  print(json.dumps(_applied_counts(strategy, FLAGS.steps, FLAGS.work).tolist()))


def main(argv):
  del argv
  if FLAGS.cluster:
    return _coordinate()
  arms = {f"{n}_workers": _arm(n) for n in (1, 2)}
  for name, arm in arms.items():
    print(f"{name}: of {arm['steps']} gradients, {arm['applied_once']} applied once, "
          f"{arm['lost']} lost, {arm['applied_twice_or_more']} applied twice or more")
  machine.write_json(FLAGS.out, {"arms": arms, "config": {"steps": FLAGS.steps,
                                                             "work": FLAGS.work}})


if __name__ == "__main__":
  define_flags()
  machine.run_script(main, "benchmarks.forward_fusion_ps", unless=("cluster",))
