"""The outer step of parameter averaging (DiLoCo, local SGD), in numpy, bit-reproducible.

Every group applies the same outer step to the same anchor with the same averaged change, so
every group must compute the same bits. This module does it with deterministic elementwise
numpy: the members' changes are summed in ascending group order into a float64 accumulator and
rounded once to float32 (never ``np.sum(axis=0)``, whose pairwise order depends on the layout);
each update is one ufunc per operation on float32 scalars (numpy never fuses ``a*b+c``).

Outer optimizers (``change`` is the average of ``anchor - local``, an *outer gradient*):

* ``nesterov`` (DiLoCo): ``b = mu*b + change; theta = anchor - lr*(change + mu*b)``; ``b`` is
  ``change`` at the first round (PyTorch's SGD with ``nesterov=True``, dampening 0).
* ``momentum`` (heavy ball): ``b = mu*b + change; theta = anchor - lr*b``.
* ``average`` (local SGD / federated averaging): ``theta = anchor - change``, the mean of the
  members' parameters up to float32 rounding (and the changes' encoding) (lr 1, no momentum).
"""

from __future__ import annotations

import hashlib
from typing import List, Optional, Sequence, Tuple

import numpy as np

KINDS = ("nesterov", "momentum", "average")
Arrays = List[np.ndarray]


def average_in_order(changes: Sequence[Sequence[np.ndarray]]) -> Arrays:
  """The elementwise mean of the members' changes (one list of arrays per member, in the
  decision's order), accumulated in float64 in that order and rounded once to float32."""
  if not changes:
    raise ValueError("average_in_order: no member changes")
  count = np.float64(len(changes))
  means = []
  for i in range(len(changes[0])):
    total = np.array(changes[0][i], dtype=np.float64)
    for member in changes[1:]:
      np.add(total, np.asarray(member[i], dtype=np.float64), out=total)
    means.append(np.divide(total, count).astype(np.float32))
  return means


class OuterOptimizer:
  """One of KINDS with its learning rate and momentum; ``step`` is a pure function of its
  inputs, so every group that calls it on the same inputs gets the same bits."""

  def __init__(self, kind: str = "nesterov", learning_rate: float = 0.7, momentum: float = 0.9):
    if kind not in KINDS:
      raise ValueError(f"outer optimizer {kind!r} is not one of {KINDS}")
    self.kind = kind
    self.learning_rate = np.float32(learning_rate)
    self.momentum = np.float32(momentum)

  @property
  def has_momentum(self) -> bool:
    return self.kind != "average"

  def step(self, anchor: Sequence[np.ndarray], change: Sequence[np.ndarray],
           momentum: Optional[Sequence[np.ndarray]]) -> Tuple[Arrays, Optional[Arrays]]:
    """(new parameters, new momentum) from the anchor, the averaged change and the momentum
    (None before the first round, or for ``average``)."""
    if self.kind == "average":
      return [np.subtract(a, c, dtype=np.float32) for a, c in zip(anchor, change)], None
    mu, lr = self.momentum, self.learning_rate
    if momentum is None:
      new_b = [np.array(c, dtype=np.float32) for c in change]
    else:
      new_b = [np.add(np.multiply(mu, b, dtype=np.float32), c, dtype=np.float32)
               for b, c in zip(momentum, change)]
    if self.kind == "nesterov":
      direction = [np.add(c, np.multiply(mu, b, dtype=np.float32), dtype=np.float32)
                   for c, b in zip(change, new_b)]
    else:
      direction = new_b
    theta = [np.subtract(a, np.multiply(lr, d, dtype=np.float32), dtype=np.float32)
             for a, d in zip(anchor, direction)]
    return theta, new_b


def digest(arrays: Sequence[np.ndarray]) -> str:
  """A blake2b digest of the arrays' float32 bytes in order (equal bits, equal digest)."""
  h = hashlib.blake2b(digest_size=16)
  for array in arrays:
    array = np.ascontiguousarray(array, dtype=np.float32)
    h.update(str(array.shape).encode())
    h.update(array.tobytes())
  return h.hexdigest()


def all_finite(arrays: Sequence[np.ndarray]) -> bool:
  return all(bool(np.all(np.isfinite(a))) for a in arrays)
