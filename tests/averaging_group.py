"""One group of a parameter-averaging job, as a real process (tests/tf_codistill/training/
test_averaging_hooks.py starts several side by side over one exchange directory).

  python tests/averaging_group.py --exchange_dir=D --group=0 --out=R.json [--steps=20 ...]

Writes ``--out`` (JSON: the rounds' log, statistics, the final weights' digest) and, beside it,
``<out>.npz`` with the final trainable weights. Its data is ``group``'s own deterministic rows
(batch ``t`` of group ``g`` is rows ``[t*batch, (t+1)*batch)`` of ``rows(g)``, never shuffled), so
a test can replay one synchronous group on the same batches.
"""

import argparse
import json
import os
import sys

import numpy as np


def rows(group: int, count: int = 4096):
  """Group ``group``'s examples: 4 features, a binary label."""
  rng = np.random.default_rng(100 + group)
  x = rng.normal(size=(count, 4)).astype("float32")
  y = ((x[:, :1] + 0.5 * x[:, 1:2]) > 0).astype("float32")
  return x, y


def student(seed: int):
  import tf_keras as keras
  keras.utils.set_random_seed(seed)
  return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                           keras.layers.Dense(1)])


def _parse():
  p = argparse.ArgumentParser()
  p.add_argument("--exchange_dir", required=True)
  p.add_argument("--group", type=int, required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--num_groups", type=int, default=2)
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--every", type=int, default=5)
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--outer", default="nesterov")
  p.add_argument("--inner", default="adam")
  p.add_argument("--encoding", default="float32")
  p.add_argument("--strategy", default="one_device")
  p.add_argument("--peer_timeout_s", type=float, default=120.0)
  p.add_argument("--on_missing", default="continue")
  p.add_argument("--keep_rounds", type=int, default=20)
  p.add_argument("--poison_round", type=int, default=0, help="publish NaN at this round")
  return p.parse_args()


def main():
  args = _parse()
  from absl import logging
  logging.set_verbosity(logging.INFO)
  if args.strategy == "mirrored":
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
  import tensorflow as tf
  import tf_keras as keras

  import tf_codistill as tfc
  from tf_codistill.exchange import averaging

  if args.poison_round:
    write = averaging.write_change

    def poisoned(directory, group, round_, change, *rest, **kwargs):
      if round_ == args.poison_round:
        change = [np.full_like(c, np.nan) for c in change]
      return write(directory, group, round_, change, *rest, **kwargs)
    averaging.write_change = poisoned

  strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if args.strategy == "mirrored"
              else tf.distribute.OneDeviceStrategy("/cpu:0"))
  config = tfc.ParameterAveraging(
      every_steps=args.every, outer_optimizer=args.outer, encoding=args.encoding,
      peer_timeout_s=args.peer_timeout_s, on_missing=args.on_missing,
      keep_rounds=args.keep_rounds, poll_interval_s=0.02,
      outer_learning_rate=1.0 if args.outer == "average" else 0.7,
      outer_momentum=0.0 if args.outer == "average" else 0.9)
  x, y = rows(args.group)
  data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
  with strategy.scope():
    model = tfc.CodistillModel(student(args.group), exchange=tfc.Exchange(
        args.exchange_dir, args.group, args.num_groups, distill=False, averaging=config))
    inner = (keras.optimizers.SGD(0.1) if args.inner == "sgd"
             else keras.optimizers.Adam(0.01))
    model.compile(optimizer=inner, loss=keras.losses.BinaryCrossentropy(from_logits=True))
  model.fit(data.repeat(), steps_per_epoch=args.steps, epochs=1, verbose=0)
  hooks = model.exchange_hooks
  weights = [np.asarray(v.numpy()) for v in model.student.trainable_variables]
  from tf_codistill.optim import outer
  slots = [np.asarray(v.numpy()) for v in model.optimizer.variables[1:]]
  np.savez(args.out + ".npz", *weights)
  with open(args.out, "w") as f:
    json.dump({"log": hooks.averaging.log, "statistics": hooks.statistics(),
               "final_digest": outer.digest(weights), "slots_digest": outer.digest(slots),
               "start_round": hooks.averaging.log[0]["round"] - 1 if hooks.averaging.log else None},
              f)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  main()
