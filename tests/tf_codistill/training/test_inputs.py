"""A group's input: pipelines checked before training, malformed records named by first line."""

import functools

import pytest
import tensorflow as tf

from data_pipelines import criteo
from tf_codistill.training import inputs

import testing_utils


def _config(criteo_dir, **settings):
  return inputs.Data(**{
      "train_files": [f"{criteo_dir}/train-*"], "eval_files": [f"{criteo_dir}/eval-*"],
      "dataset_fn": functools.partial(criteo.make_dataset, num_buckets=100), "batch_size": 16,
      **settings})


def _first_batch(data):
  features, _ = next(iter(data.train(repeat=False)))
  return [x.numpy().tolist() for x in tf.nest.flatten(features)]


def test_a_group_gets_its_own_shard_and_a_probe_of_real_examples(criteo_dir):
  config = _config(criteo_dir, shuffle_buffer=0)
  first, second = inputs.build(config, 0, 2), inputs.build(config, 1, 2)
  assert _first_batch(first) != _first_batch(second)  # disjoint shards
  same = inputs.build(_config(criteo_dir, shuffle_buffer=0, split="same"), 1, 2)
  assert _first_batch(same) == _first_batch(first)
  # The checks read examples; the counter of skipped lines starts again for training.
  assert first.bad_lines.count == 0
  tf.nest.assert_same_structure(first.sample, first.input_spec)
  tf.nest.assert_same_structure(first.probe, first.input_spec)
  assert len(list(first.predictions(2))) == 2
  assert len(list(first.predictions(None))) == len(list(first.evaluation))


def test_missing_files_name_the_binding(tmp_path, criteo_dir):
  with pytest.raises(inputs.errors.ConfigurationError, match=r"tfc.Data.eval_files: "):
    inputs.build(_config(criteo_dir, eval_files=[str(tmp_path / "none-*")]), 0, 1)
  with pytest.raises(inputs.errors.ConfigurationError, match=r"tfc.Data.train_files: "):
    inputs.build(_config(criteo_dir, train_files=[str(tmp_path / "none-*")]), 0, 1)


def test_a_shard_without_one_valid_example_is_a_data_error(tmp_path, criteo_dir):
  bad = testing_utils.write_lines(tmp_path / "train-00000-of-00001.tsv", ["1\t2\t3"] * 10)
  skipping = functools.partial(criteo.make_dataset, num_buckets=100, bad_lines="skip")
  with pytest.raises(inputs.DataError, match=r"group 1's shard of 2 holds no valid example"):
    inputs.build(_config(criteo_dir, train_files=[bad], dataset_fn=skipping), 1, 2)


def test_a_malformed_file_is_reported_at_its_first_bad_line_whatever_its_kind(tmp_path):
  lines = [testing_utils.GOOD_LINES[0]] * 300
  lines[50] = "1\t2\t3"  # line 51: a short row
  lines[155] = b"\xff\xfe" + testing_utils.GOOD_LINES[0].encode()  # line 156: not UTF-8
  path = testing_utils.write_lines(tmp_path / "train-00000-of-00001.tsv", lines)
  shuffled = functools.partial(criteo.make_dataset, shuffle_buffer=300, num_buckets=10)

  def first_error(seed):
    try:
      for _ in shuffled([path], 32, seed=seed):
        pass
    except tf.errors.InvalidArgumentError as e:
      return e.message
    return ""

  # A shuffle that meets line 156 first: the pipeline alone names it, the trainer line 51.
  seed = next(s for s in range(50) if f"{path}:156:" in first_error(s))
  with pytest.raises(criteo.DataError, match=rf"{path}:51: expected 40 tab-separated fields, "
                                             rf"got 3; fix the line, or bind "
                                             rf"criteo.make_dataset.bad_lines = 'skip'"):
    with inputs.data_errors(criteo.make_dataset):
      for _ in shuffled([path], 32, seed=seed):
        pass


def _batches(make, context=None, n=3):
  return [[x.numpy().tolist() for x in tf.nest.flatten(features)]
          for features, _ in make(context).take(n)]


