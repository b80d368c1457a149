"""Codistill your own (subclassed) tf_keras model on your own CSV files, in your own script.

  python examples/own_model_and_data.py --group=0 --exchange_dir=/tmp/own/exchange \
      --train_files='data/train-*.csv' --eval_files='data/eval.csv' &
  python examples/own_model_and_data.py --group=1 --exchange_dir=/tmp/own/exchange \
      --train_files='data/train-*.csv' --eval_files='data/eval.csv' &

CSV rows are `label,feature_1,...,feature_n` (a 0/1 label, float features, no header). Each group
reads its own shard of the training files, trains a small residual MLP (a subclassed model, so
teachers are built by a `tfc.TeacherSpec` factory), publishes it and distills from the other group.
"""

import tensorflow as tf
import tf_keras as keras
from absl import app
from absl import flags

import tf_codistill as tfc

flags.DEFINE_integer("group", 0, "This group's index.")
flags.DEFINE_integer("num_groups", 2, "How many groups train side by side.")
flags.DEFINE_string("exchange_dir", None, "The exchange directory all groups share.")
flags.DEFINE_string("train_files", None, "Glob of training CSV files.")
flags.DEFINE_string("eval_files", None, "Glob of validation CSV files.")
flags.DEFINE_integer("num_features", 20, "Feature columns per row.")
flags.DEFINE_integer("steps", 1000, "Training steps.")
flags.DEFINE_integer("steps_per_epoch", 100, "Steps between evaluations.")
flags.DEFINE_integer("batch_size", 128, "Batch size.")
flags.DEFINE_integer("publish_every_steps", 50, "Publish the model every this many steps.")
flags.mark_flags_as_required(["exchange_dir", "train_files", "eval_files"])
FLAGS = flags.FLAGS


class ResidualMLP(keras.Model):
  """Your own model: dense blocks with skip connections and one logit."""

  def __init__(self, width: int = 64, blocks: int = 2):
    super().__init__()
    self.inputs_projection = keras.layers.Dense(width)
    self.blocks = [keras.layers.Dense(width, activation="relu") for _ in range(blocks)]
    self.head = keras.layers.Dense(1)

  def call(self, inputs, training=None):
    h = self.inputs_projection(inputs)
    for block in self.blocks:
      h = h + block(h)
    return self.head(h)


def csv_dataset(pattern: str, shard: int, num_shards: int, train: bool) -> tf.data.Dataset:
  """(features [B, n], labels [B, 1]) from CSV files; a training set repeats, shuffled."""
  files = tf.data.Dataset.list_files(pattern, shuffle=False)
  if train:
    files = files.shard(num_shards, shard)
  rows = files.interleave(lambda path: tf.data.experimental.CsvDataset(
      path, [tf.float32] * (1 + FLAGS.num_features)))
  data = rows.map(lambda label, *x: (tf.stack(x), tf.reshape(label, [1])))
  if train:
    data = data.shuffle(10_000, seed=shard).repeat()
  return data.batch(FLAGS.batch_size).prefetch(tf.data.AUTOTUNE)


def main(argv):
  del argv
  train = csv_dataset(FLAGS.train_files, FLAGS.group, FLAGS.num_groups, train=True)
  validation = csv_dataset(FLAGS.eval_files, 0, 1, train=False)
  model = tfc.CodistillModel(
      ResidualMLP(), teachers=tfc.TeacherSpec(factory=ResidualMLP),
      distillation=tfc.Distillation(alpha=1.0, burn_in_steps=FLAGS.publish_every_steps),
      exchange=tfc.Exchange(FLAGS.exchange_dir, group=FLAGS.group, num_groups=FLAGS.num_groups,
                            publish_every_steps=FLAGS.publish_every_steps))
  model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True),
                metrics=[keras.metrics.AUC(from_logits=True, name="auc")])
  history = model.fit(train, epochs=FLAGS.steps // FLAGS.steps_per_epoch,
                      steps_per_epoch=FLAGS.steps_per_epoch, validation_data=validation,
                      verbose=2)
  last = {k: round(v[-1], 4) for k, v in history.history.items()}
  print(f"group {FLAGS.group}: {last}")


if __name__ == "__main__":
  app.run(main)
