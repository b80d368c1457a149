"""What a group leaves behind: ``results.json``'s contents, the weights' digest, prediction
files, and the message of a run stopped by a NaN/Inf loss."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tf_codistill import layout
from tf_codistill.exchange import config as exchange_config
from tf_codistill.exchange import directory as exchange_dir_lib
from tf_codistill.training import checkpointing
from tf_codistill.training import codistill_hooks
from tf_codistill.training import strategies
from tf_codistill.training import tasks as tasks_lib
from tf_codistill.training.train_config import TrainConfig

SKIPPED_LINES_TAG = "data/skipped_lines"


def group_results(config: TrainConfig, *, group: int, num_groups: int,
                  info: strategies.TaskInfo, task: tasks_lib.Task,
                  exchange: Optional[exchange_config.Exchange], steps: int,
                  final: Dict[str, float], history: keras.callbacks.History,
                  examples_per_sec: Sequence[float], trainable_bytes: Optional[int] = None,
                  **extra: Any) -> Dict[str, Any]:
  """The contents of ``results.json`` without the exchange's part (``exchange_results``)."""
  distills = exchange is not None and exchange.distill
  averaging = None if exchange is None else exchange.averaging
  teachers = config.teachers
  return {
      "group": group, "num_groups": num_groups, "strategy": config.shape.strategy,
      "num_workers": info.num_workers, "codistill": distills,
      "averaging": None if averaging is None else dataclasses.asdict(averaging),
      "steps": steps, **task.results(final),
      "teacher_graph": None if exchange is None else exchange.teacher_graph,
      "teacher_groups": exchange.peer_groups() if distills else [],
      "teacher_precision": teachers.precision,
      "teacher_factory": teachers.factory_name,
      "examples_per_sec": float(np.median(examples_per_sec)) if examples_per_sec else None,
      "trainable_parameter_bytes": trainable_bytes,
      "history": {k: [float(v) for v in vals] for k, vals in history.history.items()},
      "tensorflow": tf.__version__, "tf_keras": keras.__version__,
      **extra,
  }


def exchange_results(hooks: codistill_hooks.ExchangeHooks, teacher_steps: Sequence[int],
                     final_teacher_staleness: float,
                     step_time_ms: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """What the exchange did: publishes, teacher loads, their windows' step times."""
  return {**hooks.statistics(), "teacher_steps": [int(s) for s in teacher_steps],
          "final_teacher_staleness": float(final_teacher_staleness),
          # Step times of steps overlapping a refresh, a publish, an epoch end, or nothing.
          "step_time_ms": step_time_ms}


def windows(hooks: Optional[codistill_hooks.ExchangeHooks]
            ) -> Dict[str, Sequence[Tuple[float, float]]]:
  """The exchange hooks' windows (refreshes, publishes, the first teachers' wait), if any."""
  return {} if hooks is None else hooks.windows()


def consumed(batch_size: int, data_split: str, step: int,
             evaluation: tf.data.Dataset) -> Dict[str, Any]:
  """How much training data the group read: examples, and prediction targets (an LM's tokens)."""
  dims = evaluation.element_spec[1].shape[1:]
  per_example = int(np.prod(dims)) if dims.is_fully_defined() else None
  examples = step * batch_size
  return {"batch_size": batch_size, "data_split": data_split, "train_examples": examples,
          "train_targets": None if per_example is None else examples * per_example}


def save_npz(path: str, **arrays: np.ndarray) -> None:
  """Writes arrays as .npz atomically through tf.io.gfile."""
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  exchange_dir_lib.write_atomically(path, buffer.getvalue())


def weights_digest(model: keras.Model) -> str:
  """SHA-256 of all weight values: equal on every replica of a synchronous group."""
  digest = hashlib.sha256()
  for value in model.get_weights():
    digest.update(np.ascontiguousarray(value).tobytes())
  return digest.hexdigest()


def non_finite_message(reason: str, model_dir: str, exchange_dir: Optional[str], group: int,
                       strategy: str, publishes: bool) -> str:
  """What stopped, and what was kept: the newest checkpoint and published version."""
  run = layout.RunDir(model_dir)
  if strategy == "parameter_server":
    checkpoint = tf.train.latest_checkpoint(run.checkpoints)
  else:
    checkpoint = tf.train.latest_checkpoint(os.path.join(run.backup, "chief"))
  kept = ["no checkpoint"]
  if checkpoint:
    kept = [f"last checkpoint {checkpoint} (step {checkpointing.checkpoint_step(checkpoint)}; a "
            "restart resumes from it)"]
  if publishes and exchange_dir:
    versions = exchange_dir_lib.list_versions(exchange_dir, group)
    kept.append(f"last published version {versions[0].path if versions else 'none'}")
  return (f"training stopped: {reason}; nothing of this step or later was checkpointed or "
          f"published; kept: {', '.join(kept)}. Lower trainer.train.learning_rate or check the "
          "input data")
