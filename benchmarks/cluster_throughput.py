"""Groups on real local clusters, measured in one run: examples/sec per group for sync
(MultiWorkerMirrored) and async (ParameterServer) SGD with 1 and 2 workers, the step time the
training loop sees during a teacher refresh vs without, and the recovery from a killed worker.

Every arm runs ``tf-codistill-launch`` as users do (one process per task, TF_CONFIG, ports on
127.0.0.1) on generated Criteo-format files, one arm after the other.

  .venv/bin/python -m benchmarks.cluster_throughput [--steps=600]
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Dict, List

from absl import flags

from benchmarks import machine
from benchmarks import standalone
from tf_codistill import layout

flags.DEFINE_integer("steps", 600, "Training steps per arm (all workers together for async).")
flags.DEFINE_integer("batch_size", 256, "Examples per worker step (sync: per replica).")
flags.DEFINE_integer("train_rows", 200_000, "Generated training rows.")
standalone.define_flags("cluster")
FLAGS = flags.FLAGS

MODEL = ("NUM_BUCKETS = 5000", "models.ctr_model.embedding_dim = 8",
         "models.ctr_model.hidden_units = (64, 32)", "trainer.train.verbose = 0",
         "trainer.train.eval_steps = 20", "trainer.train.summary_every_steps = 20",
         "trainer.train.checkpoint_every_steps = 200")


def _launch(name: str, work: str, strategy: str, workers: int, ps: int, groups: int, gin: str,
            bindings: List[str], extra_flags: List[str] = ()) -> standalone.Launch:
  """One arm's launch into a fresh ``work/name`` (a finished checkpoint would make it a no-op)."""
  model_dir = os.path.join(work, name)
  shutil.rmtree(model_dir, ignore_errors=True)
  shape = [f"--num_groups={groups}", f"--strategy={strategy}", f"--workers_per_group={workers}",
           f"--ps_per_group={ps}", *extra_flags]
  return standalone.Launch(standalone.launch_args(model_dir, gin, shape, bindings))


def _progress(model_dir: str, group: int = 0) -> int:
  path = layout.group_run(model_dir, group).progress
  return len(open(path).readlines()) if os.path.exists(path) else 0


def throughput(work: str, common: List[str]) -> Dict[str, dict]:
  """Examples/sec of one group, alone on the machine, per strategy and worker count."""
  out = {}
  for name, strategy, workers, ps in (("sync_1worker", "multi_worker_mirrored", 0, 0),
                                      ("sync_2workers", "multi_worker_mirrored", 1, 0),
                                      ("async_1worker", "parameter_server", 1, 1),
                                      ("async_2workers", "parameter_server", 2, 1)):
    replicas = workers + 1 if strategy == "multi_worker_mirrored" else 1
    run = _launch(name, work, strategy, workers, ps, 1, "baseline.gin",
                  common + [f"trainer.train.batch_size = {FLAGS.batch_size * replicas}"])
    wall = run.finish()
    results = run.results()
    out[name] = {"examples_per_sec": results["examples_per_sec"], "wall_s": wall,
                 "val_logloss": results["val_logloss"]}
    print(f"{name:>15}: {results['examples_per_sec']:8.0f} examples/sec per group "
          f"(median over {FLAGS.steps} steps), wall {wall:.0f}s, "
          f"val logloss {results['val_logloss']:.4f}", flush=True)
  return out


def refresh_step_times(work: str, common: List[str]) -> Dict[str, dict]:
  """Step time during teacher refreshes vs without, 2-way codistillation."""
  out = {}
  for name, strategy, workers, ps in (("one_device", "one_device", 0, 0),
                                      ("sync_2workers", "multi_worker_mirrored", 1, 0)):
    run = _launch(f"refresh_{name}", work, strategy, workers, ps, 2, "codistill_2way.gin",
                  common + [f"trainer.train.batch_size = {FLAGS.batch_size * (workers + 1)}",
                            "trainer.train.burn_in_steps = 50",
                            "trainer.train.publish_every_steps = 25",
                            "trainer.train.poll_interval_s = 0.2"])
    run.finish()
    arm = {}
    for group in (0, 1):
      results = run.results(group)
      times = results["step_time_ms"]
      arm[f"group_{group}"] = {"teacher_loads": results["teacher_loads"], "step_time_ms": times}
      print(f"refresh {name} group {group}: {results['teacher_loads']} refreshes; step time "
            "p50/p99 ms (steps): " + ", ".join(
                f"{key} {t['p50']:.1f}/{t['p99']:.1f} ({t['count']})"
                for key, t in sorted(times.items()) if t["count"]), flush=True)
    out[name] = arm
  return out


def worker_kill(work: str, common: List[str], wall_without_kill: float) -> dict:
  """An async worker killed once its group has trained a third of its steps: restart and
  recovery times, and the wall time against the same arm without the kill."""
  run = _launch("async_2workers_killed", work, "parameter_server", 2, 1, 1, "baseline.gin",
                common + [f"trainer.train.batch_size = {FLAGS.batch_size}"], ["--max_restarts=2"])
  standalone.wait_for(lambda: _progress(run.model_dir) >= 1, 600, "the first epoch")
  killed_at = time.monotonic()
  os.kill(run.pids[(0, "worker", 0)], 9)
  worker_log = layout.group_run(run.model_dir, 0).task_log("worker", 0)
  standalone.wait_for(lambda: open(worker_log).read().count("serving worker:0") >= 2, 600,
                      "the restarted worker")
  serving_again = time.monotonic() - killed_at
  wall = run.finish()
  restarted = next(e["monotonic"] for e in run.events() if e["event"] == "restarted") - killed_at
  results = run.results()
  print(f"killed async worker: launcher restarted it after {restarted:.1f}s, serving again after "
        f"{serving_again:.1f}s; all {results['steps']} steps done in {wall:.0f}s "
        f"(vs {wall_without_kill:.0f}s without the kill)", flush=True)
  return {"launcher_restart_s": restarted, "worker_serving_again_s": serving_again,
          "wall_s": wall, "wall_s_without_kill": wall_without_kill, "steps": results["steps"],
          "examples_per_sec": results["examples_per_sec"]}


def main(argv):
  del argv
  work = standalone.work_dir("cluster_bench")
  data = standalone.ensure_ctr_data(os.path.join(work, "data"), FLAGS.train_rows)
  common = list(MODEL) + standalone.ctr_data_bindings(data) + [
      f"trainer.train.train_steps = {FLAGS.steps}",
      f"trainer.train.steps_per_epoch = {FLAGS.steps // 3}"]
  summary = {"steps": FLAGS.steps, "batch_per_worker": FLAGS.batch_size, "cpus": os.cpu_count()}
  summary["throughput"] = throughput(work, common)
  summary["refresh"] = refresh_step_times(work, common)
  summary["worker_kill"] = worker_kill(work, common,
                                       summary["throughput"]["async_2workers"]["wall_s"])
  machine.write_json(FLAGS.out, summary)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  machine.run_script(main, "benchmarks.cluster_throughput")
