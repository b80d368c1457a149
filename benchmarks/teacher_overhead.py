"""Step time of the CTR model: plain tf_keras vs CodistillModel without a teacher, with a loaded
float32 teacher, a bfloat16 one (TeacherSpec(precision='bfloat16'): bfloat16 variables and compute),
a mixed_bfloat16 one (float32 variables, bfloat16 compute) and an int8 one (TeacherSpec(precision=
'int8'): weight-only int8 embeddings and dense kernels, quantization.py), all clones of the
student; and the CTR model's own teacher form (``models.ctr_teacher``: its 26 tables stacked into
one, looked up with one gather) in float32, bfloat16 and int8. The goals read the stacked form
(GOAL_RATIOS), as declared before the first run that had it in that precision.

Per-step times with the arms alternating step by step, each step a call of the arm's own train
function (``step_times.alternate_steps``), in several fresh processes one after another (each
builds every arm anew: two runs in one process each can disagree by more than either's interval);
ratios are formed within each round and reported as their median over the pooled rounds, with a
90% interval that resamples processes, then rounds, and each process's own median. Each
teacher's forward pass is also timed alone (an in-graph loop on one batch, whose rows stay in
cache: a lower bound), where noise is small, so what a precision saves in compute can be told
from what the step shows. A second, identical no-teacher model is timed as an arm of its own: its
ratio to the first (``no_teacher_again_vs_no_teacher``) is the noise floor the other ratios must
clear. Two arms take the float32 teacher apart: its embedding lookups alone (``lookups_only``),
and the whole teacher with 8-row tables whose rows are always in cache (``cached_tables``: the
teacher's cost when no looked-up row has to come from memory). Also measured: the pause the
training thread sees when a refreshed teacher is swapped in, against assigning its values in
place.

  python -m benchmarks.run teacher_overhead
  python -m benchmarks.run teacher_overhead --results_dir=/tmp/adagrad \
      --gin_bindings="bench.teacher_overhead.optimizer = 'adagrad'"
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from concurrent import futures
from typing import Callable, Dict, List, Optional, Sequence

import gin
import tensorflow as tf
import tf_keras as keras

import tf_codistill as tfc
from benchmarks import models
from benchmarks import registry
from benchmarks import step_times
from benchmarks import verdicts
from tf_codistill.models import ctr
from tf_codistill.teachers import quantization


def _dataset(batch_size: int, num_buckets: int) -> tf.data.Dataset:
  return models.ctr_examples(batch_size, num_buckets).batch(batch_size).repeat()


def _compile(model: keras.Model, optimizer: str) -> keras.Model:
  make_optimizer = {"adam": keras.optimizers.Adam, "adagrad": keras.optimizers.Adagrad}[optimizer]
  model.compile(optimizer=make_optimizer(1e-3),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


GOALS = {"teacher_throughput_ratio": (">=", 0.95),
         "teacher_throughput_ratio_bfloat16": (">=", 0.97),
         "teacher_throughput_ratio_int8": (">=", 0.97)}
# The ratio each goal reads (recorded in the summary): the CTR model's stacked teacher form, in
# each precision.
GOAL_RATIOS = {"teacher_throughput_ratio": "stacked_teacher_vs_no_teacher",
               "teacher_throughput_ratio_bfloat16": "stacked_bfloat16_teacher_vs_no_teacher",
               "teacher_throughput_ratio_int8": "stacked_int8_teacher_vs_no_teacher"}


# Arms with one loaded teacher -> how its copy is made from the student: a clone (in the
# student's float32 or a dtype policy), int8 (quantization.py) or the stacked CTR form
# (models.ctr_teacher).
TEACHER_ARMS: Dict[str, Callable[[keras.Model], keras.Model]] = {
    "codistill_one_teacher": tfc.clone_architecture,
    "codistill_bfloat16_teacher": lambda s: tfc.clone_architecture(s, "bfloat16"),
    "codistill_mixed_bfloat16_teacher": lambda s: tfc.clone_architecture(s, "mixed_bfloat16"),
    "codistill_int8_teacher": quantization.int8_copy,
    "codistill_stacked_teacher": ctr.ctr_teacher,
    "codistill_stacked_bfloat16_teacher": lambda s: ctr.ctr_teacher(s, dtype_policy="bfloat16"),
    "codistill_stacked_int8_teacher": lambda s: ctr.ctr_teacher(s, dtype_policy="int8")}


def _cached_tables(embedding_dim: int, rows: int = 8) -> keras.Model:
  """The CTR teacher with ``rows``-row tables (ids taken modulo ``rows``): the same ops, with
  every looked-up row in cache."""
  inner = ctr.ctr_model(num_buckets=rows, embedding_dim=embedding_dim)
  inputs = {"dense": keras.Input((13,), dtype=tf.float32, name="dense"),
            "categorical": keras.Input((26,), dtype=tf.int64, name="categorical")}
  ids = keras.layers.Lambda(lambda t: t % rows, name="modulo_rows")(inputs["categorical"])
  return keras.Model(inputs, inner({"dense": inputs["dense"], "categorical": ids}))


# Arms whose teacher is a part of the CTR teacher (what its cost is made of) -> its factory:
# its embedding lookups and concat, then one logit (no hidden layers); its ops on tables whose
# rows are always in cache.
PART_ARMS = {"codistill_lookups_only_teacher": lambda num_buckets, dim: ctr.ctr_model(
                 num_buckets=num_buckets, embedding_dim=dim, hidden_units=()),
             "codistill_cached_tables_teacher": lambda num_buckets, dim: _cached_tables(dim)}


def build_arms(batch_size: int, num_buckets: int, embedding_dim: int,
               optimizer: str = "adam", only: Optional[Sequence[str]] = None
               ) -> Dict[str, keras.Model]:
  """The compiled, built models of every arm (or of the arms ``only`` names); the teachers hold
  the student's weights."""
  make = lambda: ctr.ctr_model(num_buckets=num_buckets, embedding_dim=embedding_dim)
  sample = next(iter(_dataset(batch_size, num_buckets)))[0]
  baselines = {"plain_keras": make,
               "codistill_no_teacher": lambda: tfc.CodistillModel(make(), 0),
               # An identical second instance: its ratio to the first is the noise floor.
               "codistill_no_teacher_again": lambda: tfc.CodistillModel(make(), 0)}
  known = {*baselines, *TEACHER_ARMS, *PART_ARMS}
  if only is not None and set(only) - known:
    raise ValueError(f"unknown arms {sorted(set(only) - known)}; known: {sorted(known)}")
  wanted = lambda name: only is None or name in only
  arms = {name: _compile(build(), optimizer) for name, build in baselines.items() if wanted(name)}
  # Teacher arm -> its teacher from the student: a copy of it, or a part of the CTR teacher.
  teachers = {**TEACHER_ARMS, **{name: (lambda _, f=factory: f(num_buckets, embedding_dim))
                                 for name, factory in PART_ARMS.items()}}
  for name, teacher in teachers.items():
    if wanted(name):
      student = make()
      arms[name] = _compile(tfc.CodistillModel(student, 1, teachers=tfc.TeacherSpec(
          factory=lambda s=student, t=teacher: t(s))), optimizer)
  for model in arms.values():
    model(sample)
  for name in filter(wanted, TEACHER_ARMS):
    arms[name].set_teacher_weights(0, arms[name].student.get_weights(), step=0)
  for name in filter(wanted, PART_ARMS):
    arms[name].activate_teacher(0, step=0)  # its own initial weights: finite, that is enough
  return arms


