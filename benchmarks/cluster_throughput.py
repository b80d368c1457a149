"""Groups on real local clusters, measured in one run: examples/sec per group for sync
(MultiWorkerMirrored) and async (ParameterServer) SGD with 1 and 2 workers, the step time the
training loop sees during a teacher refresh vs without, and the recovery from a killed worker.

Every arm runs ``tf-codistill-launch`` as users do (one process per task, TF_CONFIG, ports on
127.0.0.1) on generated Criteo-format files, one arm after the other.

  python -m benchmarks.run cluster_throughput
  python -m benchmarks.run cluster_throughput --gin_bindings='bench.cluster_throughput.steps = 300'
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Callable, Dict, List

import gin

from benchmarks import registry
from benchmarks import standalone
from tf_codistill import layout

MODEL = ("NUM_BUCKETS = 5000", "models.ctr_model.embedding_dim = 8",
         "models.ctr_model.hidden_units = (64, 32)", "trainer.train.verbose = 0",
         "trainer.train.eval_steps = 20", "trainer.train.summary_every_steps = 20",
         "tfc.Checkpoints.every_steps = 200")


def _launch(name: str, work: str, strategy: str, workers: int, ps: int, groups: int,
            gin_file: str, bindings: List[str], extra_flags: List[str] = ()) -> standalone.Launch:
  """One arm's launch into a fresh ``work/name`` (a finished checkpoint would make it a no-op)."""
  model_dir = os.path.join(work, name)
  shutil.rmtree(model_dir, ignore_errors=True)
  shape = [f"--num_groups={groups}", f"--strategy={strategy}", f"--workers_per_group={workers}",
           f"--ps_per_group={ps}", *extra_flags]
  return standalone.Launch(standalone.launch_args(model_dir, gin_file, shape, bindings))


def throughput(work: str, common: List[str], batch_size: int, steps: int,
               progress: Callable[[str], None] = print) -> Dict[str, dict]:
  """Examples/sec of one group, alone on the machine, per strategy and worker count."""
  out = {}
  for name, strategy, workers, ps in (("sync_1worker", "multi_worker_mirrored", 0, 0),
                                      ("sync_2workers", "multi_worker_mirrored", 1, 0),
                                      ("async_1worker", "parameter_server", 1, 1),
                                      ("async_2workers", "parameter_server", 2, 1)):
    replicas = workers + 1 if strategy == "multi_worker_mirrored" else 1
    run = _launch(name, work, strategy, workers, ps, 1, "baseline.gin",
                  common + [f"tfc.Data.batch_size = {batch_size * replicas}"])
    wall = run.finish()
    results = run.results()
    out[name] = {"examples_per_sec": results["examples_per_sec"], "wall_s": wall,
                 "val_logloss": results["val_logloss"]}
    progress(f"{name:>15}: {results['examples_per_sec']:8.0f} examples/sec per group "
             f"(median over {steps} steps), wall {wall:.0f}s, "
             f"val logloss {results['val_logloss']:.4f}")
  return out


def refresh_step_times(work: str, common: List[str], batch_size: int,
                       progress: Callable[[str], None] = print) -> Dict[str, dict]:
  """Step time during teacher refreshes vs without, 2-way codistillation."""
  out = {}
  for name, strategy, workers, ps in (("one_device", "one_device", 0, 0),
                                      ("sync_2workers", "multi_worker_mirrored", 1, 0)):
    run = _launch(f"refresh_{name}", work, strategy, workers, ps, 2, "codistill_2way.gin",
                  common + [f"tfc.Data.batch_size = {batch_size * (workers + 1)}",
                            "tfc.Distillation.burn_in_steps = 50",
                            "tfc.Exchange.publish_every_steps = 25",
                            "tfc.Exchange.poll_interval_s = 0.2"])
    run.finish()
    arm = {}
    for group in (0, 1):
      results = run.results(group)
      times = results["step_time_ms"]
      arm[f"group_{group}"] = {"teacher_loads": results["teacher_loads"], "step_time_ms": times}
      progress(f"refresh {name} group {group}: {results['teacher_loads']} refreshes; step time "
               "p50/p99 ms (steps): " + _step_times_text(times))
    out[name] = arm
  return out


def _step_times_text(times: Dict[str, dict]) -> str:
  """``key p50/p99 (count)`` of every kind of step that occurred."""
  return ", ".join(f"{key} {t['p50']:.1f}/{t['p99']:.1f} ({t['count']})"
                   for key, t in sorted(times.items()) if t["count"])


