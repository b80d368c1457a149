"""Step time of codistillation with a float32 vs a bfloat16 teacher, and how far the bfloat16
teacher's predictions are from float32's (LM and image models at their gin-config sizes).

Arms run interleaved in one process (rounds of ``--steps`` train steps each, ``--rounds`` times),
all on the same real batches; the teacher holds the student's own weights. Reported per task:
steps/sec of no-teacher, float32-teacher and bfloat16-teacher steps, the ratios (median and best
round), the teacher forward pass alone in each precision, and the max/mean absolute difference of
the teacher's probabilities. The effect on final loss is the ``codistill_bf16`` arm of the ``lm``
and ``image`` suites.

  .venv/bin/python -m benchmarks.teacher_precision --data_dir=/tmp/bench/data
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Callable, Dict

import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import app
from absl import flags

from benchmarks import machine
from data_pipelines import images
from data_pipelines import text_lm
from tf_codistill import losses
from tf_codistill.model import CodistillModel, clone_architecture
from tf_codistill.models import lm
from tf_codistill.models import resnet

flags.DEFINE_string("data_dir", "/tmp/bench/data", "Where the suites' data is (prepared if not).")
flags.DEFINE_integer("vocab_size", 4000, "LM vocabulary (the lm suite's).")
flags.DEFINE_integer("steps", 20, "Steps per arm per round.")
flags.DEFINE_integer("rounds", 7, "Interleaved rounds.")
flags.DEFINE_multi_enum("task", ["lm", "image"], ["lm", "image"], "Tasks to measure.")
flags.DEFINE_string("out", "benchmarks/results/teacher_precision/summary.json", "JSON output.")
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


def _time(fn: Callable[[], None], steps: int) -> float:
  start = time.perf_counter()
  fn()
  return steps / (time.perf_counter() - start)


def measure(task: str) -> Dict[str, object]:
  make, output, data, loss = _setup(task)
  data = data.take(8).cache().repeat()  # the same real batches every step, no input cost
  sample = next(iter(data))[0]
  arms = {}
  for name, teachers, policy in (("no_teacher", 0, None), ("float32_teacher", 1, None),
                                 ("bfloat16_teacher", 1, "mixed_bfloat16")):
    student = make()
    factory = (lambda s=student, p=policy: clone_architecture(s, p))
    model = CodistillModel(student, teachers, alpha=1.0, output=output, teacher_factory=factory)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    model(sample)
    if teachers:
      model.set_teacher_weights(0, student.get_weights(), step=0)
    model.fit(data, steps_per_epoch=5, epochs=1, verbose=0)  # tracing
    arms[name] = model
  rates = {name: [] for name in arms}
  for _ in range(FLAGS.rounds):
    for name, model in arms.items():
      rates[name].append(_time(lambda: model.fit(data, steps_per_epoch=FLAGS.steps, epochs=1,
                                                 verbose=0), FLAGS.steps))
  # The teacher forward pass alone, and its predictions against float32's.
  reference = arms["float32_teacher"]
  forward = {}
  for name in ("float32_teacher", "bfloat16_teacher"):
    teacher = arms[name].teacher_slots[0][int(arms[name].active_slot.numpy()[0])]
    teacher.set_weights(reference.student.get_weights())
    run = tf.function(lambda x, t=teacher: t(x, training=False))
    run(sample)
    forward[name] = [_time(lambda: [run(sample) for _ in range(FLAGS.steps)], FLAGS.steps)
                     for _ in range(FLAGS.rounds)]
  teachers = {name: arms[name].teacher_slots[0][int(arms[name].active_slot.numpy()[0])]
              for name in ("float32_teacher", "bfloat16_teacher")}
  diffs = []
  for x, _ in data.take(4):
    p32 = losses.probabilities(teachers["float32_teacher"](x, training=False), output)
    p16 = losses.probabilities(tf.cast(teachers["bfloat16_teacher"](x, training=False),
                                       tf.float32), output)
    diffs.append(np.abs(p32.numpy() - p16.numpy()))
  diff = np.concatenate([d.reshape(-1) for d in diffs])
  median = {n: statistics.median(r) for n, r in rates.items()}
  best = {n: max(r) for n, r in rates.items()}
  return {
      "steps_per_sec": {n: {"median": median[n], "best": best[n], "all": rates[n]} for n in rates},
      "step_time_ratio_bf16_vs_fp32_teacher_median": median["float32_teacher"] / median["bfloat16_teacher"],
      "step_time_ratio_bf16_vs_fp32_teacher_best": best["float32_teacher"] / best["bfloat16_teacher"],
      "step_time_ratio_fp32_teacher_vs_none_median": median["no_teacher"] / median["float32_teacher"],
      "teacher_forward_per_sec": {n: {"median": statistics.median(r), "best": max(r)}
                                  for n, r in forward.items()},
      "teacher_forward_time_ratio_bf16_vs_fp32_median":
          statistics.median(forward["float32_teacher"]) / statistics.median(forward["bfloat16_teacher"]),
      "prob_abs_diff": {"max": float(diff.max()), "mean": float(diff.mean())},
  }


def main(argv):
  del argv
  summary = {"config": {"steps": FLAGS.steps, "rounds": FLAGS.rounds, "cpus": os.cpu_count(),
                        "load_avg_1m_at_start": os.getloadavg()[0],
                        "gpus": len(tf.config.list_physical_devices("GPU"))}}
  for task in FLAGS.task:
    summary[task] = measure(task)
    result = summary[task]
    print(f"{task}: step time bf16/fp32 teacher (median) "
          f"{result['step_time_ratio_bf16_vs_fp32_teacher_median']:.3f}, best "
          f"{result['step_time_ratio_bf16_vs_fp32_teacher_best']:.3f}; teacher forward bf16/fp32 "
          f"{result['teacher_forward_time_ratio_bf16_vs_fp32_median']:.3f}; "
          f"|p16 - p32| max {result['prob_abs_diff']['max']:.4f} "
          f"mean {result['prob_abs_diff']['mean']:.6f}")
  summary["config"]["load_avg_1m_at_end"] = os.getloadavg()[0]
  os.makedirs(os.path.dirname(FLAGS.out), exist_ok=True)
  with open(FLAGS.out, "w") as f:
    json.dump(summary, f, indent=2)


if __name__ == "__main__":
  machine.run_script(main, "benchmarks.teacher_precision")