# Ratio name -> (arm, baseline): steps/s of the arm over the baseline's. Every teacher arm
# ``codistill_<t>`` has ``<t>_vs_no_teacher`` (e.g. ``stacked_int8_teacher_vs_no_teacher``).
RATIOS = {
    "no_teacher_vs_plain": ("codistill_no_teacher", "plain_keras"),
    "no_teacher_again_vs_no_teacher": ("codistill_no_teacher_again", "codistill_no_teacher"),
    **{f"{arm[len('codistill_'):]}_vs_no_teacher": (arm, "codistill_no_teacher")
       for arm in (*TEACHER_ARMS, *PART_ARMS)},
    "bfloat16_teacher_vs_float32_teacher": ("codistill_bfloat16_teacher", "codistill_one_teacher"),
    "int8_teacher_vs_float32_teacher": ("codistill_int8_teacher", "codistill_one_teacher"),
    "stacked_int8_teacher_vs_stacked_bfloat16_teacher": ("codistill_stacked_int8_teacher",
                                                         "codistill_stacked_bfloat16_teacher"),
}


def summarize(times: step_times.Times, clusters: Optional[List[int]] = None) -> dict:
  """Step-time statistics of every arm and the ratios the goals are about (those whose arms
  were run; with ``clusters``, the process of each round: intervals that cover the spread
  between processes)."""
  return {"step_times": step_times.describe(times),
          "ratios": {name: step_times.throughput_ratio(times, arm, baseline, clusters=clusters)
                     for name, (arm, baseline) in RATIOS.items()
                     if arm in times and baseline in times}}


