"""What a codistillation group publishes per step with each ``tfc.PublishFormat``, measured on
versions written from a real training run of the CTR model (used by the ``comm`` suite).

Protocol (fixed before the first run): the CTR model at ``gin/criteo/common.gin`` size, Adam
(learning rate 1e-3), a 2-worker group's global batch, generated Criteo-format data, trained in
one process for ``steps`` steps; the weights are snapshotted every ``min(intervals)`` steps. For
each format and exchange interval K, a ``LeanWriter`` (or ``exchange.publish`` for SavedModels)
publishes the snapshots taken every K steps to its own exchange directory, and every version
directory is measured on disk (files and marker: what each reader fetches). A ``LeanReader``
rebuilds every version, so each figure is of versions that were read back. Bytes per step are
amortized over one cycle of ``whole_every`` publishes: (median whole version + (whole_every - 1)
x median delta) / (whole_every x K); a format without deltas is its median version / K.

The error-bounded formats (``row_tolerance`` > 0, added with ``whole_every`` = 100 beside an
exact int8 delta format of the same ``whole_every``, tolerances 0.05 and 0.2 fixed before they
were measured here) are lossy: every version read back is checked against the error bound, and
the staleness suite measures their effect on the loss.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Sequence

import numpy as np
import tf_keras as keras

import tf_codistill as tfc
from benchmarks import models
from benchmarks import traffic
from data_pipelines import criteo
from tf_codistill.exchange import directory as exchange
from tf_codistill.exchange import lean_versions
from tf_codistill.exchange import weight_codecs
from tf_codistill.models import ctr

FORMATS = {
    "saved_model": tfc.PublishFormat(),
    "float32": tfc.PublishFormat("float32"),
    "bfloat16": tfc.PublishFormat("bfloat16"),
    "int8": tfc.PublishFormat("int8"),
    "float32_deltas": tfc.PublishFormat("float32", row_deltas=True),
    "bfloat16_deltas": tfc.PublishFormat("bfloat16", row_deltas=True),
    "int8_deltas": tfc.PublishFormat("int8", row_deltas=True),
    "int8_deltas_w100": tfc.PublishFormat("int8", row_deltas=True, whole_every=100),
    "int8_tolerant05_w100": tfc.PublishFormat("int8", row_deltas=True, whole_every=100,
                                              row_tolerance=0.05),
    "int8_tolerant20_w100": tfc.PublishFormat("int8", row_deltas=True, whole_every=100,
                                              row_tolerance=0.2),
}


class _Snapshots(keras.callbacks.Callback):
  """Keeps the model's weights every ``every`` steps (in memory, off the clock of nothing)."""

  def __init__(self, every: int):
    super().__init__()
    self.every = every
    self.taken: Dict[int, List[np.ndarray]] = {}

  def on_train_batch_end(self, batch, logs=None):
    step = batch + 1
    if step % self.every == 0:
      self.taken[step] = self.model.get_weights()


def train_snapshots(data_dir: str, steps: int, batch: int, every: int, num_buckets: int
                    ) -> tuple[keras.Model, Dict[int, List[np.ndarray]], float]:
  """Trains the CTR model for ``steps`` steps of ``batch``; (model, snapshots by step, final
  loss)."""
  model = ctr.ctr_model(num_buckets=num_buckets, embedding_dim=16, hidden_units=(256, 128), seed=1)
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  data = criteo.make_dataset(os.path.join(data_dir, "train-*"), batch, num_buckets=num_buckets,
                             repeat=True, shuffle_buffer=10_000, seed=0)
  snapshots = _Snapshots(every)
  history = model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[snapshots], verbose=0)
  return model, snapshots.taken, float(history.history["loss"][-1])


