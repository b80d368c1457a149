"""CodistillModel on two replicas (MirroredStrategy over two virtual CPUs, in a process of its
own): a step equals the same step on one device, the distillation term included, and the
losses it reports are the losses, not their per-replica shares."""

import json
import subprocess
import sys

_STEP = r"""
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tf_keras as keras
import tf_codistill as tfc

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = (x[:, :1] > 0).astype("float32")

def one_step(strategy):
  with strategy.scope():
    student = keras.Sequential([keras.Input((8,)), keras.layers.Dense(
        4, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(1)),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2))])
    model = tfc.CodistillModel(student, 1, distillation=tfc.Distillation(alpha=1.0))
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    model(tf.zeros([1, 8]))
  model.set_teacher_weights(0, [-3 * w - 1 for w in student.get_weights()], step=0)
  history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(64), epochs=1, verbose=0)
  evaluation = model.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(64), verbose=0,
                              return_dict=True)
  return ([w.tolist() for w in student.get_weights()],
          {k: float(v[0]) for k, v in history.history.items()}, evaluation)

one = one_step(tf.distribute.get_strategy())
two = one_step(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
print(json.dumps({"one": one, "two": two}))
"""


def test_two_replicas_take_the_one_device_step_and_report_the_same_losses():
  run = subprocess.run([sys.executable, "-c", _STEP], capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads(run.stdout.strip().splitlines()[-1])
  (weights_1, logs_1, eval_1), (weights_2, logs_2, eval_2) = result["one"], result["two"]
  assert logs_1["distill_loss"] > 0.1  # the teacher disagrees: the term acts
  for a, b in zip(weights_1, weights_2):
    assert max(abs(p - q) for p, q in zip(_flat(a), _flat(b))) < 1e-5
  for key in ("loss", "task_loss", "distill_loss"):
    assert abs(logs_1[key] - logs_2[key]) < 1e-5, (key, logs_1, logs_2)
  assert abs(logs_1["loss"] - logs_1["task_loss"] - logs_1["distill_loss"]) < 1e-5
  assert abs(eval_1["loss"] - eval_2["loss"]) < 1e-5, (eval_1, eval_2)


def _flat(value):
  if isinstance(value, list):
    return [x for item in value for x in _flat(item)]
  return [value]
