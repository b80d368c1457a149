"""Image classification data: ImageNet-style TFRecords decoded and augmented with tf.data, and a
converter that writes such TFRecords from the real Fashion-MNIST data Debian packages.

Record format (as in the ImageNet TFRecords of the TF models repository): a ``tf.train.Example``
with ``image/encoded`` (JPEG or PNG bytes), ``image/class/label`` (int64), and informative
``image/format``, ``image/height``, ``image/width``, ``image/channels``.

``make_dataset`` gives ``({'image': float32 [B, H, W, C] in [0, 1]}, int32 [B])`` for
``models.resnet``: images decoded (JPEG or PNG), resized to ``image_size`` when they differ, and,
for training (``augment``, default ``repeat``), randomly flipped left-right and randomly cropped
back to size after padding by ``pad`` pixels. Shards are disjoint: by file when there are at least
``num_shards`` files, else by record within every file. Records whose image bytes are not a
complete PNG or JPEG or whose label is out of range, and empty files, fail naming the file (and
record) or are skipped and counted (``bad_lines``).

``convert_fashion_mnist`` (``python -m data_pipelines.images --output_dir=data/fashion_mnist``)
reads the IDX files of Debian's ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``)
and writes ``train-0000k-of-0000N.tfrecord`` (60,000 images, in order) and
``eval-00000-of-00001.tfrecord`` (the 10,000 test images) with PNG bytes and labels 0..9.
"""

from __future__ import annotations

import functools
import gzip
import os
from typing import Dict, List, Optional, Sequence, Tuple

import gin
import numpy as np
import tensorflow as tf
from absl import app
from absl import flags
from absl import logging

from data_pipelines import records

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")
_PARTS = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 60_000),
          "eval": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 10_000)}
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049


def read_idx(images_path: str, labels_path: str) -> Tuple[np.ndarray, np.ndarray]:
  """(uint8 [N, rows, cols], uint8 [N]) from gzipped IDX files (the MNIST format), checked."""
  with gzip.open(images_path, "rb") as f:
    data = f.read()
  magic, count, rows, cols = np.frombuffer(data[:16], ">i4")
  if magic != _IMAGES_MAGIC or len(data) != 16 + count * rows * cols:
    raise ValueError(f"{images_path}: not an IDX image file (magic {magic}, {len(data)} bytes)")
  images = np.frombuffer(data[16:], np.uint8).reshape(count, rows, cols)
  with gzip.open(labels_path, "rb") as f:
    data = f.read()
  magic, label_count = np.frombuffer(data[:8], ">i4")
  if magic != _LABELS_MAGIC or label_count != count or len(data) != 8 + count:
    raise ValueError(f"{labels_path}: not an IDX label file for {count} images (magic {magic})")
  return images, np.frombuffer(data[8:], np.uint8)


def example(encoded: bytes, label: int, height: int, width: int, channels: int,
            image_format: bytes = b"png") -> tf.train.Example:
  """An ImageNet-style tf.train.Example."""
  feature = lambda **kw: tf.train.Feature(**kw)
  ints = lambda v: feature(int64_list=tf.train.Int64List(value=[int(v)]))
  raw = lambda v: feature(bytes_list=tf.train.BytesList(value=[v]))
  return tf.train.Example(features=tf.train.Features(feature={
      "image/encoded": raw(encoded), "image/format": raw(image_format),
      "image/class/label": ints(label), "image/height": ints(height), "image/width": ints(width),
      "image/channels": ints(channels)}))


