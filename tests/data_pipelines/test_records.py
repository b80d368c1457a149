"""Tests of the tabular pipelines' shared reading core: files, shards, tags, bad-record policy."""

import os

import numpy as np
import pytest
import tensorflow as tf

from data_pipelines import records


def write_files(tmp_path, rows_per_file):
  """Text files whose lines say where they are: '<file index>:<1-based line number>'."""
  paths = []
  for f, rows in enumerate(rows_per_file):
    path = tmp_path / f"part-{f}.txt"
    path.write_text("".join(f"{f}:{n}\n" for n in range(1, rows + 1)))
    paths.append(str(path))
  return paths


def tagged(paths, **kwargs):
  """[(file id, record number, record)] of every record the dataset yields."""
  out = []
  for file_ids, numbers, lines in records.read_tagged_files(paths, tf.data.TextLineDataset, 7,
                                                            **kwargs):
    out += zip(file_ids.numpy().tolist(), numbers.numpy().tolist(),
               [line.decode() for line in lines.numpy()])
  return out


def test_records_are_tagged_with_their_file_and_1_based_number(tmp_path):
  paths = write_files(tmp_path, [3000, 5])  # more than one read block in the first file
  got = tagged(paths)
  assert len(got) == 3005
  assert all(line == f"{f}:{n}" for f, n, line in got)


@pytest.mark.parametrize("rows_per_file,num_shards", [([40, 30, 20, 10], 2), ([40, 30], 3)])
def test_shards_are_disjoint_and_cover_every_record_once(tmp_path, rows_per_file, num_shards):
  paths = write_files(tmp_path, rows_per_file)
  shards = [sorted(line for _, _, line in tagged(paths, shard_index=i, num_shards=num_shards))
            for i in range(num_shards)]
  everything = sorted(f"{f}:{n}" for f, rows in enumerate(rows_per_file)
                      for n in range(1, rows + 1))
  assert sorted(sum(shards, [])) == everything
  assert all(shards)
  if len(paths) >= num_shards:  # by file: a file's records all go to one shard
    assert all(len({line.split(":")[0] for line in shard}) == len(paths) // num_shards
               for shard in shards)


def test_shuffle_and_repeat_keep_the_tags(tmp_path):
  paths = write_files(tmp_path, [20, 20])
  got = []
  dataset = records.read_tagged_files(paths, tf.data.TextLineDataset, 8, shuffle_buffer=16,
                                      seed=3, repeat=True)
  for file_ids, numbers, lines in dataset.take(10):
    got += zip(file_ids.numpy().tolist(), numbers.numpy().tolist(), lines.numpy().tolist())
  assert len(got) == 80 and all(line.decode() == f"{f}:{n}" for f, n, line in got)
  assert [line for _, _, line in got[:40]] != sorted(line for _, _, line in got[:40])


@pytest.mark.parametrize("kwargs,message", [
    (dict(shard_index=2, num_shards=2), "shard_index=2"),
    (dict(shard_index=-1, num_shards=2), "num_shards=2"),
])
def test_bad_shards_are_refused(tmp_path, kwargs, message):
  with pytest.raises(ValueError, match=message):
    records.read_tagged_files(write_files(tmp_path, [1]), tf.data.TextLineDataset, 1, **kwargs)


def test_resolve_files_names_every_glob_that_matches_nothing(tmp_path):
  paths = write_files(tmp_path, [1, 1])
  assert records.resolve_files([paths[1], str(tmp_path / "part-*")], "Test") == paths
  with pytest.raises(FileNotFoundError, match=r"no Test files match .*nope-\*"):
    records.resolve_files([str(tmp_path / "part-*"), str(tmp_path / "nope-*")], "Test")
  with pytest.raises(FileNotFoundError, match="no Test file pattern given"):
    records.resolve_files([], "Test")


def test_empty_files_fail_naming_file_and_binding_or_are_skipped(tmp_path):
  paths = write_files(tmp_path, [2, 0])
  with pytest.raises(records.DataError, match=r"part-1.txt: empty file.*bind x.bad_lines = 'skip'"):
    records.drop_empty_files(paths, "error", "glob", binding="x.bad_lines")
  assert records.drop_empty_files(paths, "skip", "glob") == paths[:1]
  with pytest.raises(records.DataError, match="every file matching 'glob' is empty"):
    records.drop_empty_files(paths[1:], "skip", "glob")