def worker_kill(work: str, common: List[str], wall_without_kill: float, batch_size: int,
                progress: Callable[[str], None] = print) -> dict:
  """An async worker killed once its group has trained a third of its steps: restart and
  recovery times, and the wall time against the same arm without the kill."""
  run = _launch("async_2workers_killed", work, "parameter_server", 2, 1, 1, "baseline.gin",
                common + [f"tfc.Data.batch_size = {batch_size}"], ["--max_restarts=2"])
  progress_path = layout.group_run(run.model_dir, 0).progress  # a line per epoch's evaluation
  standalone.wait_for(lambda: os.path.exists(progress_path) and os.path.getsize(progress_path),
                      600, "the first epoch")
  killed_at = time.monotonic()
  os.kill(run.pids[(0, "worker", 0)], 9)
  worker_log = layout.group_run(run.model_dir, 0).task_log("worker", 0)
  standalone.wait_for(lambda: open(worker_log).read().count("serving worker:0") >= 2, 600,
                      "the restarted worker")
  serving_again = time.monotonic() - killed_at
  wall = run.finish()
  restarted = next(e["monotonic"] for e in run.events() if e["event"] == "restarted") - killed_at
  results = run.results()
  progress(f"killed async worker: launcher restarted it after {restarted:.1f}s, serving again "
           f"after {serving_again:.1f}s; all {results['steps']} steps done in {wall:.0f}s "
           f"(vs {wall_without_kill:.0f}s without the kill)")
  return {"launcher_restart_s": restarted, "worker_serving_again_s": serving_again,
          "wall_s": wall, "wall_s_without_kill": wall_without_kill, "steps": results["steps"],
          "examples_per_sec": results["examples_per_sec"]}


@gin.configurable("cluster_throughput", module="bench", denylist=["ctx"])
def measure_clusters(ctx: registry.Context, steps: int = 600, batch_size: int = 256,
                     train_rows: int = 200_000) -> dict:
  """Every arm's throughput, the refresh step times and the killed worker's recovery.

  Args:
    ctx: the run's context (data and the arms' model directories go under its work_dir).
    steps: training steps per arm (all workers together for async).
    batch_size: examples per worker step (sync: per replica).
    train_rows: generated training rows.
  """
  work = ctx.work_dir
  # Made once per size and reused by later runs (a run of another size gets its own).
  data = standalone.ensure_ctr_data(os.path.join(work, f"data_{train_rows}"), train_rows)
  common = list(MODEL) + standalone.ctr_data_bindings(data) + [
      f"trainer.train.train_steps = {steps}",
      f"trainer.train.steps_per_epoch = {steps // 3}"]
  summary = {"steps": steps, "batch_per_worker": batch_size, "cpus": os.cpu_count()}
  summary["throughput"] = throughput(work, common, batch_size, steps, ctx.progress)
  summary["refresh"] = refresh_step_times(work, common, batch_size, ctx.progress)
  summary["worker_kill"] = worker_kill(work, common,
                                       summary["throughput"]["async_2workers"]["wall_s"],
                                       batch_size, ctx.progress)
  return summary


def _tables(summary: dict) -> List[str]:
  """The arms' throughput, the refresh step times and the worker kill, as Markdown."""
  lines = [f"{summary['steps']} training steps per arm, batch {summary['batch_per_worker']} per "
           f"worker (sync: per replica), {summary['cpus']} CPUs.", "",
           "| arm | examples/sec per group | wall s | val logloss |", "| --- | --- | --- | --- |"]
  lines += [f"| {name} | {arm['examples_per_sec']:.0f} | {arm['wall_s']:.1f} | "
            f"{arm['val_logloss']:.4f} |" for name, arm in summary["throughput"].items()]
  lines += ["", "| refresh arm | group | teacher loads | step time p50/p99 ms (steps) |",
            "| --- | --- | --- | --- |"]
  lines += [f"| {name} | {group} | {g['teacher_loads']} | {_step_times_text(g['step_time_ms'])} |"
            for name, arm in summary["refresh"].items() for group, g in sorted(arm.items())]
  kill = summary["worker_kill"]
  lines += ["", f"Killed async worker: the launcher restarted it after "
            f"{kill['launcher_restart_s']:.1f} s, serving again after "
            f"{kill['worker_serving_again_s']:.1f} s; all {kill['steps']} steps done in "
            f"{kill['wall_s']:.0f} s (vs {kill['wall_s_without_kill']:.0f} s without the kill), "
            f"{kill['examples_per_sec']:.0f} examples/sec."]
  return lines


BENCHMARK = registry.Benchmark(
    "cluster_throughput", measure_clusters, tables=_tables,
    title="Cluster throughput: sync and async groups on local clusters")
