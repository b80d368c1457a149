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

  .venv/bin/python -m benchmarks.teacher_precision --data_dir=/tmp/bench/data
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, List

import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import flags

from benchmarks import machine
from benchmarks import standalone
from benchmarks import step_times
from data_pipelines import images
from data_pipelines import text_lm
from tf_codistill import losses
from tf_codistill.models import lm
from tf_codistill.models import resnet
from tf_codistill.training.model import CodistillModel
from tf_codistill.training.model import clone_architecture

flags.DEFINE_string("data_dir", "/tmp/bench/data", "Where the suites' data is (prepared if not).")
flags.DEFINE_integer("vocab_size", 4000, "LM vocabulary (the lm suite's).")
flags.DEFINE_integer("steps", 20, "Steps per arm per round.")
flags.DEFINE_integer("rounds", 7, "Interleaved rounds.")
flags.DEFINE_multi_enum("task", ["lm", "image"], ["lm", "image"], "Tasks to measure.")
standalone.define_flags("teacher_precision", work_dir=False)
FLAGS = flags.FLAGS


def _setup(task: str):
  """(model factory, output, training data, loss) at the lm/image suites' sizes."""
  if task == "lm":
    directory = os.path.join(FLAGS.data_dir, "kjv")
    train, _, _ = text_lm.prepare(directory, vocab_size=FLAGS.vocab_size)
    data = text_lm.make_dataset(train, 32, vocab_size=FLAGS.vocab_size, sequence_length=32,
                                repeat=True)
    make = lambda: lm.lstm_lm(FLAGS.vocab_size, 64, (128,))
    return make, "softmax", data, keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  train, _ = images.convert_fashion_mnist(os.path.join(FLAGS.data_dir, "fashion_mnist"))
  data = images.make_dataset(train, 64, repeat=True)
  make = lambda: resnet.resnet(10, widths=(8, 16, 32))
  return make, "softmax", data, keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _forward_times(run: Callable[[], object], steps: int) -> List[float]:
  """Times of ``steps`` calls of ``run`` (a teacher's forward pass alone), after one untimed."""
  run()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return times


def _arms(task: str):
  """The no-teacher, float32-teacher and bfloat16-teacher models of ``task`` (teachers hold the
  student's weights), the batches they train on and the task's output."""
  make, output, data, loss = _setup(task)
  data = data.take(8).cache().repeat()  # the same real batches every step, no input cost
  sample = next(iter(data))[0]
  arms = {}
  for name, teachers, policy in (("no_teacher", 0, None), ("float32_teacher", 1, None),
                                 ("bfloat16_teacher", 1, "bfloat16"),
                                 ("mixed_bfloat16_teacher", 1, "mixed_bfloat16")):
    student = make()
    factory = (lambda s=student, p=policy: clone_architecture(s, p))
    model = CodistillModel(student, teachers, alpha=1.0, output=output, teacher_factory=factory)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    model(sample)
    if teachers:
      model.set_teacher_weights(0, student.get_weights(), step=0)
    arms[name] = model
  return arms, data, sample, output


def measure(task: str) -> Dict[str, object]:
  """Per-step times of the three arms (interleaved, inside one fit per round), the teachers'
  forward passes alone, and how far bfloat16's probabilities are from float32's."""
  arms, data, sample, output = _arms(task)
  reduced = ("bfloat16_teacher", "mixed_bfloat16_teacher")
  teachers = {name: arms[name].active_teacher(0)
              for name in ("float32_teacher",) + reduced}
  probabilities = lambda model, x: losses.probabilities(
      tf.cast(model(x, training=False), tf.float32), output).numpy()
  # Before any training step, while each student still holds the weights its teacher was given.
  diffs = {name: np.concatenate([np.abs(probabilities(teachers[name], x) - probabilities(
      arms[name].student, x)).reshape(-1) for x, _ in data.take(4)]) for name in reduced}
  times = step_times.interleave(
      {name: (lambda m=model: step_times.fit_step_times(m, data, FLAGS.steps))
       for name, model in arms.items()}, FLAGS.rounds)
  runs = {name: tf.function(lambda x, t=teacher: t(x, training=False))
          for name, teacher in teachers.items()}
  forward = step_times.interleave(
      {name: (lambda r=run: _forward_times(lambda: r(sample), FLAGS.steps))
       for name, run in runs.items()}, FLAGS.rounds)
  ratio = lambda arm, base, t=times: step_times.throughput_ratio(t, arm, base)
  return {
      "step_times": step_times.describe(times),
      "throughput_ratio_fp32_teacher_vs_none": ratio("float32_teacher", "no_teacher"),
      **{f"throughput_ratio_{name}_vs_none": ratio(name, "no_teacher") for name in reduced},
      **{f"throughput_ratio_{name}_vs_fp32_teacher": ratio(name, "float32_teacher")
         for name in reduced},
      "teacher_forward": step_times.describe(forward),
      **{f"teacher_forward_speed_ratio_{name}_vs_fp32": ratio(name, "float32_teacher", forward)
         for name in reduced},
      "prob_abs_diff": {name: {"max": float(d.max()), "mean": float(d.mean())}
                        for name, d in diffs.items()},
  }


def main(argv):
  del argv
  summary = {"config": {"steps": FLAGS.steps, "rounds": FLAGS.rounds, "cpus": os.cpu_count(),
                        "load_avg_1m_at_start": os.getloadavg()[0],
                        "gpus": len(tf.config.list_physical_devices("GPU"))}}
  for task in FLAGS.task:
    summary[task] = result = measure(task)
    ratio = lambda key: (f"{result[key]['median']:.3f} [{result[key]['interval90'][0]:.3f}, "
                         f"{result[key]['interval90'][1]:.3f}]")
    print(f"{task}: throughput fp32 teacher/none {ratio('throughput_ratio_fp32_teacher_vs_none')}")
    for name in ("bfloat16_teacher", "mixed_bfloat16_teacher"):
      diff = result["prob_abs_diff"][name]
      print(f"  {name}: throughput vs fp32 teacher "
            f"{ratio(f'throughput_ratio_{name}_vs_fp32_teacher')}, vs none "
            f"{ratio(f'throughput_ratio_{name}_vs_none')}, teacher forward speed vs fp32 "
            f"{ratio(f'teacher_forward_speed_ratio_{name}_vs_fp32')}; |p - p32| max "
            f"{diff['max']:.4f} mean {diff['mean']:.6f}")
  summary["config"]["load_avg_1m_at_end"] = os.getloadavg()[0]
  machine.write_json(FLAGS.out, summary)


if __name__ == "__main__":
  machine.run_script(main, "benchmarks.teacher_precision")
