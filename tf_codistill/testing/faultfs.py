"""A directory that fails on demand: a backing directory mounted through FUSE, passing every
operation through until told to misbehave. It makes the exchange directory's faults for real
(the kernel, TF's file system layer and the exchange code all see them): slow (every operation
delayed), read-only (EROFS), full (ENOSPC), vanished (empty, every path gone, until back),
stalled (every operation blocks until the mode changes), and a bandwidth cap (bytes per second
read, and as many written, as over a full-duplex link) for a slow link to a remote exchange.
It counts the bytes read and written through it (``bytes_moved``: what crossed the link).

  with faultfs.FaultyDirectory(backing, mount) as exchange_dir:   # exchange_dir == mount
    ...                                     # pass-through
    exchange_dir.set("full")                # writes fail with ENOSPC from now on
    exchange_dir.set("ok", bytes_per_s=12.5e6)   # ~100 Mbit/s
    exchange_dir.bytes_moved()              # {"read": ..., "written": ...} so far

The file system runs in a process of its own (``python -m tf_codistill.testing.faultfs_server
BACKING MOUNT CONTROL``); ``set`` rewrites the control file (JSON, atomically), which the file
system reads again before its next operation; it writes its byte counts to ``CONTROL.bytes.json``
(at most every 0.2 s, and as it is unmounted). Needs root (``/dev/fuse``), Debian's ``fuse3`` and
the ``mfusepy`` package; ``unavailable()`` says what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Dict, Optional

from tf_codistill import testing
from tf_codistill.testing import json_files

MODES = ("ok", "slow", "read_only", "full", "vanished", "stalled")


def unavailable() -> Optional[str]:
  """Why a faulty directory cannot be mounted here, or None when it can."""
  if os.geteuid() != 0 or not os.access("/dev/fuse", os.R_OK | os.W_OK):
    return "FUSE needs root and /dev/fuse"
  if shutil.which("fusermount3") is None:
    return "fusermount3 not found: install Debian's fuse3"
  try:
    import mfusepy  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
  except (ImportError, OSError) as e:  # OSError: libfuse itself missing
    return f"mfusepy cannot load ({e}): pip install mfusepy, and Debian's fuse3"
  return None


def bytes_path(control: str) -> str:
  """Where the file system of control file ``control`` writes its byte counts."""
  return f"{control}.bytes.json"


class FaultyDirectory:
  """``backing`` mounted at ``mount`` through the faulty file system, until ``close``."""

  def __init__(self, backing: str, mount: str, timeout_s: float = 30.0):
    reason = unavailable()
    if reason:
      raise RuntimeError(f"cannot mount a faulty directory: {reason}")
    self.backing, self.path = os.path.abspath(backing), os.path.abspath(mount)
    self.control = f"{self.path.rstrip('/')}.faultfs.json"
    self._final: Optional[Dict[str, int]] = None
    if os.path.exists(bytes_path(self.control)):
      os.remove(bytes_path(self.control))
    os.makedirs(self.backing, exist_ok=True)
    os.makedirs(self.path, exist_ok=True)
    self.set("ok")
    self._proc = subprocess.Popen(
        [sys.executable, "-m", "tf_codistill.testing.faultfs_server", self.backing, self.path,
         self.control],
        cwd=testing.PACKAGE_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    while not os.path.ismount(self.path):
      if self._proc.poll() is not None or time.monotonic() > deadline:
        self.close()
        raise RuntimeError(f"the faulty file system did not mount at {self.path}: "
                           f"{self._proc.stderr.read().decode(errors='replace')[-2000:]}")
      time.sleep(0.05)

  def set(self, mode: str, delay_s: float = 2.0, bytes_per_s: Optional[float] = None) -> None:
    """From the next operation on: ``mode`` (one of MODES; ``delay_s`` for 'slow'), and at most
    ``bytes_per_s`` read and as many written (None: no cap)."""
    if mode not in MODES:
      raise ValueError(f"mode={mode!r} is not one of {MODES}")
    json_files.write_json(self.control,
                       {"mode": mode, "delay_s": delay_s, "bytes_per_s": bytes_per_s})

  def bytes_moved(self) -> Dict[str, int]:
    """Bytes read and written through the directory so far (final once it is closed)."""
    if self._final is not None:
      return dict(self._final)
    return json_files.read_json_or(bytes_path(self.control), {"read": 0, "written": 0})

  def close(self) -> None:
    """Unmounts (waiting for the file system process) and removes the control file, keeping
    the final byte counts (``bytes_moved``)."""
    if os.path.ismount(self.path):
      self.set("ok")  # a stalled operation returns, so the unmount is not refused as busy
      subprocess.run(["fusermount3", "-u", self.path], check=False, capture_output=True)
    if self._proc.poll() is None:
      try:
        self._proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self._proc.kill()
        self._proc.wait()
    if self._final is None:
      self._final = self.bytes_moved()
    for path in (self.control, bytes_path(self.control)):
      if os.path.exists(path):
        os.remove(path)

  def __enter__(self) -> "FaultyDirectory":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
