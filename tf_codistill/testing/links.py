"""One direction of a slow link: a byte-rate cap shared by every transfer that crosses it."""

from __future__ import annotations

import threading
import time
from typing import Optional


class Link:
  """Carries transfers one after another at a capped rate, as one direction of a real link:
  a transfer waits until the link has carried everything queued before it and itself."""

  def __init__(self):
    self._lock = threading.Lock()
    self._free_at = 0.0  # time.monotonic() when the link has carried all it was given

  def carry(self, size: int, bytes_per_s: Optional[float]) -> None:
    """Blocks until ``size`` bytes have crossed at ``bytes_per_s`` (None or 0: no cap)."""
    if not bytes_per_s:
      return
    with self._lock:
      self._free_at = max(time.monotonic(), self._free_at) + size / bytes_per_s
      done = self._free_at
    time.sleep(max(0.0, done - time.monotonic()))
