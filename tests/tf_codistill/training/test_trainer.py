"""trainer.train in this process: the steps asked for, the outputs, what the exchange did."""

import dataclasses
import functools
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from data_pipelines import criteo
from tf_codistill import layout
from tf_codistill import serving
from tf_codistill.errors import ConfigurationError
from tf_codistill.exchange import config as exchange_config
from tf_codistill.exchange import directory as exchange
from tf_codistill.models import ctr
from tf_codistill.training import checkpointing
from tf_codistill.training import inputs
from tf_codistill.training import train_config
from tf_codistill.training import trainer


def _data(criteo_dir, batch_size, **settings):
  """The generated Criteo files, parsed with 1000 buckets, ``batch_size`` examples a step."""
  return inputs.Data(train_files=[f"{criteo_dir}/train-*"], eval_files=[f"{criteo_dir}/eval-*"],
                     dataset_fn=functools.partial(criteo.make_dataset, num_buckets=1000),
                     batch_size=batch_size, **settings)


def test_train_steps_are_honoured_when_not_a_whole_number_of_epochs(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "run")
  results = trainer.train(
      model_dir, data=_data(criteo_dir, 64),
      model_fn=functools.partial(ctr.ctr_model, num_buckets=1000, embedding_dim=4,
                                 hidden_units=(16,)),
      train_steps=70, steps_per_epoch=30, eval_steps=2,
      checkpoints=checkpointing.Checkpoints(every_steps=30), verbose=0)
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
      str(tmp_path / "run"), data=_data(criteo_dir, 32),
      model_fn=functools.partial(ctr.ctr_model, num_buckets=1000, embedding_dim=4,
                                 hidden_units=(16,)),
      train_steps=20, steps_per_epoch=20, eval_steps=1,
      checkpoints=checkpointing.Checkpoints(every_steps=20), verbose=0)
  assert results["batch_size"] == 32 and results["data_split"] == "disjoint"
  assert results["tensorflow"] == tf.__version__  # which TF a figure was taken on
  assert results["train_examples"] == 20 * 32 and results["train_targets"] == 20 * 32


def test_a_codistilling_group_publishes_and_writes_what_its_exchange_did(tmp_path, criteo_dir):
  exchange_dir = str(tmp_path / "exchange")
  results = trainer.train(
      str(tmp_path / "run"), group=0, num_groups=2, exchange_dir=exchange_dir,
      data=_data(criteo_dir, 32),
      model_fn=functools.partial(ctr.ctr_model, num_buckets=1000, embedding_dim=4,
                                 hidden_units=(16,)),
      exchange=functools.partial(exchange_config.Exchange, publish_every_steps=10),
      train_steps=30,
      steps_per_epoch=30, eval_steps=1, checkpoints=checkpointing.Checkpoints(every_steps=30),
      verbose=0)
  # No peer ever published: the group trained on its task loss and published on its cadence.
  assert results["teacher_loads"] == 0 and results["teacher_groups"] == [1]
  assert results["publishes"] >= 1 and results["publish_failures"] == 0
  assert results["publish_refused_non_finite"] == 0
  assert "other" in results["step_time_ms"]  # steps overlapping no exchange work
  steps = [v.step for v in exchange.list_versions(exchange_dir, 0)]
  assert steps and steps[0] == 30  # the final step is always published


def test_the_exchange_config_carries_the_trainers_settings_and_none_without_codistillation():
  config = train_config.TrainConfig(
      data=inputs.Data(train_files=["x"], eval_files=["y"]), exchange=functools.partial(
          exchange_config.Exchange, publish_every_steps=7, keep_last=3, teacher_graph="ring"))
  group = trainer.GroupTrainer(config, "/tmp/unused", group=1, num_groups=3,
                               exchange_dir="/tmp/exchange")
  exchange = group.exchange_config()
  assert (exchange.directory, exchange.group, exchange.num_groups) == ("/tmp/exchange", 1, 3)
  assert exchange.publish_every_steps == 7 and exchange.keep_last == 3
  assert exchange.peer_groups() == [0] and group.distills  # the ring's predecessor
  alone = trainer.GroupTrainer(dataclasses.replace(config, exchange=None), "/tmp/unused")
  assert alone.exchange_config() is None and not alone.distills
  with pytest.raises(train_config.ConfigurationError, match="needs --exchange_dir"):
    trainer.GroupTrainer(config, "/tmp/unused", group=0, num_groups=2)


def test_a_bound_raw_parser_exports_serving_raw_and_a_mismatched_one_stops_before_training(
    tmp_path, criteo_dir):
  settings = dict(
      model_fn=functools.partial(ctr.ctr_model, num_buckets=1000, embedding_dim=4,
                                 hidden_units=(16,)),
      train_steps=10, steps_per_epoch=10, eval_steps=1,
      checkpoints=checkpointing.Checkpoints(every_steps=10), verbose=0)
  model_dir = str(tmp_path / "run")
  trainer.train(model_dir, data=_data(criteo_dir, 32, raw_parser=criteo.raw_parser(1000)),
                **settings)
  loaded = tf.saved_model.load(layout.RunDir(model_dir).export)
  eval_file = criteo.resolve_files(f"{criteo_dir}/eval-*")[0]
  with open(eval_file) as f:
    lines = [next(f).rstrip("\n") for _ in range(16)]
  features = next(iter(criteo.make_dataset(eval_file, 16, num_buckets=1000)))[0]
  np.testing.assert_allclose(
      loaded.signatures[serving.RAW_SIGNATURE_KEY](lines=tf.constant(lines))["probabilities"],
      tf.sigmoid(loaded.signatures[exchange.SIGNATURE_KEY](**features)["logits"]), rtol=1e-6)

  other_dir = str(tmp_path / "other")
  with pytest.raises(ConfigurationError, match="tfc.Data.raw_parser differs"):
    trainer.train(other_dir, data=_data(criteo_dir, 32, raw_parser=criteo.raw_parser(999)),
                  **settings)
  assert not os.path.exists(layout.RunDir(other_dir).export)
