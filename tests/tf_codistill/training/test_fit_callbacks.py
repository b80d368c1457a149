"""fit's callbacks per strategy: the guard before anything that saves, the step limit last,
the chief's monitoring only on the chief."""

import dataclasses
import functools
import json

import pytest
import tensorflow as tf

from data_pipelines import criteo
from tf_codistill import step_hooks
from tf_codistill.models import ctr
from tf_codistill.training import checkpointing
from tf_codistill.training import fit_callbacks
from tf_codistill.training import group as group_lib
from tf_codistill.training import inputs
from tf_codistill.training import monitoring
from tf_codistill.training import step_timing
from tf_codistill.training import strategies
from tf_codistill.training import train_config
from tf_codistill.training import trainer

CHIEF = strategies.TaskInfo("one_device", None, 0, 1, 0)
PS_CHIEF = strategies.TaskInfo("parameter_server", "chief", 0, 1, 1)
MWM_WORKER = strategies.TaskInfo("multi_worker_mirrored", "worker", 1, 2, 0)


@pytest.fixture(scope="module")
def built(criteo_dir, tmp_path_factory):
  config = train_config.TrainConfig(
      data=inputs.Data(train_files=[f"{criteo_dir}/train-*"], eval_files=[f"{criteo_dir}/eval-*"],
                       dataset_fn=functools.partial(criteo.make_dataset, num_buckets=100),
                       batch_size=16),
      model_fn=functools.partial(ctr.ctr_model, num_buckets=100, embedding_dim=2,
                                 hidden_units=(4,)),
      train_steps=40, steps_per_epoch=20)
  group = trainer.GroupTrainer(config, str(tmp_path_factory.mktemp("run")))
  data = group.build_data()
  model, local = group.build_model(tf.distribute.get_strategy(), data)
  return config, group, model, local, data


def _build(built, info, **settings):
  config, group, model, local, data = built
  where = fit_callbacks.GroupTask(0, group.run_dir, info, group.task)
  return fit_callbacks.build(dataclasses.replace(config, **settings), where, model, local, data)


def _kinds(objects):
  return [type(o) for o in objects]


def test_synchronous_chief_guards_first_backs_up_after_evaluating_and_limits_steps_last(built):
  callbacks = _build(built, CHIEF, checkpoints=checkpointing.Checkpoints(every_steps=40))
  kinds = _kinds(callbacks.fit)
  assert kinds[0] is step_hooks.NonFiniteGuard
  # The configuration's alpha and rate, not a restored checkpoint's, once it is restored.
  assert kinds[-3:] == [checkpointing.StepBackup, checkpointing.ConfiguredValues,
                        step_hooks.StepLimit]
  assert callbacks.fit[-3].every_steps == 40
  # A checkpoint at an epoch's end comes after its evaluation and progress line.
  assert kinds.index(monitoring.LocalEvaluation) < kinds.index(checkpointing.StepBackup)
  assert kinds.index(monitoring.ProgressLog) < kinds.index(checkpointing.StepBackup)
  assert callbacks.progress is callbacks.fit[kinds.index(monitoring.ProgressLog)]
  assert _kinds(callbacks.hooks) == [monitoring.Heartbeat, monitoring.StepSummaries,
                                     step_timing.StepTimer]
  assert callbacks.summary_writer is not None and callbacks.initial_epoch == 0


def test_parameter_server_chief_runs_the_guard_first_in_the_polling_thread(built):
  callbacks = _build(built, PS_CHIEF, shape=group_lib.Group("parameter_server", 1, 1),
                     checkpoints=checkpointing.Checkpoints(max_to_keep=3))
  assert _kinds(callbacks.hooks)[0] is step_hooks.NonFiniteGuard
  kinds = _kinds(callbacks.fit)
  assert kinds[-3:] == [checkpointing.EpochCheckpoint, checkpointing.ConfiguredValues,
                        step_hooks.StepLimit]
  assert step_hooks.NonFiniteGuard not in kinds
  assert callbacks.fit[-3].max_to_keep == 3
  assert step_timing.ClosureTimer in kinds
  assert isinstance(callbacks.step_timer, step_timing.ClosureTimer)


def test_a_worker_that_is_not_the_chief_only_guards_backs_up_and_counts(built):
  callbacks = _build(built, MWM_WORKER, shape=group_lib.Group("multi_worker_mirrored", 1))
  assert _kinds(callbacks.fit) == [step_hooks.NonFiniteGuard, checkpointing.StepBackup,
                                   checkpointing.ConfiguredValues, step_hooks.StepLimit]
  assert callbacks.hooks == [] and callbacks.summary_writer is None


def test_optional_callbacks_come_with_their_settings(built):
  callbacks = _build(built, CHIEF, max_wall_seconds=30.0, save_eval_predictions=True,
                     prediction_history=True)
  assert step_hooks.WallClockLimit in _kinds(callbacks.hooks)
  assert monitoring.PredictionHistory in _kinds(callbacks.fit)


def test_the_chiefs_evaluation_pulses_its_heartbeat_between_steps(built):
  # An evaluation (or the run's export) longer than --stall_timeout_s is progress, not a hang:
  # each batch evaluated changes heartbeat.json, which the launcher's watchdog reads.
  callbacks = _build(built, CHIEF)
  heartbeat = callbacks.heartbeat
  assert callbacks.evaluation.pulse == heartbeat.pulse
  heartbeat.every_seconds = 0.0
  heartbeat.on_begin(None, 7)
  marks = []
  for phase in ("evaluating", "evaluating", "exporting"):
    callbacks.pulse(phase)
    with open(heartbeat.path) as f:
      record = json.load(f)
    marks.append((record["step"], record["phase"], record["beats"]))
  assert marks == [(7, "evaluating", 1), (7, "evaluating", 2), (7, "exporting", 3)]
  callbacks.evaluation.set_model(built[2])
  callbacks.evaluation.evaluate()  # a pulse per batch evaluated
  with open(heartbeat.path) as f:
    assert json.load(f)["beats"] > 3


def test_a_new_phase_is_written_at_once_and_pulses_within_one_are_spaced(tmp_path):
  # The export follows the evaluation's pulses at once: its own must reach the launcher, which
  # counts the export's time from it.
  heartbeat = monitoring.Heartbeat(str(tmp_path / "heartbeat.json"), every_seconds=1000.0)
  heartbeat.on_begin(None, 5)

  def written():
    with open(heartbeat.path) as f:
      record = json.load(f)
    return record["phase"], record["beats"]
  heartbeat.pulse("evaluating")
  assert written() == ("evaluating", 1)
  heartbeat.pulse("evaluating")
  assert written() == ("evaluating", 1)  # within every_seconds: not written again
  heartbeat.pulse("exporting")
  assert written() == ("exporting", 3)

