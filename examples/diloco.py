"""DiLoCo (or local SGD) between groups of your own tf_keras model, in your own script.

  python examples/diloco.py --group=0 --exchange_dir=/tmp/diloco/exchange &
  python examples/diloco.py --group=1 --exchange_dir=/tmp/diloco/exchange &

Each group trains on its own half of a synthetic classification task with Adam; every
``--every_steps`` steps the groups average their parameter changes and take DiLoCo's outer
Nesterov step (``--outer=average``: local SGD), so all groups hold the same parameters after every
round.
Start every group at the same time: a round waits for its peers (``--peer_timeout_s``). Add
``--distill`` to codistill between rounds as well.
"""

import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import app
from absl import flags

import tf_codistill as tfc
from tf_codistill.optim import outer

flags.DEFINE_integer("group", 0, "This group's index.")
flags.DEFINE_integer("num_groups", 2, "How many groups train side by side.")
flags.DEFINE_string("exchange_dir", None, "The exchange directory all groups share.")
flags.DEFINE_integer("steps", 400, "Training steps of each group.")
flags.DEFINE_integer("every_steps", 50, "H: steps between two averaging rounds.")
flags.DEFINE_enum("outer", "nesterov", ["nesterov", "average"], "DiLoCo, or local SGD.")
flags.DEFINE_enum("encoding", "float32", ["float32", "bfloat16", "int8"],
                  "How the parameter changes are sent.")
flags.DEFINE_float("peer_timeout_s", 600.0, "How long a round waits for a peer.")
flags.DEFINE_bool("distill", False, "Also distill from the peers' published models.")
flags.mark_flags_as_required(["exchange_dir"])
FLAGS = flags.FLAGS


def group_data(group: int, num_groups: int) -> tf.data.Dataset:
  """This group's half of y = [sum of the first 4 features + noise > 0] (disjoint rows)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(8192, 16)).astype("float32")
  noisy = x[:, :4].sum(axis=1, keepdims=True) + 0.5 * rng.normal(size=(8192, 1))
  y = (noisy > 0).astype("float32")
  return (tf.data.Dataset.from_tensor_slices((x, y)).shard(num_groups, group)
          .shuffle(4096, seed=group).batch(64).repeat())


def main(argv):
  del argv
  averaging = (tfc.ParameterAveraging.diloco(FLAGS.every_steps, encoding=FLAGS.encoding,
                                             peer_timeout_s=FLAGS.peer_timeout_s)
               if FLAGS.outer == "nesterov" else
               tfc.ParameterAveraging.local_sgd(FLAGS.every_steps, encoding=FLAGS.encoding,
                                                peer_timeout_s=FLAGS.peer_timeout_s))
  student = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1)])
  model = tfc.CodistillModel(
      student, output="sigmoid", distillation=tfc.Distillation(alpha=0.5),
      exchange=tfc.Exchange(FLAGS.exchange_dir, group=FLAGS.group, num_groups=FLAGS.num_groups,
                            distill=FLAGS.distill, averaging=averaging))
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  model.fit(group_data(FLAGS.group, FLAGS.num_groups), epochs=FLAGS.steps // 100,
            steps_per_epoch=100, verbose=2)
  stats = model.exchange_hooks.statistics()["averaging_rounds"]
  final = outer.digest([v.numpy() for v in student.trainable_variables])
  print(f"group {FLAGS.group}: rounds {stats['rounds']}, bytes sent {stats['bytes_sent']}, "
        f"final parameters {final}")


if __name__ == "__main__":
  app.run(main)