def write_tfrecords(images: np.ndarray, labels: np.ndarray, path: str) -> None:
  """Writes uint8 images ([N, H, W] or [N, H, W, C]) as PNG records, atomically."""
  if images.ndim == 3:
    images = images[..., None]
  n, height, width, channels = images.shape
  encoded = tf.data.Dataset.from_tensor_slices(images).map(
      tf.io.encode_png, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  with records.written_atomically(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
    for png, label in zip(encoded.as_numpy_iterator(), labels):
      writer.write(example(png, int(label), height, width, channels).SerializeToString())


def convert_fashion_mnist(output_dir: str, num_train_files: int = 8,
                          source_dir: str = FASHION_MNIST_DIR) -> Tuple[List[str], List[str]]:
  """Writes the TFRecords once (existing files are kept); returns (train, eval) paths."""
  if num_train_files < 1:
    raise ValueError(f"num_train_files={num_train_files} must be >= 1")
  train = [os.path.join(output_dir, f"train-{i:05d}-of-{num_train_files:05d}.tfrecord")
           for i in range(num_train_files)]
  evaluation = [os.path.join(output_dir, "eval-00000-of-00001.tfrecord")]
  if all(tf.io.gfile.exists(p) for p in train + evaluation):
    return train, evaluation
  if not os.path.isdir(source_dir):
    raise FileNotFoundError(f"{source_dir} is missing: Fashion-MNIST comes from Debian's "
                            f"{FASHION_MNIST_PACKAGE}: run `apt-get install -y "
                            f"{FASHION_MNIST_PACKAGE}` (`make data` does, as root)")
  tf.io.gfile.makedirs(output_dir)
  for part, paths in (("train", train), ("eval", evaluation)):
    images_name, labels_name, expected = _PARTS[part]
    images, labels = read_idx(os.path.join(source_dir, images_name),
                              os.path.join(source_dir, labels_name))
    if len(images) != expected:
      raise ValueError(f"{source_dir}/{images_name}: {len(images)} images, expected {expected}")
    for index, chunk in enumerate(np.array_split(np.arange(len(images)), len(paths))):
      write_tfrecords(images[chunk], labels[chunk], paths[index])
      logging.info("wrote %s (%d images)", paths[index], len(chunk))
  return train, evaluation


_FEATURES = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
             "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
_MESSAGE_PREFIX = "malformed image record "
_CHECK_BATCH = 256  # records parsed and checked together, before decoding one by one
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"\x00\x00\x00\x00IEND"  # the last chunk's length and type (its CRC follows)
_JPEG_START, _JPEG_END = b"\xff\xd8\xff", b"\xff\xd9"


def _complete_image(encoded: tf.Tensor) -> tf.Tensor:
  """[B] bool: whether each of ``encoded`` ([B] string) starts and ends like a PNG or a JPEG."""
  length = tf.strings.length(encoded)
  png_end = tf.strings.substr(encoded, tf.maximum(length - 12, 0), tf.fill(tf.shape(length), 8))
  jpeg_end = tf.strings.substr(encoded, tf.maximum(length - 2, 0), tf.fill(tf.shape(length), 2))
  png = tf.equal(tf.strings.substr(encoded, 0, 8), _PNG_SIGNATURE) & tf.equal(png_end, _PNG_END)
  jpeg = (tf.equal(tf.strings.substr(encoded, 0, 3), _JPEG_START) & tf.equal(jpeg_end, _JPEG_END)
          & (length >= 5))
  return png | jpeg


def _check_records(parsed: Dict[str, tf.Tensor], enforce, label_offset: int,
                   num_classes: Optional[int]) -> Tuple[tf.Tensor, tf.Tensor]:
  """(encoded images, int32 labels + label_offset) of parsed records, bad ones failing or masked.

  ``enforce(ok, describe, tensors)`` applies the bad-record policy (``records.enforce``).
  """
  encoded, stored = parsed["image/encoded"], parsed["image/class/label"]
  image_ok = _complete_image(encoded)
  low = -label_offset
  label_ok = stored >= low
  valid = f"below {low}"
  if num_classes is not None:
    label_ok &= stored < num_classes + low
    valid = f"not in [{low}, {num_classes + low})"

  def describe(i: tf.Tensor) -> tf.Tensor:
    image_reason = tf.strings.join([
        "image/encoded is not a complete PNG or JPEG image (",
        tf.strings.as_string(tf.strings.length(encoded[i])), " bytes)"])
    label_reason = tf.strings.join([f"image/class/label {valid} (got: ",
                                    tf.strings.as_string(stored[i]), ")"])
    return tf.where(image_ok[i], label_reason, image_reason)

  encoded, stored = enforce(image_ok & label_ok, describe, [encoded, stored])
  return encoded, tf.cast(stored + label_offset, tf.int32)


def decode(encoded: tf.Tensor, image_size: Optional[int], channels: int) -> tf.Tensor:
  """JPEG or PNG bytes -> float32 [H, W, C] in [0, 1], resized to ``image_size`` if given."""
  image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
  image = tf.image.convert_image_dtype(image, tf.float32)
  if image_size:
    image = tf.image.resize(image, [image_size, image_size])
    image.set_shape([image_size, image_size, channels])
  return image


def augment_image(image: tf.Tensor, pad: int, seed: Optional[int]) -> tf.Tensor:
  """Random left-right flip, then a random crop of the original size after padding by ``pad``."""
  image = tf.image.random_flip_left_right(image, seed=seed)
  if pad:
    shape = tf.shape(image)
    padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
    image = tf.image.random_crop(padded, shape, seed=seed)
  return image


@gin.configurable(module="images")
def make_dataset(file_pattern, batch_size: int, *, image_size: Optional[int] = 28,
                 channels: int = 1, label_offset: int = 0, augment: Optional[bool] = None,
                 pad: int = 2, shard_index: int = 0, num_shards: int = 1, repeat: bool = False,
                 shuffle_buffer: int = 0, seed: Optional[int] = None,
                 drop_remainder: Optional[bool] = None, num_classes: Optional[int] = None,
                 bad_lines: str = "error",
                 bad_line_counter: Optional[records.BadLineCounter] = None,
                 cache: bool = False) -> tf.data.Dataset:
  """Batches of ``({'image': float32 [B, H, W, C]}, int32 [B])`` from ImageNet-style TFRecords.

  ``label_offset`` is added to ``image/class/label`` (-1 for ImageNet's 1-based labels).
  ``augment`` and ``drop_remainder`` default to ``repeat`` (training). ``cache`` keeps the
  decoded images of this shard in memory after the first pass (``tf.data.Dataset.cache``), then
  shuffles and repeats them: for data sets that fit in memory, trained for many passes (decoding
  costs far more than a small model's step); bad records are then checked and counted once.

  Bad records are found before decoding, by cheap checks: ``image/encoded`` that is not a
  complete PNG (its signature, and the IEND chunk ending it) or JPEG (starting ``FF D8 FF``,
  ending ``FF D9``; a JPEG with bytes after that end marker counts as bad too), and a label
  (after ``label_offset``) outside ``[0, num_classes)`` (below 0, when ``num_classes`` is None).
  ``bad_lines='error'`` fails iteration naming the file, 1-based record number and reason, and
  raises DataError here for an empty (0-byte) file; ``'skip'`` drops such records, adding
  their number to ``bad_line_counter``, and skips empty files with a warning. An image whose
  start and end are intact but whose inside is corrupt still fails inside ``tf.io.decode_image``
  with TensorFlow's own message, which names neither file nor record, under either policy.
  """
  records.check_choice("bad_lines", bad_lines, records.BAD_LINE_POLICIES)
  if not 0 <= shard_index < num_shards:
    raise ValueError(f"shard_index={shard_index} is out of range for num_shards={num_shards}")
  files = records.drop_empty_files(records.resolve_files(file_pattern, "TFRecord"), bad_lines,
                                   file_pattern, binding="images.make_dataset.bad_lines")
  tagged = records.read_tagged_files(files, tf.data.TFRecordDataset, _CHECK_BATCH,
                                     shard_index=shard_index, num_shards=num_shards,
                                     repeat=repeat and not cache,
                                     shuffle_buffer=0 if cache else shuffle_buffer, seed=seed)

  def check(file_ids: tf.Tensor, numbers: tf.Tensor, serialized: tf.Tensor):
    enforce = functools.partial(records.enforce, where=records.locator(files, file_ids, numbers),
                                prefix=_MESSAGE_PREFIX, policy=bad_lines, counter=bad_line_counter)
    return _check_records(tf.io.parse_example(serialized, _FEATURES), enforce, label_offset,
                          num_classes)

  data = tagged.map(check, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
  data = data.map(lambda x, y: (decode(x, image_size, channels), y),
                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if cache:
    data = data.cache()
    if shuffle_buffer > 0:
      data = data.shuffle(shuffle_buffer, seed=seed)
    if repeat:
      data = data.repeat()
  if repeat if augment is None else augment:
    data = data.map(lambda x, y: (augment_image(x, pad, seed), y),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  data = data.map(lambda x, y: ({"image": x}, y))
  drop = repeat if drop_remainder is None else drop_remainder
  return data.batch(batch_size, drop_remainder=drop).prefetch(tf.data.AUTOTUNE)


def feature_spec(image_size: int = 28, channels: int = 1) -> Dict[str, tf.TensorSpec]:
  """Batched feature spec."""
  return {"image": tf.TensorSpec([None, image_size, image_size, channels], tf.float32)}


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  train, evaluation = convert_fashion_mnist(FLAGS.output_dir, FLAGS.num_train_files,
                                            FLAGS.source_dir)
  print(f"train: {len(train)} files, eval: {evaluation[0]}")


if __name__ == "__main__":
  flags.DEFINE_string("output_dir", None, "Where to write the TFRecords.", required=True)
  flags.DEFINE_integer("num_train_files", 8, "Training TFRecord files (shards).")
  flags.DEFINE_string("source_dir", FASHION_MNIST_DIR, "Directory of the gzipped IDX files.")
  FLAGS = flags.FLAGS
  app.run(main)
