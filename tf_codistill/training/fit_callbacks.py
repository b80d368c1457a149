"""What a group's ``fit`` runs besides the exchange: checkpoints, evaluation, monitoring, the
NaN guard and the exact step limit, each placed where its strategy needs it."""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple, Union

import tensorflow as tf
import tf_keras as keras

from tf_codistill import layout
from tf_codistill import step_hooks
from tf_codistill.exchange import publishing
from tf_codistill.training import checkpointing
from tf_codistill.training import monitoring
from tf_codistill.training import results as results_lib
from tf_codistill.training import step_timing
from tf_codistill.training import strategies
from tf_codistill.training import tasks as tasks_lib
from tf_codistill.training.inputs import GroupData
from tf_codistill.training.model import CodistillModel
from tf_codistill.training.train_config import TrainConfig


@dataclasses.dataclass
class FitCallbacks:
  """What ``fit`` runs, and the parts of it the results are read from."""
  fit: List[keras.callbacks.Callback]
  evaluation: monitoring.LocalEvaluation
  hooks: List[step_hooks.StepHook] = dataclasses.field(default_factory=list)  # run by fit
  initial_epoch: int = 0
  resume_step: int = 0  # the step of the checkpoint this run resumes from (0: a fresh start)
  progress: Optional[monitoring.ProgressLog] = None
  summary_writer: Optional[tf.summary.SummaryWriter] = None
  step_summaries: Optional[monitoring.StepSummaries] = None
  step_timer: Optional[Union[step_timing.StepTimer, step_timing.ClosureTimer]] = None
  heartbeat: Optional[monitoring.Heartbeat] = None  # the chief's

  def pulse(self, phase: str) -> None:
    """Progress between steps for the launcher's stall watchdog (no heartbeat: a worker)."""
    if self.heartbeat is not None:
      self.heartbeat.pulse(phase)


@dataclasses.dataclass(frozen=True)
class GroupTask:
  """Which group this process trains, and its place in the group's cluster."""
  group: int
  run_dir: layout.RunDir
  info: strategies.TaskInfo
  task: tasks_lib.Task


def build(config: TrainConfig, where: GroupTask, model: CodistillModel,
          local: publishing.LocalCopy, data: GroupData) -> FitCallbacks:
  """The callbacks and step hooks of ``fit``: the chief's monitoring, checkpoints (a
  parameter-server group's own, BackupAndRestore otherwise), the guard, the step limit."""
  evaluation = monitoring.LocalEvaluation(local, data.evaluation, where.task.task_loss(),
                                          where.task.metrics, config.eval_steps)
  callbacks = FitCallbacks(fit=[], evaluation=evaluation)
  parameter_server = config.shape.asynchronous
  checkpoints: keras.callbacks.Callback
  if parameter_server:
    checkpoints = checkpointing.EpochCheckpoint(
        where.run_dir.checkpoints, model, max_to_keep=config.checkpoints.max_to_keep,
        before_save=model.flush_fusion)
    callbacks.resume_step = checkpoints.restore()
    # A checkpoint of the run's last step (its last epoch may be cut short) leaves nothing to
    # train; one taken mid-epoch (a stop on max_wall_seconds) resumes in that epoch.
    callbacks.initial_epoch = (config.epochs if callbacks.resume_step >= config.train_steps
                               else callbacks.resume_step // config.steps_per_epoch)
  else:  # fit restores it
    checkpoints = checkpointing.StepBackup(where.run_dir.backup, model.flush_fusion,
                                           config.checkpoints.every_steps, config.train_steps)
    callbacks.resume_step = checkpointing.newest_step(
        checkpointing.backup_checkpoints(where.run_dir.backup))
  hooks: List[step_hooks.StepHook] = []
  epoch_callbacks: List[keras.callbacks.Callback] = []
  if where.info.is_chief:
    hooks, epoch_callbacks = _chief_callbacks(config, where, local, data, callbacks)
  # After the evaluation and the progress log: a checkpoint at an epoch's end exists only once
  # that epoch's evaluation does, so a resumed run's curve has every point.
  epoch_callbacks += [checkpoints, checkpointing.ConfiguredValues(config.distillation.alpha,
                                                                   config.learning_rate)]
  guard = step_hooks.NonFiniteGuard()
  if parameter_server:
    # The guard runs first in fit's polling thread; it makes the driver stop training.
    callbacks.hooks = [guard] + hooks
    callbacks.fit = epoch_callbacks
  else:
    # The guard comes first: a NaN step is never checkpointed (BackupAndRestore) or published.
    callbacks.hooks = hooks
    callbacks.fit = [guard] + epoch_callbacks
  callbacks.fit.append(step_hooks.StepLimit(
      config.train_steps, config.steps_per_epoch,
      callbacks.resume_step % config.steps_per_epoch if parameter_server else 0))
  return callbacks


def _chief_callbacks(config: TrainConfig, where: GroupTask, local: publishing.LocalCopy,
                     data: GroupData, callbacks: FitCallbacks
                     ) -> Tuple[List[step_hooks.StepHook], List[keras.callbacks.Callback]]:
  """The chief's step hooks (heartbeat, step timing, summaries) and epoch callbacks."""
  run, info = where.run_dir, where.info
  callbacks.summary_writer = tf.summary.create_file_writer(run.step_summaries)
  callbacks.step_summaries = monitoring.StepSummaries(
      callbacks.summary_writer, config.data.batch_size, config.summary_every_steps,
      counters={results_lib.SKIPPED_LINES_TAG: lambda: data.bad_lines.count})
  callbacks.heartbeat = monitoring.Heartbeat(run.heartbeat, config.heartbeat_every_s,
                                             f"{info.task_type or 'chief'}:{info.task_id}")
  callbacks.evaluation.pulse = callbacks.heartbeat.pulse
  hooks: List[step_hooks.StepHook] = [callbacks.heartbeat, callbacks.step_summaries]
  parameter_server = config.shape.asynchronous
  if parameter_server:  # each scheduled step, timed as it finishes (a batch callback)
    callbacks.step_timer = step_timing.ClosureTimer(config.steps_per_execution)
  else:
    callbacks.step_timer = step_timing.StepTimer(config.steps_per_epoch)
    hooks.append(callbacks.step_timer)
  if config.max_wall_seconds is not None:
    hooks.append(step_hooks.WallClockLimit(config.max_wall_seconds))
  callbacks.progress = monitoring.ProgressLog(
      run.progress, where.group, config.train_steps,
      rates=callbacks.step_summaries.examples_per_sec, resume_step=callbacks.resume_step)
  epoch_callbacks: List[keras.callbacks.Callback] = [
      callbacks.evaluation,
      keras.callbacks.TensorBoard(run.tensorboard, update_freq="epoch"),
      callbacks.progress]
  if parameter_server:
    epoch_callbacks.append(callbacks.step_timer)
  if config.save_eval_predictions and config.prediction_history:
    epoch_callbacks.append(monitoring.PredictionHistory(
        local, data.predictions(config.prediction_batches), where.task.output,
        run.prediction_history, results_lib.save_npz))
  return hooks, epoch_callbacks
