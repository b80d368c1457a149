"""What a group leaves behind: results' contents, digests, prediction files, the NaN message."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill import layout
from tf_codistill.exchange import config as exchange_config
from tf_codistill.models import ctr
from tf_codistill.teachers import spec as teacher_spec
from tf_codistill.training import inputs
from tf_codistill.training import results
from tf_codistill.training import strategies
from tf_codistill.training import tasks
from tf_codistill.training import train_config

import testing_utils


def test_group_results_name_the_group_its_teachers_and_its_history():
  config = train_config.TrainConfig(data=inputs.Data(train_files=["x"], eval_files=["y"]),
                                    teachers=teacher_spec.TeacherSpec(precision="bfloat16"))
  group_exchange = exchange_config.Exchange("/tmp/exchange", group=1, num_groups=2)
  history = keras.callbacks.History()
  history.history = {"loss": [np.float32(0.5), np.float32(0.25)]}
  info = strategies.TaskInfo("one_device", None, 0, 1, 0)
  out = results.group_results(config, group=1, num_groups=2, info=info,
                              task=tasks.BinaryTask(), exchange=group_exchange, steps=40,
                              final={"loss": 0.3, "auc": 0.7, "logloss": 0.31}, history=history,
                              examples_per_sec=[10.0, 30.0, 20.0], wall_time_s=1.5)
  assert (out["group"], out["num_groups"], out["steps"], out["teacher_groups"]) == (1, 2, 40, [0])
  assert out["teacher_precision"] == "bfloat16" and out["teacher_factory"] is None
  assert out["codistill"] and out["teacher_graph"] == "all_to_all" and out["averaging"] is None
  with_fn = results.group_results(
      dataclasses.replace(config,
                          teachers=teacher_spec.TeacherSpec(student_factory=ctr.ctr_teacher)),
      group=1, num_groups=2, info=info, task=tasks.BinaryTask(), exchange=None, steps=40,
      final={"loss": 0.3, "auc": 0.7, "logloss": 0.31}, history=history, examples_per_sec=[])
  assert with_fn["teacher_factory"] == "ctr_teacher" and not with_fn["codistill"]
  assert with_fn["teacher_groups"] == [] and with_fn["teacher_graph"] is None
  assert out["examples_per_sec"] == 20.0 and out["wall_time_s"] == 1.5
  assert (out["val_loss"], out["val_auc"]) == (0.3, 0.7)
  assert out["history"] == {"loss": [0.5, 0.25]}
  assert isinstance(out["history"]["loss"][0], float)


def test_consumed_counts_targets_per_example_for_sequence_labels():
  images = tf.data.Dataset.from_tensors((tf.zeros([4, 3]), tf.zeros([4])))
  windows = tf.data.Dataset.from_tensors((tf.zeros([4, 64]), tf.zeros([4, 64], tf.int32)))
  assert results.consumed(4, "same", 10, images)["train_targets"] == 40
  lm = results.consumed(4, "disjoint", 10, windows)
  assert lm == {"batch_size": 4, "data_split": "disjoint", "train_examples": 40,
                "train_targets": 40 * 64}


def test_weights_digest_is_equal_for_equal_weights_only():
  a, b = testing_utils.small_net(seed=0), testing_utils.small_net(seed=0)
  assert results.weights_digest(a) == results.weights_digest(b)
  b.set_weights([w + 1e-6 for w in b.get_weights()])
  assert results.weights_digest(a) != results.weights_digest(b)


def test_save_npz_writes_arrays_that_load_back(tmp_path):
  path = str(tmp_path / "sub" / "predictions.npz")
  tf.io.gfile.makedirs(str(tmp_path / "sub"))
  results.save_npz(path, probs=np.eye(3, dtype=np.float32), labels=np.arange(3))
  with np.load(path) as loaded:
    np.testing.assert_array_equal(loaded["probs"], np.eye(3))
    np.testing.assert_array_equal(loaded["labels"], np.arange(3))
  assert [p.name for p in (tmp_path / "sub").iterdir()] == ["predictions.npz"]  # no temp file


@pytest.mark.parametrize("strategy", ["one_device", "parameter_server"])
def test_the_non_finite_message_says_what_was_kept(tmp_path, strategy):
  model_dir, exchange_dir = str(tmp_path / "run"), str(tmp_path / "exchange")
  message = results.non_finite_message("loss is nan at step 7", model_dir, exchange_dir, 0,
                                       strategy, publishes=True)
  assert message.startswith("training stopped: loss is nan at step 7; nothing of this step")
  assert "kept: no checkpoint, last published version none" in message
  assert "Lower trainer.train.learning_rate" in message


def test_the_non_finite_message_names_the_checkpoint_a_restart_resumes_from(tmp_path):
  model_dir = str(tmp_path / "run")
  model = testing_utils.small_net()
  model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
  model.fit(np.zeros([8, 4]), np.zeros([8, 1]), batch_size=4, epochs=1, verbose=0)  # 2 steps
  saved = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
      os.path.join(layout.RunDir(model_dir).backup, "chief", "ckpt"))
  message = results.non_finite_message("loss is inf", model_dir, None, 0, "one_device",
                                       publishes=False)
  assert f"kept: last checkpoint {saved} (step 2; a restart resumes from it)." in message
