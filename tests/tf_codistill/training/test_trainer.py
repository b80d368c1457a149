"""trainer.train in this process: the steps asked for, the outputs, what the exchange did."""

import functools
import json
import os

import pytest
import tensorflow as tf

from data_pipelines import criteo
from tf_codistill import layout
from tf_codistill.exchange import directory as exchange
from tf_codistill.models import ctr
from tf_codistill.training import trainer

import testing_utils


def test_train_steps_are_honoured_when_not_a_whole_number_of_epochs(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "run")
  results = trainer.train(
      model_dir, train_files=[f"{criteo_dir}/train-*"], eval_files=[f"{criteo_dir}/eval-*"],
      dataset_fn=functools.partial(criteo.make_dataset, num_buckets=1000),
      model_fn=functools.partial(ctr.ctr_model, num_buckets=1000, embedding_dim=4,
                                 hidden_units=(16,)),
      batch_size=64, train_steps=70, steps_per_epoch=30, eval_steps=2,
      checkpoint_every_steps=30, verbose=0)
  assert results["steps"] == 70
  with open(layout.RunDir(model_dir).progress) as f:
    assert [json.loads(line)["step"] for line in f] == [30, 60, 70]
  # Every output is where the run layout says.
  run = layout.RunDir(model_dir)
  for path in (run.results, run.heartbeat, os.path.join(run.export, "saved_model.pb"),
               run.step_summaries):
    assert os.path.exists(path), path
  with open(run.results) as f:
    assert json.load(f)["steps"] == 70



def test_results_say_how_much_training_data_the_group_read(tmp_path, criteo_dir):
  results = trainer.train(
      str(tmp_path / "run"), train_files=[f"{criteo_dir}/train-*"],
      eval_files=[f"{criteo_dir}/eval-*"],
      dataset_fn=functools.partial(criteo.make_dataset, num_buckets=1000),
      model_fn=functools.partial(ctr.ctr_model, num_buckets=1000, embedding_dim=4,
                                 hidden_units=(16,)),
      batch_size=32, train_steps=20, steps_per_epoch=20, eval_steps=1,
      checkpoint_every_steps=20, verbose=0)
  assert results["batch_size"] == 32 and results["data_split"] == "disjoint"
  assert results["train_examples"] == 20 * 32 and results["train_targets"] == 20 * 32


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
                                             rf"got 3; fix the line"):
    with trainer._data_errors(criteo.make_dataset):
      for _ in shuffled([path], 32, seed=seed):
        pass


def test_a_codistilling_group_publishes_and_writes_what_its_exchange_did(tmp_path, criteo_dir):
  exchange_dir = str(tmp_path / "exchange")
  results = trainer.train(
      str(tmp_path / "run"), group=0, num_groups=2, exchange_dir=exchange_dir,
      train_files=[f"{criteo_dir}/train-*"], eval_files=[f"{criteo_dir}/eval-*"],
      dataset_fn=functools.partial(criteo.make_dataset, num_buckets=1000),
      model_fn=functools.partial(ctr.ctr_model, num_buckets=1000, embedding_dim=4,
                                 hidden_units=(16,)),
      codistill=True, exchange_every_steps=10, batch_size=32, train_steps=30,
      steps_per_epoch=30, eval_steps=1, checkpoint_every_steps=30, verbose=0)
  # No peer ever published: the group trained on its task loss and published on its cadence.
  assert results["teacher_loads"] == 0 and results["teacher_groups"] == [1]
  assert results["publishes"] >= 1 and results["publish_failures"] == 0
  assert results["publish_refused_non_finite"] == 0
  assert "other" in results["step_time_ms"]  # steps overlapping no exchange work
  steps = [v.step for v in exchange.list_versions(exchange_dir, 0)]
  assert steps and steps[0] == 30  # the final step is always published