def measure(arms: Dict[str, keras.Model], data: tf.data.Dataset, steps: int, rounds: int,
            seed: int = 0) -> dict:
  """Interleaved per-step times of every arm (in this process), and the ratios."""
  return summarize(step_times.alternate_steps(arms, data, steps, rounds, seed=seed))


def one_process(settings: dict, seed: int) -> dict:
  """One process's share of a run: every arm (or ``settings['arms']``) built anew,
  ``settings['rounds']`` rounds of alternated steps (arm order drawn with ``seed``), the
  teachers' forward passes alone and a refresh's pause. Run in a process of its own
  (``run_processes``)."""
  arms = build_arms(settings["batch_size"], settings["num_buckets"], settings["embedding_dim"],
                    settings["optimizer"], only=settings.get("arms"))
  data = _dataset(settings["batch_size"], settings["num_buckets"])
  times = step_times.alternate_steps(arms, data, settings["steps"], settings["rounds"], seed=seed)
  run = {"times": times, "teacher_forward_ms": forward_times(arms, data), "pid": os.getpid()}
  if "codistill_one_teacher" in arms:
    run.update(swap_pause(arms["codistill_one_teacher"]))
  return run


def run_processes(settings: dict, processes: int) -> dict:
  """``one_process`` in ``processes`` fresh processes, one after another, pooled: the rounds'
  ratios with intervals that resample processes (``step_times.pool_processes``), each
  process's median, and the medians over processes of the forward times and pauses."""
  context = multiprocessing.get_context("spawn")  # a fresh TF runtime and heap per process
  runs = []
  for seed in range(processes):
    # A worker that dies raises BrokenProcessPool; leaving the block joins the worker, so its
    # CPU time counts as the benchmark's own (machine.Session).
    with futures.ProcessPoolExecutor(1, mp_context=context) as pool:
      runs.append(pool.submit(one_process, settings, seed).result())
  times, clusters = step_times.pool_processes([run["times"] for run in runs])
  summary = summarize(times, clusters)
  summary["teacher_forward_ms"] = {
      name: statistics.median(run["teacher_forward_ms"][name] for run in runs)
      for name in runs[0]["teacher_forward_ms"]}
  for key in ("swap_flip_ms_median", "in_place_assign_ms_median"):
    if key in runs[0]:
      summary[key] = statistics.median(run[key] for run in runs)
  summary["process_ids"] = [run["pid"] for run in runs]
  return summary


def _forward_loop(teacher: keras.Model, x) -> Callable[[tf.Tensor], tf.Tensor]:
  """A function that runs ``teacher`` on ``x`` n times in one graph (no step around it)."""
  @tf.function
  def loop(n):
    total = tf.zeros([])
    for _ in tf.range(n):
      total += tf.reduce_sum(tf.cast(teacher(x, training=False), tf.float32))
    return total
  return loop


def forward_times(arms: Dict[str, keras.Model], data: tf.data.Dataset, calls: int = 100,
                  repeats: int = 7) -> Dict[str, float]:
  """Median ms of one forward pass of each arm's active teacher alone, on one batch: what a
  precision saves in compute, free of the step's noise (repeats interleaved across arms)."""
  x = next(iter(data))[0]
  loops = {}
  for name in [name for name in TEACHER_ARMS if name in arms]:
    loops[name] = _forward_loop(arms[name].active_teacher(0), x)
    loops[name](tf.constant(2))
  times = {name: [] for name in loops}
  for _ in range(repeats):
    for name, loop in loops.items():
      start = time.perf_counter()
      loop(tf.constant(calls)).numpy()
      times[name].append(1e3 * (time.perf_counter() - start) / calls)
  return {name: statistics.median(values) for name, values in times.items()}