def _publish_all(model: keras.Model, fmt: tfc.PublishFormat, steps: Sequence[int],
                 snapshots: Dict[int, List[np.ndarray]], exchange_dir: str) -> dict:
  """Publishes the snapshots of ``steps`` in ``fmt``; sizes of whole and delta versions, and
  the seconds to write and to read back each."""
  signature = exchange.expected_signature(models.CTR_SPEC, [None, 1])
  writer = (lean_versions.LeanWriter(fmt, [w.name for w in model.weights], signature)
            if fmt.lean else None)
  reader = lean_versions.LeanReader()
  shapes = [w.shape for w in model.weights]
  whole, deltas, write_s, read_s = [], [], [], []
  for step in steps:
    start = time.perf_counter()
    if writer is None:
      model.set_weights(snapshots[step])
      path = exchange.publish(model, exchange_dir, 1, step, models.CTR_SPEC, keep_last=1)
    else:
      path = writer.publish(snapshots[step], exchange_dir, 1, step, keep_last=1)
    write_s.append(time.perf_counter() - start)
    version = exchange.Version(1, step, path)
    marker = exchange.verify(version)
    (deltas if (marker.get("format") or {}).get("base") else whole).append(
        traffic.saved_model_bytes(path))
    if writer is not None:
      start = time.perf_counter()
      version_id, arrays = reader.read(exchange_dir, version, marker, signature, shapes)
      reader.commit(version_id, arrays)
      read_s.append(time.perf_counter() - start)
      _check_read_back(fmt, arrays, snapshots[step])
  return {"whole_bytes": whole, "delta_bytes": deltas,
          "write_seconds_median": statistics.median(write_s),
          "read_seconds_median": statistics.median(read_s) if read_s else None}


def _check_read_back(fmt: tfc.PublishFormat, arrays: Sequence[np.ndarray],
                     weights: Sequence[np.ndarray]) -> None:
  """What a reader rebuilt is this step's weights: exactly (float32, exact deltas), or within
  the format's row tolerance plus int8 rounding, per row."""
  rounding = (weight_codecs.INT8_ROW_ERROR if fmt.encoding == "int8" else 0.0) + 1e-6
  for got, want in zip(arrays, weights):
    if fmt.row_tolerance:
      off = weight_codecs.drifted_rows(want, weight_codecs.encode(got, "float32"),
                                       fmt.row_tolerance + rounding)
      if len(off):
        raise AssertionError(f"{fmt}: {len(off)} rows read back are off by more than their bound")
    elif fmt.encoding == "float32":
      np.testing.assert_array_equal(got, want)


def amortized_bytes_per_step(sizes: dict, k: int, whole_every: int) -> float:
  """Bytes per step over one cycle of ``whole_every`` publishes (see the module docstring)."""
  whole = statistics.median(sizes["whole_bytes"])
  if not sizes["delta_bytes"]:
    return whole / k
  delta = statistics.median(sizes["delta_bytes"])
  return (whole + (whole_every - 1) * delta) / (whole_every * k)


def measure(data_dir: str, steps: int, batch: int, intervals: Sequence[int],
            num_buckets: int = 20_000, progress: Callable[[str], None] = print) -> dict:
  """Per format and interval: version sizes, amortized bytes per step, write/read seconds (a
  line of ``progress`` each)."""
  every = min(intervals)
  model, snapshots, loss = train_snapshots(data_dir, steps, batch, every, num_buckets)
  out = {"steps": steps, "batch": batch, "final_train_loss": loss, "formats": {}}
  for name, fmt in FORMATS.items():
    out["formats"][name] = {"encoding": fmt.encoding, "row_deltas": fmt.row_deltas,
                            "whole_every": fmt.whole_every, "row_tolerance": fmt.row_tolerance,
                            "by_interval": {}}
    for k in intervals:
      with tempfile.TemporaryDirectory() as tmp:
        sizes = _publish_all(model, fmt, [s for s in sorted(snapshots) if s % k == 0],
                             snapshots, tmp)
      sizes["bytes_per_step"] = amortized_bytes_per_step(sizes, k, fmt.whole_every)
      out["formats"][name]["by_interval"][str(k)] = sizes
      progress(f"{name:>16} K={k:<5} whole "
               f"{statistics.median(sizes['whole_bytes']) / 1e6:7.2f} MB"
               + (f", delta {statistics.median(sizes['delta_bytes']) / 1e6:7.3f} MB"
                  if sizes["delta_bytes"] else "")
               + f", {sizes['bytes_per_step'] / 1e3:8.2f} kB/step")
  return out
