"""Checkpoints of parameter-server groups (tf_keras' BackupAndRestore covers the other strategies)."""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf
import tf_keras as keras
from absl import logging

from tf_codistill.step_hooks import current_step, non_finite_losses


class EpochCheckpoint(keras.callbacks.Callback):
  """Checkpoints model and optimizer at every epoch end with a tf.train.CheckpointManager.

  For parameter-server groups, where tf_keras' BackupAndRestore is not supported: call
  ``restore()`` before ``fit`` and pass ``initial_epoch=restored_step // steps_per_epoch``.
  Saves are epoch-aligned, so a restart loses at most one epoch.
  """

  def __init__(self, directory: str, model: keras.Model, max_to_keep: int = 2,
               before_save: Optional[Callable[[], None]] = None):
    super().__init__()
    self.before_save = before_save  # e.g. flush pending fused optimizer updates
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    self.manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=max_to_keep)

  def restore(self) -> int:
    """Restores the newest checkpoint if there is one; returns the optimizer step."""
    path = self.manager.restore_or_initialize()
    step = current_step(self.manager.checkpoint.model)
    if path:
      logging.info("resumed from checkpoint %s at step %d", path, step)
    return step

  def on_epoch_end(self, epoch, logs=None):
    bad = non_finite_losses(logs)
    if bad:
      logging.error("not checkpointing step %d: non-finite %s; the previous checkpoint is kept",
                    current_step(self.model), bad)
      return
    if self.before_save is not None:
      self.before_save()
    self.manager.save(checkpoint_number=current_step(self.model))


def checkpoint_step(path: str) -> Optional[int]:
  """The optimizer step a checkpoint (BackupAndRestore's or EpochCheckpoint's) was taken at."""
  reader = tf.train.load_checkpoint(path)
  for key in sorted(reader.get_variable_to_shape_map()):
    if key.endswith("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"):
      return int(reader.get_tensor(key))
  return None
