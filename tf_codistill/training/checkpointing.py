"""When a group checkpoints (``tfc.Checkpoints``), and the checkpoints of parameter-server
groups (tf_keras' BackupAndRestore covers the others)."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Optional

import gin
import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from tf_codistill import errors
from tf_codistill import layout
from tf_codistill.optim import fused_models
from tf_codistill.step_hooks import current_step
from tf_codistill.step_hooks import non_finite_losses


@gin.configurable(module="tfc")
@dataclasses.dataclass(frozen=True)
class Checkpoints:
  """When a group checkpoints (``tfc.Checkpoints.<field>``): single-process and synchronous
  groups every ``every_steps`` steps (tf_keras' BackupAndRestore, one kept), parameter-server
  groups at every epoch's end (``EpochCheckpoint``, the newest ``max_to_keep`` kept). A
  restarted group resumes from its newest checkpoint, and with ``resume_input`` its input too:
  it skips the batches the checkpoint's steps read, so a stopped one-process or synchronous
  group without dropout goes on exactly as if it had not stopped (dropout's random state is not
  checkpointed). Under parameter servers, whose steps go to whichever worker is free, each
  worker skips an even share (a batch may be read twice or left out), and a worker restarted
  alone reads on from where its pipeline began. A finished run keeps its last checkpoint: started
  again in the same model directory it resumes at its end (trains nothing, evaluates and exports
  again); train again in a new one. A resumed run takes the configured ``tfc.Distillation.alpha``
  and float learning rate, not the checkpoint's (``ConfiguredValues``). Checked when made."""
  every_steps: int = 500
  max_to_keep: int = 2
  resume_input: bool = True

  def __post_init__(self):
    for name in ("every_steps", "max_to_keep"):
      if getattr(self, name) < 1:
        raise errors.ConfigurationError(
            f"tfc.Checkpoints.{name}={getattr(self, name)} must be >= 1")


class EpochCheckpoint(keras.callbacks.Callback):
  """Checkpoints model and optimizer at every epoch end, ``max_to_keep`` kept, in
  ``tf.train.CheckpointManager``'s layout (``ckpt-<step>`` and its ``checkpoint`` state file).

  For parameter-server groups, where tf_keras' BackupAndRestore is not supported: call
  ``restore()`` before ``fit`` and pass ``initial_epoch=restored_step // steps_per_epoch``.
  Saves are epoch-aligned, so a restart loses at most one epoch.

  Every save runs one traced ``tf.function``: saved eagerly (``CheckpointManager.save``), TF
  traces a new function at every save of variables spread over several tasks (the parameter
  servers' variables and the coordinator's object graph), and each parameter server keeps every
  function it is sent, for good: about 0.5 MiB of ps memory per save, without end.
  """

  def __init__(self, directory: str, model: keras.Model, max_to_keep: int = 2,
               before_save: Optional[Callable[[], None]] = None):
    super().__init__()
    self.before_save = before_save  # e.g. flush pending fused optimizer updates
    self.directory = directory
    self.max_to_keep = max_to_keep
    self.checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    self.manager = tf.train.CheckpointManager(self.checkpoint, directory,
                                              max_to_keep=max_to_keep)
    # The variable count is an argument so that variables created later (optimizer slots) are
    # saved too: a new count traces once more.
    self._write = tf.function(lambda prefix, num_variables: self.checkpoint.write(prefix),
                              autograph=False)

  def restore(self) -> int:
    """Restores the newest checkpoint if there is one; returns the optimizer step."""
    newest_step(self.directory)  # refuses checkpoint files it cannot resume from
    path = self.manager.restore_or_initialize()
    step = current_step(self.manager.checkpoint.model)
    if path:
      logging.info("resumed from checkpoint %s at step %d", path, step)
    return step

  def save(self, step: int) -> str:
    """Writes ``ckpt-<step>``, then records it as the newest and deletes the oldest beyond
    ``max_to_keep`` (the state file is replaced atomically, after the checkpoint is complete)."""
    tf.io.gfile.makedirs(self.directory)
    prefix = os.path.join(self.directory, f"ckpt-{step}")
    model = self.manager.checkpoint.model
    self._write(tf.constant(prefix),
                len(model.variables) + len(model.optimizer.variables()))
    kept = [p for p in self.manager.checkpoints
            if p != prefix and tf.io.gfile.exists(f"{p}.index")] + [prefix]  # gone ones dropped
    # Written times, which CheckpointManager needs to list them again.
    times = [tf.io.gfile.stat(f"{p}.index").mtime_nsec / 1e9 for p in kept[-self.max_to_keep:]]
    # TF writes the names relative to the directory: a relative --model_dir, or a run directory
    # moved elsewhere, still finds them.
    tf.compat.v1.train.update_checkpoint_state(
        self.directory, prefix, all_model_checkpoint_paths=kept[-self.max_to_keep:],
        all_model_checkpoint_timestamps=times, last_preserved_timestamp=min(times) - 1)
    for old in kept[:-self.max_to_keep]:
      for path in tf.io.gfile.glob(f"{old}.*"):
        tf.io.gfile.remove(path)
    # A manager made now reads the state file: what restore() and the next save see.
    self.manager = tf.train.CheckpointManager(self.checkpoint, self.directory,
                                              max_to_keep=self.max_to_keep)
    return prefix

  def on_epoch_end(self, epoch, logs=None):
    bad = non_finite_losses(logs)
    if bad:
      logging.error("not checkpointing step %d: non-finite %s; the previous checkpoint is kept",
                    current_step(self.model), bad)
      return
    if self.before_save is not None:
      self.before_save()
    self.save(current_step(self.model))


class StepBackup(fused_models.BackupAndRestore):
  """tf_keras' BackupAndRestore (single-process and synchronous groups) made to resume a run
  exactly, every ``every_steps`` optimizer steps:

  * a backup due at an epoch's last step is written at the epoch's end, after the callbacks
    placed before it (evaluation, progress log), so a run stopped during an evaluation resumes
    before it and evaluates again instead of losing that point of its curve;
  * it records an execution's last step (tf_keras records its first, so with
    ``steps_per_execution`` > 1 a resumed run would take steps again), and counts steps, not
    executions;
  * the backup outlives ``fit``, as parameter-server groups' checkpoints do: a run stopped while
    it finishes (or a group of a job whose other groups were stopped) resumes at its end,
    evaluating and exporting again, instead of training from the start;
  * the run's last step (``total_steps``, where ``StepLimit`` ends ``fit``, perhaps mid-epoch) is
    backed up at that epoch's end as the epoch's end, so a run started again trains no step.
  """

  def __init__(self, backup_dir: str, flush: Callable[[], None], every_steps: int,
               total_steps: Optional[int] = None):
    super().__init__(backup_dir, flush, save_freq=every_steps, delete_checkpoint=False)
    self.every_steps = every_steps
    self.total_steps = total_steps
    self._saved_step = 0
    self._due = False

  def on_train_begin(self, logs=None):
    super().on_train_begin(logs)  # restores the newest backup
    self._saved_step = current_step(self.model)

  def on_train_batch_end(self, batch, logs=None):
    self._training_state._ckpt_saved_batch.assign(batch)
    self._training_state.backup_if_preempted()
    step = current_step(self.model)
    if self.total_steps is not None and step >= self.total_steps:
      # tf_keras resumes after a backup of an epoch's last batch at the next epoch: past the end.
      self._training_state._ckpt_saved_batch.assign(self.params["steps"] - 1)
      self._saved_step, self._due = step, True
      return
    if step // self.every_steps > self._saved_step // self.every_steps:
      self._saved_step = step
      if batch + 1 >= self.params.get("steps", batch + 2):
        self._due = True  # the epoch's last step: written at its end
      else:
        self._backup(epoch=self._current_epoch, batch=batch)

  def on_epoch_end(self, epoch, logs=None):
    if self._due:
      self._due = False
      self._backup(epoch=epoch)


class ConfiguredValues(keras.callbacks.Callback):
  """After a checkpoint's restore (the callback before it): the configuration's alpha and
  learning rate, not the checkpoint's. A run resumed with ``tfc.Distillation.alpha`` or a float
  ``trainer.train.learning_rate`` changed takes the new value, and says so."""

  def __init__(self, alpha: float, learning_rate):
    super().__init__()
    self.alpha = alpha
    self.learning_rate = learning_rate

  def on_train_begin(self, logs=None):
    settings = [("tfc.Distillation.alpha", getattr(self.model, "alpha", None), self.alpha)]
    if isinstance(self.learning_rate, (int, float)):
      settings.append(("trainer.train.learning_rate",
                       getattr(self.model.optimizer, "learning_rate", None), self.learning_rate))
    for name, variable, value in settings:
      if not isinstance(variable, tf.Variable):
        continue
      restored = float(variable.numpy())
      if not np.isclose(restored, value, rtol=1e-6, atol=0.0):
        logging.warning("%s=%.7g, not the checkpoint's %.7g: the configured value is used", name,
                        value, restored)
        variable.assign(value)


def newest_step(directory: str) -> int:
  """The optimizer step of the newest checkpoint in ``directory`` (0 if there is none).

  Raises:
    ConfigurationError: ``directory`` holds checkpoint files but no readable newest one (a
      missing or damaged ``checkpoint`` state file, its ``.index`` gone or truncated): the run
      would silently start over and overwrite its curve.
  """
  path = _latest_checkpoint(directory)
  if path is None:
    check_no_lost_checkpoints(directory)
    return 0
  try:
    return checkpoint_step(path) or 0
  except (tf.errors.OpError, ValueError) as e:
    raise errors.ConfigurationError(
        f"{path}: the newest checkpoint cannot be read ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else ''}); {_KEEP_OR_MOVE.format(directory)}") from e


def _latest_checkpoint(directory: str, reads: int = 3, pause_s: float = 0.2) -> Optional[str]:
  """``tf.train.latest_checkpoint``, read again while it is None but a state file is there: a run
  saving meanwhile names its new checkpoint in the state file before it deletes the old one, so a
  read of the old name that finds its ``.index`` gone is a save under way, not damage."""
  for attempt in range(reads):
    path = tf.train.latest_checkpoint(directory)
    if path is not None or not tf.io.gfile.exists(os.path.join(directory, "checkpoint")):
      return path
    if attempt + 1 < reads:
      time.sleep(pause_s)
  return None


_KEEP_OR_MOVE = ("nothing was trained: restore the checkpoint's files to resume, or move {} "
                 "away to start over")


def check_no_lost_checkpoints(directory: str) -> None:
  """ConfigurationError if ``directory``'s ``checkpoint`` state file (written once a checkpoint
  is complete) is there although TF finds no newest checkpoint (``tf.train.latest_checkpoint``
  is None): the file is damaged or its checkpoint's ``.index`` is gone. Checkpoint files with no
  state file are a first save cut short: the run starts over."""
  if not tf.io.gfile.exists(os.path.join(directory, "checkpoint")):
    leftovers = tf.io.gfile.glob(os.path.join(directory, "ckpt-*"))
    if leftovers:
      logging.warning("%s: %d file(s) of a first checkpoint never completed: starting over",
                      directory, len(leftovers))
    return
  found = sorted(os.path.basename(p) for p in tf.io.gfile.glob(os.path.join(directory, "ckpt-*")))
  raise errors.ConfigurationError(
      f"{directory}: its 'checkpoint' state file names no readable checkpoint (the file is "
      f"damaged, or the .index of the checkpoint it names is gone; checkpoint files here: "
      f"{', '.join(found[:4]) or 'none'}{', ...' if len(found) > 4 else ''}): resuming would "
      f"start over and overwrite the run's progress; {_KEEP_OR_MOVE.format(directory)}")


def backup_checkpoints(backup_dir: str) -> str:
  """Where tf_keras' BackupAndRestore(``backup_dir``) keeps the checkpoints it restores."""
  return os.path.join(backup_dir, "chief")


def resume_step(model_dir: str) -> int:
  """The step a group's run in ``model_dir`` resumes from if started again (0: it starts over),
  from its newest checkpoint (BackupAndRestore's, or a parameter-server group's own)."""
  run = layout.RunDir(model_dir)
  return max(newest_step(backup_checkpoints(run.backup)), newest_step(run.checkpoints))


def checkpoint_step(path: str) -> Optional[int]:
  """The optimizer step a checkpoint (BackupAndRestore's or EpochCheckpoint's) was taken at."""
  reader = tf.train.load_checkpoint(path)
  for key in sorted(reader.get_variable_to_shape_map()):
    if key.endswith("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"):
      return int(reader.get_tensor(key))
  return None
