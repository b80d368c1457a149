"""Tests of the image pipeline: Fashion-MNIST IDX files, the TFRecord round trip, decoding,
shards."""

import os

import numpy as np
import pytest
import tensorflow as tf

from data_pipelines import images

from testing_utils import require_fashion_mnist


def _fashion(part):
  require_fashion_mnist()
  names = images._PARTS[part]
  return images.read_idx(os.path.join(images.FASHION_MNIST_DIR, names[0]),
                         os.path.join(images.FASHION_MNIST_DIR, names[1]))


def test_debian_fashion_mnist_files_are_the_real_data():
  pixels, labels = _fashion("train")
  assert pixels.shape == (60_000, 28, 28) and pixels.dtype == np.uint8
  np.testing.assert_array_equal(np.bincount(labels), [6000] * 10)
  pixels, labels = _fashion("eval")
  assert pixels.shape == (10_000, 28, 28)
  np.testing.assert_array_equal(np.bincount(labels), [1000] * 10)
  assert labels[:3].tolist() == [9, 2, 1]  # ankle boot, pullover, trouser


def test_tfrecord_round_trip_keeps_pixels_and_labels(tmp_path):
  pixels, labels = _fashion("eval")
  pixels, labels = pixels[:300], labels[:300]
  path = str(tmp_path / "eval-00000-of-00001.tfrecord")
  images.write_tfrecords(pixels, labels, path)
  data = images.make_dataset(path, 64)  # evaluation: no augmentation, in order, all records
  got = [(f["image"].numpy(), y.numpy()) for f, y in data]
  image = np.concatenate([g[0] for g in got])
  label = np.concatenate([g[1] for g in got])
  assert image.shape == (300, 28, 28, 1) and image.dtype == np.float32
  np.testing.assert_array_equal(np.round(image[..., 0] * 255).astype(np.uint8), pixels)
  np.testing.assert_array_equal(label, labels)
  record = next(iter(tf.data.TFRecordDataset(path)))
  example = tf.train.Example.FromString(record.numpy())
  feature = example.features.feature
  assert feature["image/format"].bytes_list.value == [b"png"]
  assert feature["image/class/label"].int64_list.value == [int(labels[0])]
  assert feature["image/encoded"].bytes_list.value[0][:4] == b"\x89PNG"


def test_jpeg_records_decode_and_labels_offset(tmp_path):
  rgb = np.random.default_rng(0).integers(0, 255, (2, 32, 32, 3), np.uint8)
  path = str(tmp_path / "imagenet.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for k in range(2):
      jpeg = tf.io.encode_jpeg(rgb[k], quality=100).numpy()
      writer.write(images.example(jpeg, k + 1, 32, 32, 3, b"jpeg").SerializeToString())
  features, labels = next(iter(images.make_dataset(path, 2, image_size=16, channels=3,
                                                   label_offset=-1)))
  assert features["image"].shape == (2, 16, 16, 3)
  np.testing.assert_array_equal(labels, [0, 1])


def test_training_augments_and_shards_are_disjoint(tmp_path):
  pixels, labels = _fashion("eval")
  for k in range(2):
    images.write_tfrecords(pixels[k * 50:(k + 1) * 50], np.arange(k * 50, (k + 1) * 50),
                           str(tmp_path / f"train-{k}.tfrecord"))
  pattern = str(tmp_path / "train-*")
  for num_shards in (2, 4):  # by file, by record
    seen = [set(np.concatenate([y.numpy() for _, y in images.make_dataset(
        pattern, 16, shard_index=i, num_shards=num_shards)])) for i in range(num_shards)]
    assert sorted(set().union(*seen)) == list(range(100))
    assert sum(len(s) for s in seen) == 100
  train = images.make_dataset(pattern, 8, repeat=True, shuffle_buffer=20, seed=3)
  batch, _ = next(iter(train))
  assert batch["image"].shape == (8, 28, 28, 1)
  assert 0.0 <= float(tf.reduce_min(batch["image"])) and float(tf.reduce_max(batch["image"])) <= 1.0


def test_cached_training_data_decodes_once_and_reshuffles_every_pass(tmp_path):
  pixels, _ = _fashion("eval")
  for k in range(2):
    images.write_tfrecords(pixels[k * 40:(k + 1) * 40], np.arange(k * 40, (k + 1) * 40),
                           str(tmp_path / f"train-{k}.tfrecord"))
  pattern = str(tmp_path / "train-*")
  for shard in range(2):
    data = images.make_dataset(pattern, 10, shard_index=shard, num_shards=2, repeat=True,
                               shuffle_buffer=40, seed=1, augment=False, cache=True)
    labels = np.concatenate([y.numpy() for _, y in data.take(8)])  # 2 passes over 40 images
    first, second = labels[:40], labels[40:]
    assert sorted(first) == sorted(second) == list(range(shard * 40, (shard + 1) * 40))
    assert first.tolist() != second.tolist()  # reshuffled every pass
    # The same images as the uncached pipeline, pixel for pixel.
    plain = images.make_dataset(pattern, 40, shard_index=shard, num_shards=2, augment=False)
    cached = images.make_dataset(pattern, 40, shard_index=shard, num_shards=2, augment=False,
                                 cache=True)
    for (a, ya), (b, yb) in zip(plain, cached):
      np.testing.assert_array_equal(a["image"], b["image"])
      np.testing.assert_array_equal(ya, yb)


def test_missing_files_and_bad_idx_fail_naming_the_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="no TFRecord files match"):
    images.make_dataset(str(tmp_path / "none-*"), 2)
  bad = tmp_path / "bad.gz"
  import gzip
  with gzip.open(bad, "wb") as f:
    f.write(b"\x00" * 32)
  with pytest.raises(ValueError, match="bad.gz: not an IDX image file"):
    images.read_idx(str(bad), str(bad))
  with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
    images.convert_fashion_mnist(str(tmp_path / "out"), source_dir=str(tmp_path / "nowhere"))
