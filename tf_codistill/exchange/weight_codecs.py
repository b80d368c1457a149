"""How lean published versions store weights: float32, bfloat16 or int8 rows, whole or by row.

Every array is seen as rows of its last axis (an embedding table ``[vocab, dim]`` is ``vocab``
rows of ``dim``; a kernel ``[in, out]`` is ``in`` rows of ``out``; a vector is one row). int8
stores each row as ``round(row / scale)`` with one ``scale = max|row| / 127`` per row (symmetric,
weight-only), rounded to a bfloat16 value so that a lean version stores it in 2 bytes without
loss (``max|row| / scale`` stays within half a code of 127, so the largest code is always 127 and
quantizing decoded values again gives the same codes); a row can be replaced alone: that is what
a row delta does.
Arrays that are not floating point (counters, seeds) are always stored as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import numpy as np
import tensorflow as tf

ENCODINGS = ("float32", "bfloat16", "int8")
_BFLOAT16 = tf.bfloat16.as_numpy_dtype
_INT8_MAX = 127.0
# int8's largest error per value, as a fraction of its row's largest magnitude: half a code,
# times 1 + 2^-8 because a scale is rounded to a bfloat16 value.
INT8_ROW_ERROR = (1 + 2 ** -8) / (2 * _INT8_MAX)


@dataclasses.dataclass(frozen=True)
class Encoded:
  """One array as stored: ``values`` ``[rows, width]`` (float32, bfloat16, int8 codes, or the
  raw dtype) and, for int8, one float32 scale per row."""
  values: np.ndarray
  scales: Optional[np.ndarray] = None

  @property
  def num_rows(self) -> int:
    return int(self.values.shape[0])

  @property
  def nbytes(self) -> int:
    return int(self.values.nbytes + (0 if self.scales is None else self.scales.nbytes))

  def take(self, rows: np.ndarray) -> "Encoded":
    """The rows ``rows`` only."""
    return Encoded(self.values[rows], None if self.scales is None else self.scales[rows])

  def with_rows(self, rows: np.ndarray, new: "Encoded") -> "Encoded":
    """A copy with rows ``rows`` taken from ``new`` (same shape and encoding)."""
    values = self.values.copy()
    values[rows] = new.values[rows]
    if self.scales is None:
      return Encoded(values)
    scales = self.scales.copy()
    scales[rows] = new.scales[rows]
    return Encoded(values, scales)


def rows_shape(shape) -> Tuple[int, int]:
  """(rows, width) of an array of ``shape`` seen as rows of its last axis."""
  shape = tuple(int(d) for d in shape)
  if len(shape) < 2:
    return 1, int(np.prod(shape))
  return int(np.prod(shape[:-1])), shape[-1]


def as_rows(array: np.ndarray) -> np.ndarray:
  """``array`` as ``[rows, last axis]`` (a scalar is one row of one)."""
  array = np.asarray(array)
  return array.reshape(rows_shape(array.shape))


def encode(array: np.ndarray, encoding: str) -> Encoded:
  """``array`` in ``encoding`` (one of ENCODINGS), as rows."""
  if encoding not in ENCODINGS:
    raise ValueError(f"encoding {encoding!r} is not one of {ENCODINGS}")
  rows = as_rows(array)
  if not np.issubdtype(rows.dtype, np.floating):
    return Encoded(rows)
  if encoding == "float32":
    return Encoded(rows.astype(np.float32))
  if encoding == "bfloat16":
    return Encoded(rows.astype(_BFLOAT16))
  rows = rows.astype(np.float32)
  scales = (np.abs(rows).max(axis=1) if rows.shape[1] else np.zeros(rows.shape[0])) / _INT8_MAX
  scales = scales.astype(_BFLOAT16).astype(np.float32)
  safe = np.where(scales > 0, scales, 1.0)[:, None]
  codes = np.clip(np.rint(rows / safe), -_INT8_MAX, _INT8_MAX).astype(np.int8)
  return Encoded(codes, scales)


def stored_scales(scales: np.ndarray) -> np.ndarray:
  """int8 scales as a lean version stores them: bfloat16 (exact, see ``encode``)."""
  return scales.astype(_BFLOAT16)


def decode(encoded: Encoded, dtype=np.float32) -> np.ndarray:
  """The rows ``[rows, width]`` that ``encoded`` stands for, in ``dtype`` (floating arrays)."""
  if encoded.scales is not None:
    scales = encoded.scales.astype(np.float32)
    return (encoded.values.astype(np.float32) * scales[:, None]).astype(dtype)
  if np.issubdtype(encoded.values.dtype, np.integer) or encoded.values.dtype == np.bool_:
    return encoded.values
  return encoded.values.astype(dtype)


def changed_rows(new: Encoded, old: Encoded) -> np.ndarray:
  """Indices of the rows whose stored form differs between ``old`` and ``new``: a reader holding
  ``old`` that replaces them holds exactly ``new``."""
  if new.values.shape != old.values.shape or new.values.dtype != old.values.dtype:
    raise ValueError(f"cannot compare rows of {old.values.dtype}{old.values.shape} and "
                     f"{new.values.dtype}{new.values.shape}")
  differ = np.any(new.values != old.values, axis=1)
  if new.scales is not None:
    differ |= new.scales != old.scales
  return np.flatnonzero(differ).astype(np.int32)


def drifted_rows(array: np.ndarray, held: Encoded, tolerance: float) -> np.ndarray:
  """Indices of the rows of ``array`` that differ from ``held``'s by more than ``tolerance``
  times their largest magnitude (``max|row - held row| > tolerance * max|row|``): the rows an
  error-bounded delta must send so that no row a reader holds is further than that from
  ``array``."""
  rows = as_rows(array).astype(np.float32)
  if rows.shape != held.values.shape:
    raise ValueError(f"cannot compare rows of {rows.shape} with held {held.values.shape}")
  drift = np.abs(rows - decode(held, np.float32)).max(axis=1, initial=0.0)
  bound = tolerance * np.abs(rows).max(axis=1, initial=0.0)
  return np.flatnonzero(drift > bound).astype(np.int32)


def compact_indices(rows: np.ndarray, num_rows: int) -> np.ndarray:
  """``rows`` (indices into ``num_rows`` rows) as uint16 where they fit, else int32."""
  return rows.astype(np.uint16 if num_rows <= np.iinfo(np.uint16).max + 1 else np.int32)
