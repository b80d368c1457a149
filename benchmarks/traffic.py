"""Bytes on the wire: what a synchronous group's all-reduce sends per step, as TF's ring
collectives (CPU) send it, against what a codistillation group publishes per step.

Used by the ``comm`` benchmark to report ``codistill_traffic_reduction``; the reduced-precision
all-reduce itself is ``tf_codistill.optim.comm.GradientReducer``.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tf_codistill.exchange import directory as exchange
from tf_codistill.optim import fusion


@dataclasses.dataclass(frozen=True)
class GradientInfo:
  """One variable's gradient as the all-reduce sees it."""
  name: str
  elements: int  # dense: all elements; sparse: rows * row size
  sparse_rows: Optional[int] = None  # IndexedSlices rows (with duplicates), None if dense
  index_bytes: int = 8

  @property
  def sparse(self) -> bool:
    return self.sparse_rows is not None


def gradient_infos(model: keras.Model, inputs) -> List[GradientInfo]:
  """The gradients of ``model``'s trainable variables for a batch like ``inputs`` (static
  shapes), found by tracing the backward pass (``fusion.probe_gradients``)."""
  infos = []
  for var, spec in zip(model.trainable_variables, fusion.probe_gradients(model, inputs)):
    if spec is None:
      infos.append(GradientInfo(var.name, int(np.prod(var.shape))))
    else:
      rows = spec.shape[0]
      if rows is None:
        raise ValueError(f"{var.name}: the batch size must be static to count its rows")
      infos.append(GradientInfo(var.name, int(rows * np.prod(spec.shape[1:])), int(rows)))
  return infos


def allreduce_bytes(infos: Sequence[GradientInfo], workers: int, dtype: str = "float32",
                    bytes_per_pack: int = 0) -> Dict[str, float]:
  """Bytes one worker sends per step to sum ``infos`` over ``workers`` replicas, and the number
  of collective operations, as TF's ring collectives (CPU) do it.

  Dense: one ring all-reduce per pack, 2(n-1)/n x the bytes (bfloat16: an all-gather, (n-1) x).
  IndexedSlices: all-gathers of the row count, the values and the indices, (n-1) x each.
  float16 adds the all-gather of one float32 maximum per gradient.
  """
  n = workers
  item = 4 if dtype == "float32" else 2
  dense = [g for g in infos if not g.sparse]
  sparse = [g for g in infos if g.sparse]
  dense_bytes = sum(g.elements for g in dense) * item
  ring = (n - 1) if dtype == "bfloat16" else 2 * (n - 1) / n
  size = packs = 0
  for g in reversed(dense):
    if packs == 0 or (bytes_per_pack and size > bytes_per_pack):
      packs += 1
      size = 0
    size += g.elements * item
  sparse_bytes = sum(g.elements * item + g.sparse_rows * g.index_bytes + 4 for g in sparse)
  extra = 4 * len(infos) * (n - 1) if dtype == "float16" else 0
  sent = ring * dense_bytes + (n - 1) * sparse_bytes + extra
  return {"bytes_per_step": float(sent), "dense_bytes": float(dense_bytes),
          "sparse_bytes": float(sparse_bytes), "collectives": packs + 3 * len(sparse)
          + (1 if dtype == "float16" else 0)}


def dense_allreduce_bytes(model: keras.Model, workers: int) -> float:
  """Bytes a worker would send per step in a float32 ring all-reduce of the *dense* gradient
  of every trainable variable (embedding tables included): 2(n-1)/n x the model's size."""
  elements = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
  return 2 * (workers - 1) / workers * 4 * elements


def saved_model_bytes(path: str) -> int:
  """Total size of the files of a SavedModel directory."""
  total = 0
  for root, _, files in tf.io.gfile.walk(path):
    for name in files:
      total += tf.io.gfile.stat(os.path.join(root, name)).length
  return total


def codistill_bytes(model: keras.Model, input_spec, publish_every_steps: int) -> Dict[str, float]:
  """What a codistillation group publishes per step: its SavedModel (as published to the
  exchange directory) once every ``publish_every_steps`` steps."""
  with tempfile.TemporaryDirectory() as tmp:
    exchange.save_model(model, os.path.join(tmp, "model"), input_spec)
    size = saved_model_bytes(os.path.join(tmp, "model"))
  return {"saved_model_bytes": float(size), "publish_every_steps": publish_every_steps,
          "bytes_per_step": size / publish_every_steps}
