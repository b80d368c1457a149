"""Step time of codistillation with a float32, a bfloat16 (bfloat16 variables and compute) and a
mixed_bfloat16 (float32 variables, bfloat16 compute) teacher, and how far the reduced-precision
teachers' predictions are from float32's (LM and image models at their gin-config sizes).

Per-step times inside one ``fit`` per arm and round, arms interleaved (``benchmarks.step_times``),
all on the same real batches; the teacher holds the student's own weights. Reported per task: step
times of no-teacher, float32-teacher and bfloat16-teacher steps, their throughput ratios (median
over rounds, 90% interval), the teacher forward pass alone in each precision, and the max/mean
absolute difference between each reduced-precision teacher's probabilities and those of the
float32 student whose weights it holds. The effect on final loss is the ``codistill_bf16`` arm of
the ``lm`` and ``image`` suites.

  python -m benchmarks.run teacher_precision
  python -m benchmarks.run teacher_precision \
      --gin_bindings="bench.teacher_precision.data_dir = '/tmp/bench/data'"
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import gin
import numpy as np
import tensorflow as tf
import tf_keras as keras

import tf_codistill as tfc
from benchmarks import registry
from benchmarks import step_times
from data_pipelines import images
from data_pipelines import text_lm
from tf_codistill import losses
from tf_codistill.models import lm
from tf_codistill.models import resnet

TASKS = ("lm", "image")
REDUCED = ("bfloat16_teacher", "mixed_bfloat16_teacher")  # the teachers compared with float32


def _setup(task: str, data_dir: str, vocab_size: int):
  """(model factory, training data) at the lm/image suites' sizes (both softmax outputs)."""
  if task == "lm":
    train, _, _ = text_lm.prepare(os.path.join(data_dir, "kjv"), vocab_size=vocab_size)
    return (lambda: lm.lstm_lm(vocab_size, 64, (128,)),
            text_lm.make_dataset(train, 32, vocab_size=vocab_size, sequence_length=32,
                                 repeat=True))
  train, _ = images.convert_fashion_mnist(os.path.join(data_dir, "fashion_mnist"))
  return lambda: resnet.resnet(10, widths=(8, 16, 32)), images.make_dataset(train, 64, repeat=True)


def _forward_times(run: Callable[[], object], steps: int) -> List[float]:
  """Times of ``steps`` calls of ``run`` (a teacher's forward pass alone), after one untimed."""
  run()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return times


def _arms(task: str, data_dir: str, vocab_size: int):
  """The no-teacher, float32-teacher and bfloat16-teacher models of ``task`` (teachers hold the
  student's weights), the batches they train on and the task's output."""
  make, data = _setup(task, data_dir, vocab_size)
  output, loss = "softmax", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  data = data.take(8).cache().repeat()  # the same real batches every step, no input cost
  sample = next(iter(data))[0]
  arms = {}
  for name, teachers, policy in (("no_teacher", 0, None), ("float32_teacher", 1, None),
                                 ("bfloat16_teacher", 1, "bfloat16"),
                                 ("mixed_bfloat16_teacher", 1, "mixed_bfloat16")):
    student = make()
    factory = (lambda s=student, p=policy: tfc.clone_architecture(s, p))
    model = tfc.CodistillModel(student, teachers, output=output,
                               teachers=tfc.TeacherSpec(factory=factory))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    model(sample)
    if teachers:
      model.set_teacher_weights(0, student.get_weights(), step=0)
    arms[name] = model
  return arms, data, sample, output


def measure(task: str, data_dir: str, vocab_size: int, steps: int, rounds: int
            ) -> Dict[str, object]:
  """Per-step times of the three arms (interleaved, inside one fit per round), the teachers'
  forward passes alone, and how far bfloat16's probabilities are from float32's."""
  arms, data, sample, output = _arms(task, data_dir, vocab_size)
  teachers = {name: arms[name].active_teacher(0) for name in ("float32_teacher",) + REDUCED}
  probabilities = lambda model, x: losses.probabilities(
      tf.cast(model(x, training=False), tf.float32), output).numpy()
  # Before any training step, while each student still holds the weights its teacher was given.
  diffs = {name: np.concatenate([np.abs(probabilities(teachers[name], x) - probabilities(
      arms[name].student, x)).reshape(-1) for x, _ in data.take(4)]) for name in REDUCED}
  times = step_times.interleave(
      {name: (lambda m=model: step_times.fit_step_times(m, data, steps))
       for name, model in arms.items()}, rounds)
  runs = {name: tf.function(lambda x, t=teacher: t(x, training=False))
          for name, teacher in teachers.items()}
  forward = step_times.interleave(
      {name: (lambda r=run: _forward_times(lambda: r(sample), steps))
       for name, run in runs.items()}, rounds)
  ratio = lambda arm, base, t=times: step_times.throughput_ratio(t, arm, base)
  return {
      "step_times": step_times.describe(times),
      "throughput_ratio_fp32_teacher_vs_none": ratio("float32_teacher", "no_teacher"),
      **{f"throughput_ratio_{name}_vs_none": ratio(name, "no_teacher") for name in REDUCED},
      **{f"throughput_ratio_{name}_vs_fp32_teacher": ratio(name, "float32_teacher")
         for name in REDUCED},
      "teacher_forward": step_times.describe(forward),
      **{f"teacher_forward_speed_ratio_{name}_vs_fp32": ratio(name, "float32_teacher", forward)
         for name in REDUCED},
      "prob_abs_diff": {name: {"max": float(d.max()), "mean": float(d.mean())}
                        for name, d in diffs.items()},
  }


