"""Gradient communication of synchronous groups (MLSL-style, Sridharan et al. 2018).

Packing and the collective timeout are ``tf.distribute.experimental.CommunicationOptions`` of the
group's MultiWorkerMirroredStrategy (``strategies.make_strategy.bytes_per_pack`` /
``timeout_seconds``); this module adds reduced-precision all-reduce (``GradientReducer``). What
each worker sends per step is counted by ``benchmarks/traffic.py``.

Reduced precision, as TF's collectives allow it on CPU:

- ``'float16'``: gradients are cast to float16, summed by the ring all-reduce in float16 and cast
  back. Each gradient is first multiplied by a power of two chosen from its largest magnitude on
  any replica (one small all-gather of per-gradient maxima) so that the float16 sum cannot
  overflow and small entries keep their precision; the factor is divided out after the cast back
  (exact: powers of two). This is loss scaling done per gradient after a float32 backward pass.
- ``'bfloat16'``: TF's collective reduce kernels have no bfloat16, so the bfloat16 bits are
  all-gathered (as float16 bit patterns, never computed on) and summed in float32 locally, in the
  same order on every replica. An all-gather sends (n-1) x the data per worker instead of the ring
  all-reduce's 2(n-1)/n: half of float32's bytes at 2 workers, break-even at 4, more beyond.

``IndexedSlices`` (embedding gradients) are all-gathered by TF, never densified: values and
indices of every replica, padded to the longest; their values are cast the same way.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import gin
import tensorflow as tf
from absl import logging

DTYPES = {"float32": tf.float32, "float16": tf.float16, "bfloat16": tf.bfloat16}
_F16_MAX = 65504.0


def sync_replicas() -> int:
  """Replicas whose gradients are summed each step (1 without a synchronous strategy)."""
  if not tf.distribute.has_strategy():
    return 1
  strategy = tf.distribute.get_strategy()
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    return 1
  return strategy.num_replicas_in_sync


def _options() -> Optional[tf.distribute.experimental.CommunicationOptions]:
  """The strategy's own communication options (packing, timeout, implementation)."""
  extended = tf.distribute.get_strategy().extended
  return getattr(extended, "_communication_options", None)


def _cast(grad, dtype):
  if isinstance(grad, tf.IndexedSlices):
    return tf.IndexedSlices(tf.cast(grad.values, dtype), grad.indices, grad.dense_shape)
  return tf.cast(grad, dtype)


def _scale(grad, factor):
  if isinstance(grad, tf.IndexedSlices):
    return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices,
                            grad.dense_shape)
  return grad * tf.cast(factor, grad.dtype)


def _values(grad) -> tf.Tensor:
  return grad.values if isinstance(grad, tf.IndexedSlices) else grad


@gin.configurable(module="comm", denylist=["dtype"])
class GradientReducer:
  """Sums gradients over a synchronous group's replicas in ``dtype`` (inside the train step).

  With one replica (or asynchronous/no strategy) it returns the gradients unchanged.
  ``headroom`` (float16): the scaled per-replica maximum is at most 65504 / (replicas *
  headroom).
  """

  def __init__(self, dtype: str = "float32", *, headroom: float = 2.0,
               binding: str = "tfc.Group.allreduce_dtype"):
    if dtype not in DTYPES:
      raise ValueError(f"{binding}={dtype!r} is not one of {sorted(DTYPES)}")
    self.dtype = dtype
    self.headroom = float(headroom)
    self.binding = binding
    self._logged = False

  def reduce(self, grads: Sequence) -> List:
    """The sums over replicas of ``grads`` (tensors, IndexedSlices or None), in float32."""
    replicas = sync_replicas()
    if replicas == 1:
      if not self._logged and self.dtype != "float32":
        logging.info("%s=%r: one replica, nothing to all-reduce", self.binding, self.dtype)
        self._logged = True
      return list(grads)
    present = [g for g in grads if g is not None]
    sparse = sum(isinstance(g, tf.IndexedSlices) for g in present)
    logging.info("gradient all-reduce over %d replicas in %s: %d dense, %d IndexedSlices (%s)",
                 replicas, self.dtype, len(present) - sparse, sparse, self.binding)
    if self.dtype == "float32":
      reduced = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                               present)
    elif self.dtype == "float16":
      reduced = self._reduce_float16(present, replicas)
    else:
      reduced = self._reduce_bfloat16(present)
    out = iter(reduced)
    return [None if g is None else next(out) for g in grads]

  def _reduce_float16(self, grads: List, replicas: int) -> List:
    ctx = tf.distribute.get_replica_context()
    local_max = tf.stack([tf.reduce_max(tf.abs(tf.cast(_values(g), tf.float32))) for g in grads])
    global_max = tf.reduce_max(ctx.all_gather(local_max[None], axis=0), axis=0)
    # Largest power of two keeping replicas * max * scale <= 65504 / headroom.
    limit = _F16_MAX / (replicas * self.headroom)
    exponent = tf.floor(tf.math.log(limit / tf.maximum(global_max, 1e-30)) / math.log(2.0))
    scales = tf.pow(2.0, tf.clip_by_value(exponent, -100.0, 100.0))
    low = [_cast(_scale(g, scales[i]), tf.float16) for i, g in enumerate(grads)]
    reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, low)
    return [_scale(_cast(r, tf.float32), 1.0 / scales[i]) for i, r in enumerate(reduced)]

  def _reduce_bfloat16(self, grads: List) -> List:
    ctx = tf.distribute.get_replica_context()
    options = _options()
    bits = lambda t: tf.bitcast(tf.cast(t, tf.bfloat16), tf.float16)
    unbits = lambda t: tf.cast(tf.bitcast(t, tf.bfloat16), tf.float32)
    out: List = [None] * len(grads)
    dense = [i for i, g in enumerate(grads) if not isinstance(g, tf.IndexedSlices)]
    pack_bytes = options.bytes_per_pack if options is not None else 0
    for pack in _packs([grads[i] for i in reversed(dense)], pack_bytes):
      indices = [dense[len(dense) - 1 - j] for j in pack]
      flat = tf.concat([tf.reshape(grads[i], [-1]) for i in indices], axis=0)
      gathered = ctx.all_gather(bits(flat)[None], axis=0)  # [replicas, size]
      summed = tf.reduce_sum(unbits(gathered), axis=0)
      sizes = [grads[i].shape.num_elements() for i in indices]
      for i, part in zip(indices, tf.split(summed, sizes)):
        out[i] = tf.reshape(part, tf.shape(grads[i]))
    for i, g in enumerate(grads):
      if isinstance(g, tf.IndexedSlices):
        values = unbits(ctx.all_gather(bits(g.values), axis=0))
        out[i] = tf.IndexedSlices(values, ctx.all_gather(g.indices, axis=0), g.dense_shape)
    return out


def _packs(tensors: Sequence[tf.Tensor], bytes_per_pack: int) -> List[List[int]]:
  """Positions of ``tensors`` grouped as TF's ``group_by_size`` packs them (16-bit elements)."""
  if not bytes_per_pack:
    return [list(range(len(tensors)))]
  packs: List[List[int]] = []
  size = 0
  for j, t in enumerate(tensors):
    if not packs or size > bytes_per_pack:
      packs.append([])
      size = 0
    packs[-1].append(j)
    size += t.shape.num_elements() * 2
  return packs