def swap_pause(model: tfc.CodistillModel, repeats: int = 10) -> Dict[str, float]:
  """The training thread's part of a refresh, flipping the double buffer (the restore itself runs
  in the teacher pool's thread), against assigning the values in place as a single buffer would."""
  weights = model.student.get_weights()
  flips, assigns = [], []
  for _ in range(repeats):
    start = time.perf_counter()
    model.activate_teacher(0, step=1)
    flips.append(time.perf_counter() - start)
    start = time.perf_counter()
    for var, value in zip(model.inactive_teacher(0).weights, weights):
      var.assign(value)
    assigns.append(time.perf_counter() - start)
  return {"swap_flip_ms_median": 1e3 * statistics.median(flips),
          "in_place_assign_ms_median": 1e3 * statistics.median(assigns)}


OPTIMIZERS = ("adam", "adagrad")


@gin.configurable("teacher_overhead", module="bench", denylist=["ctx"])
def measure_overhead(ctx: registry.Context, batch_size: int = 512, num_buckets: int = 20_000,
                     embedding_dim: int = 16, steps: int = 80, rounds: int = 5,
                     processes: int = 3, optimizer: str = "adam") -> dict:
  """The arms' step times and throughput ratios, pooled over ``processes`` fresh processes.

  Args:
    ctx: the run's context.
    batch_size: examples per step.
    num_buckets: hash buckets per categorical feature.
    embedding_dim: embedding width.
    steps: timed steps per arm per round (arms alternate step by step).
    rounds: rounds per process (arm order drawn anew each round).
    processes: fresh processes run one after another, each with every arm built anew; their
      rounds are pooled, with intervals over processes.
    optimizer: adam updates whole embedding tables every step (dense slots); adagrad only the
      looked-up rows, so the forward passes weigh more in its step time.
  """
  if optimizer not in OPTIMIZERS:
    raise ValueError(f"bench.teacher_overhead.optimizer={optimizer!r}: one of {OPTIMIZERS}")
  settings = {"optimizer": optimizer, "batch_size": batch_size, "num_buckets": num_buckets,
              "embedding_dim": embedding_dim, "steps": steps, "rounds": rounds}
  summary = run_processes(settings, processes)
  summary["config"] = {**settings, "processes": processes, "cpus": os.cpu_count(),
                       "harness": "arms alternating step by step (step_times.alternate_steps) "
                                  "in fresh processes, rounds pooled (step_times.pool_processes)"}
  values = {goal: summary["ratios"][ratio] for goal, ratio in GOAL_RATIOS.items()}
  summary["goals"] = {name: v["median"] for name, v in values.items()}
  summary["goal_ratios"] = GOAL_RATIOS
  met = verdicts.judge(summary["goals"], GOALS)
  summary["goal_verdicts"] = {name: {**met[name], "interval90": v["interval90"],
                                     "process_medians": v["process_medians"]}
                              for name, v in values.items()}
  ctx.progress("\n".join(_tables(summary)))
  return summary


def _tables(summary: dict) -> List[str]:
  """The step times, ratios, forward times and swap pause, as Markdown."""
  lines = ["| arm | median ms | p90 ms | steps/s |", "| --- | --- | --- | --- |"]
  lines += [f"| {name} | {row['median_ms']:.2f} | {row['p90_ms']:.2f} | "
            f"{row['steps_per_sec']:.1f} |" for name, row in summary["step_times"].items()]
  lines += ["", "| throughput ratio | median | 90% interval | per process |",
            "| --- | --- | --- | --- |"]
  for name, ratio in summary["ratios"].items():
    low, high = ratio["interval90"]
    by_process = ", ".join(f"{m:.3f}" for m in ratio["process_medians"])
    floor = " (two identical models: the noise floor)" if name.startswith("no_teacher_again") \
        else ""
    lines.append(f"| {name}{floor} | {ratio['median']:.3f} | [{low:.3f}, {high:.3f}] | "
                 f"{by_process} |")
  forward = summary["teacher_forward_ms"]
  lines += ["", "| teacher forward alone | ms | speed vs float32 |", "| --- | --- | --- |"]
  lines += [f"| {name} | {ms:.3f} | x{forward['codistill_one_teacher'] / ms:.2f} |"
            for name, ms in forward.items()]
  if "swap_flip_ms_median" in summary:
    lines += ["", f"Training-thread pause of a refresh: flip {summary['swap_flip_ms_median']:.2f} "
              f"ms (an in-place assign would be {summary['in_place_assign_ms_median']:.1f} ms)."]
  return lines


BENCHMARK = registry.Benchmark(
    "teacher_overhead", measure_overhead, tables=_tables,
    title="Teacher overhead: CTR step time with and without teachers")
