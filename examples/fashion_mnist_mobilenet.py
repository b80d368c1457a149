"""Codistill a stock tf_keras.applications model (MobileNetV2) on Fashion-MNIST.

Start one process per group, at the same time, with the same --exchange_dir:

  python examples/fashion_mnist_mobilenet.py --group=0 --exchange_dir=/tmp/fm/exchange &
  python examples/fashion_mnist_mobilenet.py --group=1 --exchange_dir=/tmp/fm/exchange &

Each trains under MirroredStrategy (all local GPUs, or the CPU), on its own half of the
training images, publishes its model every --publish_every_steps steps, distills from the other
group's newest version, and ends with its validation accuracy, an exported SavedModel, and (if
the other group's export is there) the churn between the two groups' models. Fashion-MNIST comes
from Debian's `dataset-fashion-mnist` (`make data`).
"""

import math
import os

import tensorflow as tf
import tf_keras as keras
from absl import app
from absl import flags

import tf_codistill as tfc
from data_pipelines import images

flags.DEFINE_integer("group", 0, "This group's index (0 or 1).")
flags.DEFINE_string("exchange_dir", None, "The exchange directory both groups share.")
flags.DEFINE_string("data_dir", images.FASHION_MNIST_DIR, "Fashion-MNIST's IDX files.")
flags.DEFINE_integer("steps", 2000, "Training steps.")
flags.DEFINE_integer("batch_size", 128, "Global batch size.")
flags.DEFINE_integer("publish_every_steps", 100, "Publish the model every this many steps.")
flags.DEFINE_integer("max_examples", 0, "Use only this many training/validation images (0: all).")
flags.DEFINE_float("width", 0.35, "MobileNetV2's width multiplier (alpha).")
flags.mark_flag_as_required("exchange_dir")
FLAGS = flags.FLAGS


def load(part: str) -> tf.data.Dataset:
  """(images 32x32x3 in [0, 1], labels) of Fashion-MNIST's train or t10k part."""
  prefix = "train" if part == "train" else "t10k"
  x, y = images.read_idx(os.path.join(FLAGS.data_dir, f"{prefix}-images-idx3-ubyte.gz"),
                         os.path.join(FLAGS.data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
  if FLAGS.max_examples:
    x, y = x[:FLAGS.max_examples], y[:FLAGS.max_examples]
  data = tf.data.Dataset.from_tensor_slices((x, y.astype("int32")))
  # MobileNetV2 takes at least 32x32 RGB: pad the 28x28 grey images and repeat the channel.
  return data.map(lambda image, label: (
      tf.image.grayscale_to_rgb(tf.image.resize_with_pad(
          tf.cast(image, tf.float32)[..., None] / 255.0, 32, 32)), label))


def main(argv):
  del argv
  train = load("train").shard(2, FLAGS.group)  # each group on its own half
  train = train.cache().shuffle(10_000, seed=FLAGS.group).batch(FLAGS.batch_size).repeat()
  validation = load("t10k").batch(256).cache()
  strategy = tf.distribute.MirroredStrategy()
  with strategy.scope():
    student = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=FLAGS.width,
                                             weights=None, classes=10, classifier_activation=None)
    model = tfc.CodistillModel(
        student, output="softmax",
        distillation=tfc.Distillation(alpha=1.0, burn_in_steps=FLAGS.publish_every_steps),
        exchange=tfc.Exchange(FLAGS.exchange_dir, group=FLAGS.group, num_groups=2,
                              publish_every_steps=FLAGS.publish_every_steps))
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
  steps_per_epoch = math.gcd(FLAGS.steps, 500)  # epochs * steps_per_epoch == --steps
  model.fit(train, epochs=FLAGS.steps // steps_per_epoch, steps_per_epoch=steps_per_epoch,
            validation_data=validation, verbose=2)
  export_dir = os.path.join(os.path.dirname(FLAGS.exchange_dir.rstrip("/")),
                            f"export_{FLAGS.group}")
  tfc.export(model, export_dir)
  print(f"group {FLAGS.group}: validation accuracy "
        f"{model.evaluate(validation, verbose=0, return_dict=True)['accuracy']:.4f}, "
        f"exported to {export_dir}")
  peer = os.path.join(os.path.dirname(export_dir), f"export_{1 - FLAGS.group}")
  if os.path.exists(peer):
    peer_model = tf.saved_model.load(peer).signatures["serving_default"]
    churn = tfc.prediction_churn(model, lambda x, training: peer_model(inputs=x)["logits"],
                                 validation, output="softmax")
    print(f"group {FLAGS.group}: churn against group {1 - FLAGS.group}'s export: {churn}")


if __name__ == "__main__":
  app.run(main)