@gin.configurable("teacher_precision", module="bench", denylist=["ctx"])
def measure_precision(ctx: registry.Context, data_dir: Optional[str] = None,
                      vocab_size: int = 4000, steps: int = 20, rounds: int = 7,
                      task: Sequence[str] = TASKS) -> dict:
  """Every task's step times, throughput ratios, teacher forward passes and probability gaps.

  Args:
    ctx: the run's context.
    data_dir: where the suites' data is (prepared if not); None: the suites' own, ``data/``
      beside this benchmark's work_dir (``--work_dir``/data, as ``benchmarks.run`` gives the
      suites).
    vocab_size: LM vocabulary (the lm suite's).
    steps: steps per arm per round.
    rounds: interleaved rounds.
    task: tasks to measure (``lm``, ``image``).
  """
  registry.check_choices("bench.teacher_precision.task", task, TASKS)
  # The suites' data root is <work root>/data; this benchmark's work_dir is <work root>/<name>.
  data_dir = data_dir or os.path.join(os.path.dirname(ctx.work_dir), "data")
  summary = {"config": {"steps": steps, "rounds": rounds, "cpus": os.cpu_count(),
                        "load_avg_1m_at_start": os.getloadavg()[0],
                        "gpus": len(tf.config.list_physical_devices("GPU"))}}
  for name in task:
    summary[name] = measure(name, data_dir, vocab_size, steps, rounds)
    ctx.progress("\n".join(_tables({name: summary[name]})))
  summary["config"]["load_avg_1m_at_end"] = os.getloadavg()[0]
  return summary


def _ratio(result: dict, key: str) -> str:
  """A throughput ratio's median and 90% interval."""
  low, high = result[key]["interval90"]
  return f"{result[key]['median']:.3f} [{low:.3f}, {high:.3f}]"


def _tables(summary: dict) -> List[str]:
  """Per task: the arms' step times, the teachers' forward passes, the ratios (median, 90%
  interval) and the probability gaps, as Markdown."""
  lines = []
  for task in (t for t in TASKS if t in summary):
    result = summary[task]
    lines += [f"## {task}", "", "| arm | median ms | p90 ms | steps/s |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {row['median_ms']:.2f} | {row['p90_ms']:.2f} | "
              f"{row['steps_per_sec']:.1f} |" for name, row in result["step_times"].items()]
    keys = (["throughput_ratio_fp32_teacher_vs_none"]
            + [f"throughput_ratio_{name}_vs_none" for name in REDUCED]
            + [f"throughput_ratio_{name}_vs_fp32_teacher" for name in REDUCED]
            + [f"teacher_forward_speed_ratio_{name}_vs_fp32" for name in REDUCED])
    lines += ["", "| teacher forward alone | median ms |", "| --- | --- |"]
    lines += [f"| {name} | {row['median_ms']:.2f} |"
              for name, row in result["teacher_forward"].items()]
    lines += ["", "| ratio | median [90% interval] |", "| --- | --- |"]
    lines += [f"| {key} | {_ratio(result, key)} |" for key in keys if key in result]
    lines += ["", "| teacher | max abs(p - p32) | mean abs(p - p32) |", "| --- | --- | --- |"]
    lines += [f"| {name} | {diff['max']:.4f} | {diff['mean']:.6f} |"
              for name, diff in result["prob_abs_diff"].items()]
    lines.append("")
  return lines


BENCHMARK = registry.Benchmark(
    "teacher_precision", measure_precision, tables=_tables,
    title="Teacher precision: codistillation step time with float32, bfloat16 and "
          "mixed_bfloat16 teachers")
