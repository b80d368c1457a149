"""Why ``fusion='forward'`` is refused under parameter servers, measured on a real local cluster.

Forward fusion keeps each step's gradient in a pending variable and applies it at the start of
the *next* step, right before the layer reads its weights (fusion.py). Under
ParameterServerStrategy every variable, the pending one included, lives on a ps task, and the
coordinator schedules each step function on whichever worker is free. Here each step function
does what forward fusion does, with a gradient that carries an id: it applies the pending
gradient (counting, per id, how often it was applied), computes for a while (``work`` matmuls,
as a forward and backward pass would), then stores its own gradient as pending. After
``coordinator.join()`` the last pending gradient is flushed. With one worker every gradient is
applied exactly once; with two, steps overlap on the shared pending variable, and gradients are
lost (overwritten before any step applied them) or applied twice. The coordinator of each arm is
this benchmark's ``child`` (``registry.child_command``).

  python -m benchmarks.run forward_fusion_ps [--gin_bindings='bench.forward_fusion_ps.steps = 2000']
"""

from __future__ import annotations

import json
import subprocess
from typing import Dict, List

import gin
import numpy as np
import tensorflow as tf

from benchmarks import registry
from tf_codistill.testing import local_cluster

NAME = "forward_fusion_ps"


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


def _arm(workers: int, steps: int, work: int) -> Dict[str, object]:
  """One arm: a cluster of ``workers`` workers and one ps, its coordinator in a child process."""
  cluster = local_cluster.free_cluster({"chief": 1, "worker": workers, "ps": 1})
  with local_cluster.servers(cluster):
    done = subprocess.run(
        registry.child_command(NAME, {"cluster": cluster, "steps": steps, "work": work}),
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


def child(spec: dict) -> None:
  """An arm's coordinator (``_arm`` starts it): ``spec`` holds the ``cluster``, ``steps`` and
  ``work``; prints every step's applied count as one JSON line on stdout."""
  strategy = local_cluster.ps_strategy(spec["cluster"])
  print(json.dumps(_applied_counts(strategy, spec["steps"], spec["work"]).tolist()))


@gin.configurable(NAME, module="bench", denylist=["ctx"])
def measure_forward_fusion_ps(ctx: registry.Context, steps: int = 2000, work: int = 4) -> dict:
  """Every gradient's fate under forward fusion's pending protocol, with one worker and two.

  Args:
    ctx: the run's context.
    steps: step functions scheduled per arm.
    work: 128x128 matmuls per step between reading and storing pending.
  """
  arms = {f"{n}_workers": _arm(n, steps, work) for n in (1, 2)}
  ctx.progress("\n".join(_tables({"arms": arms})))
  return {"arms": arms, "config": {"steps": steps, "work": work}}


def _tables(summary: dict) -> List[str]:
  """Each arm's gradients by how often they were applied, as Markdown."""
  lines = ["| arm | gradients | applied once | lost | applied twice or more | lost fraction |",
           "| --- | --- | --- | --- | --- | --- |"]
  lines += [f"| {name} | {arm['steps']} | {arm['applied_once']} | {arm['lost']} | "
            f"{arm['applied_twice_or_more']} | {arm['lost_fraction']:.3f} |"
            for name, arm in summary["arms"].items()]
  return lines


BENCHMARK = registry.Benchmark(
    NAME, measure_forward_fusion_ps, tables=_tables, child=child,
    title="Forward fusion under parameter servers: gradients applied once, lost or applied "
          "twice")