def test_a_resumed_pipeline_starts_at_the_batch_after_its_checkpoints_steps(criteo_dir):
  data = inputs.build(_config(criteo_dir), 0, 1, seed=4)
  assert data.resumed(0) is data.train
  whole = _batches(data.train, n=8)
  assert _batches(data.resumed(5)) == whole[5:8]
  # Synchronous workers each read one batch a step; parameter-server workers an even share.
  context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                       num_replicas_in_sync=2)
  pipeline = _batches(data.train, context, n=8)
  assert _batches(data.resumed(4), context) == pipeline[4:7]
  assert _batches(data.resumed(4, shared_steps=True), context) == pipeline[2:5]


def _rows(dataset):
  rows = []
  for features, _ in dataset:
    columns = [x.numpy().tolist() for x in tf.nest.flatten(features)]
    rows += [tuple(str(column[i]) for column in columns) for i in range(len(columns[0]))]
  return rows


def test_parameter_server_workers_each_read_their_own_part_of_the_groups_share(criteo_dir):
  # TF gives every parameter-server worker the same input context (one pipeline, id 0).
  context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                       num_replicas_in_sync=1)
  groups = [inputs.build(_config(criteo_dir), g, 2, seed=3, async_workers=2) for g in (0, 1)]
  parts = [_rows(data.train(context, repeat=False, worker=tf.constant(w)))
           for data in groups for w in (0, 1)]
  # Four parts, each read once by one worker, together the whole training data.
  assert all(parts) and len(set().union(*parts)) == sum(len(p) for p in parts)
  whole = _rows(inputs.build(_config(criteo_dir), 0, 1).train(repeat=False))
  assert sorted(sum(parts, [])) == sorted(whole)
  # A resumed worker skips its share of the group's steps (steps are shared by the workers).
  data = groups[1]
  first = _batches(functools.partial(data.train, worker=tf.constant(1)), context, n=6)
  resumed = data.resumed(4, shared_steps=True)
  assert _batches(functools.partial(resumed, worker=tf.constant(1)), context) == first[2:5]


def test_skipped_lines_are_counted_where_the_pipeline_runs_in_this_process(tmp_path):
  bad = "1\t2\t3"
  lines = [testing_utils.GOOD_LINES[i % 3] for i in range(40)]
  lines[4] = lines[30] = bad
  path = testing_utils.write_lines(tmp_path / "train-00000-of-00001.tsv", lines)
  config = _config(tmp_path, train_files=[path], eval_files=[path], dataset_fn=functools.partial(
      criteo.make_dataset, num_buckets=10, bad_lines="skip"))
  # A synchronous worker's pipeline (an input context): this process reads it, so it counts.
  context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                       num_replicas_in_sync=2)
  data = inputs.build(config, 0, 1)
  list(data.train(context, repeat=False))
  assert data.bad_lines.count == 2 and data.training_lines_counted
  # A parameter-server worker's pipeline runs on that worker: not counted, and said so.
  remote = inputs.build(config, 0, 1, remote_input=True)
  list(remote.train(context, repeat=False))
  assert remote.bad_lines.count == 0 and not remote.training_lines_counted
  # Other workers' counts exist only in a MultiWorkerMirrored group.
  assert inputs.skipped_lines_elsewhere(tf.distribute.get_strategy(), data.bad_lines) == 0


def test_a_truncated_record_file_is_an_error_naming_it(tmp_path):
  import numpy as np

  from data_pipelines import token_lm
  docs = [np.arange(1, 40, dtype=np.uint16)]
  for name in ("eval-00000-of-00001", "train-00000-of-00002", "train-00001-of-00002"):
    token_lm.write_shard(str(tmp_path / f"{name}.tfrecord"), docs)
  bad = tmp_path / "train-00001-of-00002.tfrecord"
  bad.write_bytes(bad.read_bytes()[:-7])  # cut inside its record
  config = inputs.Data(
      train_files=[str(tmp_path / "train-*")], eval_files=[str(tmp_path / "eval-*")],
      dataset_fn=functools.partial(token_lm.make_dataset, vocab_size=50, sequence_length=4),
      batch_size=2, shuffle_buffer=0, split="same")
  with pytest.raises(inputs.DataError, match=rf"{bad}: unreadable \(.*\): the file is truncated "
                                             r"or corrupt; restore or remove it"):
    data = inputs.build(config, 0, 1)
    with inputs.data_errors(config.dataset_fn, [*config.train_files, *config.eval_files]):
      for _ in data.train(repeat=False):
        pass