def test_enforce_fails_on_the_first_bad_record_naming_place_and_reason():
  ok = tf.constant([True, False, False])
  values = tf.constant([1, 2, 3])
  where = records.locator(["a.txt", "b.txt"], tf.constant([0, 1, 1]), tf.constant([5, 6, 7]))
  describe = lambda i: tf.strings.join(["value", records.shown(tf.strings.as_string(values[i]))])
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"bad row b.txt:6: value \(got: 2\)"):
    records.enforce(ok, describe, [values], where=where, prefix="bad row ", policy="error",
                    counter=None)
  counter = records.BadLineCounter()
  kept, = records.enforce(ok, describe, [values], where=where, prefix="", policy="skip",
                          counter=counter)
  assert kept.numpy().tolist() == [1] and counter.count == 2
  counter.reset()
  assert counter.count == 0


def test_shown_truncates_and_replaces_invalid_utf8():
  got = records.shown(tf.constant(b"\xff" + b"x" * 100)).numpy().decode()
  assert got == " (got: \ufffd" + "x" * 31 + ")"
  assert records.valid_utf8(tf.constant(b"ok")).numpy() == b"ok"


def test_check_choice_names_the_parameter():
  records.check_choice("bad_lines", "skip", records.BAD_LINE_POLICIES)
  with pytest.raises(ValueError, match="bad_lines='drop' is not one of 'error', 'skip'"):
    records.check_choice("bad_lines", "drop", records.BAD_LINE_POLICIES)


def test_columnar_blocks_travel_as_their_groups_and_are_batched_whole(tmp_path):
  # A columnar reader's blocks (a dict of vectors and matrices, one row per leading index) go
  # through unbatch/shuffle/batch as they are: every batch holds the same groups, rows intact.
  def open_blocks(path):
    n = tf.strings.to_number(tf.strings.regex_replace(path, r".*_(\d+)$", r"\1"), tf.int64)
    rows = tf.range(n)
    return tf.data.Dataset.from_tensors({
        "ab": tf.stack([rows, rows * 10], axis=1), "label": tf.cast(rows, tf.float32),
        "name": tf.strings.as_string(rows)})
  files = [str(tmp_path / "f_5"), str(tmp_path / "f_3")]
  batches = list(records.read_tagged_files(files, open_blocks, batch_size=4, blocks=True,
                                           shuffle_buffer=8, seed=1))
  rows = []
  for file_ids, numbers, columns in batches:
    assert set(columns) == {"ab", "label", "name"}
    assert columns["ab"].shape[1:] == [2] and columns["name"].dtype == tf.string
    for i in range(len(numbers)):
      a = int(columns["ab"][i, 0])
      assert (int(columns["ab"][i, 1]), float(columns["label"][i]), columns["name"][i].numpy()) == (
          10 * a, float(a), str(a).encode())
      rows.append((int(file_ids[i]), int(numbers[i]), a))
  assert sorted(rows) == [(0, k + 1, k) for k in range(5)] + [(1, k + 1, k) for k in range(3)]


def test_a_writer_killed_before_its_rename_leaves_nothing_that_the_data_glob_matches(
    tmp_path, monkeypatch):
  from data_pipelines import images  # pylint: disable=g-import-not-at-top
  pixels = np.zeros([4, 28, 28], np.uint8)
  images.write_tfrecords(pixels, np.arange(4), str(tmp_path / "train-00000-of-00002.tfrecord"))

  def killed(*args, **kwargs):
    raise KeyboardInterrupt("killed before the rename")

  monkeypatch.setattr(tf.io.gfile, "rename", killed)
  with pytest.raises(KeyboardInterrupt):
    images.write_tfrecords(pixels, np.arange(4), str(tmp_path / "train-00001-of-00002.tfrecord"))
  left = [name for name in os.listdir(tmp_path) if name.startswith(".tmp-")]
  assert len(left) == 1 and left[0].endswith("-train-00001-of-00002.tfrecord")
  assert tf.io.gfile.glob(str(tmp_path / "train-*")) == [
      str(tmp_path / "train-00000-of-00002.tfrecord")]
