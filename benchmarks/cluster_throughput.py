"""Groups on real local clusters, measured in one run: examples/sec per group for sync
(MultiWorkerMirrored) and async (ParameterServer) SGD with 1 and 2 workers, the step time the
training loop sees during a teacher refresh vs without, and the recovery from a killed worker.

Every arm runs ``tf-codistill-launch`` as users do (one process per task, TF_CONFIG, ports on
127.0.0.1) on generated Criteo-format files, one arm after the other.

  .venv/bin/python -m benchmarks.cluster_throughput [--steps=600]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Sequence

from absl import app
from absl import flags

from benchmarks import machine
from data_pipelines import make_criteo_like
from tf_codistill import launcher
from tf_codistill import layout

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
flags.DEFINE_integer("steps", 600, "Training steps per arm (all workers together for async).")
flags.DEFINE_integer("batch_size", 256, "Examples per worker step (sync: per replica).")
flags.DEFINE_integer("train_rows", 200_000, "Generated training rows.")
flags.DEFINE_string("work_dir", None, "Where data and runs go (default: a temporary directory).")
flags.DEFINE_string("out", os.path.join(REPO, "benchmarks", "results", "cluster", "summary.json"),
                    "JSON output.")
FLAGS = flags.FLAGS

MODEL = ("NUM_BUCKETS = 5000", "models.ctr_model.embedding_dim = 8",
         "models.ctr_model.hidden_units = (64, 32)", "trainer.train.verbose = 0",
         "trainer.train.eval_steps = 20", "trainer.train.summary_every_steps = 20",
         "trainer.train.checkpoint_every_steps = 200")


class Run:
  """tf-codistill-launch in a subprocess; stderr lines are kept with their arrival times."""

  def __init__(self, model_dir: str, flags_: Sequence[str], bindings: Sequence[str]):
    self.model_dir = model_dir
    shutil.rmtree(model_dir, ignore_errors=True)  # a finished checkpoint would make it a no-op
    args = [sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={model_dir}", *flags_]
    args += [f"--gin_bindings={b}" for b in bindings]
    self.start = time.monotonic()
    self.proc = subprocess.Popen(args, cwd=REPO, stderr=subprocess.PIPE, text=True,
                                 stdout=subprocess.DEVNULL)
    self.lines: List[tuple] = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.proc.stderr:
      self.lines.append((time.monotonic(), line))

  def wait(self) -> float:
    code = self.proc.wait()
    self._reader.join()
    if code:
      raise RuntimeError(f"launch in {self.model_dir} exited {code}:\n" +
                         "".join(l for _, l in self.lines[-30:]))
    return time.monotonic() - self.start

  def results(self, group: int = 0) -> dict:
    with open(layout.group_run(self.model_dir, group).results) as f:
      return json.load(f)


def _progress(model_dir: str, group: int = 0) -> int:
  path = layout.group_run(model_dir, group).progress
  return len(open(path).readlines()) if os.path.exists(path) else 0


def _wait(condition, timeout: float = 600.0) -> None:
  deadline = time.monotonic() + timeout
  while not condition():
    if time.monotonic() > deadline:
      raise TimeoutError("benchmark arm stalled")
    time.sleep(0.05)


def _arm_flags(strategy: str, workers: int, ps: int, groups: int, gin: str) -> List[str]:
  return [f"--gin_file={REPO}/gin/criteo/{gin}", f"--num_groups={groups}",
          f"--strategy={strategy}", f"--workers_per_group={workers}", f"--ps_per_group={ps}"]


def main(argv):
  del argv
  work = FLAGS.work_dir or tempfile.mkdtemp(prefix="cluster_bench_")
  data = os.path.join(work, "data")
  if not os.path.exists(os.path.join(data, "eval-00000-of-00001.tsv")):
    make_criteo_like.generate(data, FLAGS.train_rows, num_files=4, seed=0, prefix="train")
    make_criteo_like.generate(data, 10_000, num_files=1, seed=1, prefix="eval")
  common = list(MODEL) + [f"trainer.train.train_files = ['{data}/train-*']",
                          f"trainer.train.eval_files = ['{data}/eval-*']",
                          f"trainer.train.train_steps = {FLAGS.steps}",
                          f"trainer.train.steps_per_epoch = {FLAGS.steps // 3}"]
  summary: Dict[str, dict] = {"steps": FLAGS.steps, "batch_per_worker": FLAGS.batch_size,
                              "cpus": os.cpu_count(), "throughput": {}, "refresh": {}}

  # 1. Examples/sec of one group, alone on the machine.
  for name, strategy, workers, ps in (("sync_1worker", "multi_worker_mirrored", 0, 0),
                                      ("sync_2workers", "multi_worker_mirrored", 1, 0),
                                      ("async_1worker", "parameter_server", 1, 1),
                                      ("async_2workers", "parameter_server", 2, 1)):
    replicas = workers + 1 if strategy == "multi_worker_mirrored" else 1
    run = Run(os.path.join(work, name), _arm_flags(strategy, workers, ps, 1, "baseline.gin"),
              common + [f"trainer.train.batch_size = {FLAGS.batch_size * replicas}"])
    wall = run.wait()
    results = run.results()
    summary["throughput"][name] = {"examples_per_sec": results["examples_per_sec"],
                                   "wall_s": wall, "val_logloss": results["val_logloss"]}
    print(f"{name:>15}: {results['examples_per_sec']:8.0f} examples/sec per group "
          f"(median over {FLAGS.steps} steps), wall {wall:.0f}s, "
          f"val logloss {results['val_logloss']:.4f}", flush=True)

  # 2. Step time during teacher refreshes vs without, 2-way codistillation.
  for name, strategy, workers, ps in (("one_device", "one_device", 0, 0),
                                      ("sync_2workers", "multi_worker_mirrored", 1, 0)):
    replicas = workers + 1
    run = Run(os.path.join(work, f"refresh_{name}"),
              _arm_flags(strategy, workers, ps, 2, "codistill_2way.gin"),
              common + [f"trainer.train.batch_size = {FLAGS.batch_size * replicas}",
                        "trainer.train.burn_in_steps = 50", "trainer.train.exchange_every_steps = 25",
                        "trainer.train.poll_interval_s = 0.2"])
    run.wait()
    arm = {}
    for group in (0, 1):
      results = run.results(group)
      arm[f"group_{group}"] = {"teacher_loads": results["teacher_loads"],
                               "step_time_ms": results["step_time_ms"]}
      times = results["step_time_ms"]
      print(f"refresh {name} group {group}: {results['teacher_loads']} refreshes; step time "
            "p50/p99 ms (steps): " + ", ".join(
                f"{key} {t['p50']:.1f}/{t['p99']:.1f} ({t['count']})"
                for key, t in sorted(times.items()) if t["count"]), flush=True)
    summary["refresh"][name] = arm

  # 3. An async worker killed once its group has trained a third of its steps.
  name = "async_2workers_killed"
  run = Run(os.path.join(work, name),
            _arm_flags("parameter_server", 2, 1, 1, "baseline.gin") + ["--max_restarts=2"],
            common + [f"trainer.train.batch_size = {FLAGS.batch_size}"])
  _wait(lambda: _progress(run.model_dir) >= 1)
  killed_at = time.monotonic()
  os.kill(launcher.task_pids(launcher.read_events(run.model_dir))[(0, "worker", 0)], 9)
  worker_log = layout.group_run(run.model_dir, 0).task_log("worker", 0)
  _wait(lambda: open(worker_log).read().count("serving worker:0") >= 2)
  serving_again = time.monotonic() - killed_at
  wall = run.wait()
  restarted = next(t for t, l in run.lines if "restarting it" in l) - killed_at
  results = run.results()
  baseline_wall = summary["throughput"]["async_2workers"]["wall_s"]
  summary["worker_kill"] = {"launcher_restart_s": restarted, "worker_serving_again_s": serving_again,
                            "wall_s": wall, "wall_s_without_kill": baseline_wall,
                            "steps": results["steps"], "examples_per_sec": results["examples_per_sec"]}
  print(f"killed async worker: launcher restarted it after {restarted:.1f}s, serving again after "
        f"{serving_again:.1f}s; all {results['steps']} steps done in {wall:.0f}s "
        f"(vs {baseline_wall:.0f}s without the kill)", flush=True)

  os.makedirs(os.path.dirname(FLAGS.out), exist_ok=True)
  with open(FLAGS.out, "w") as f:
    json.dump(summary, f, indent=2, sort_keys=True)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  machine.run_script(main, "benchmarks.cluster_throughput")
