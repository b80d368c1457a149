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

The file system runs in a process of its own (``python -m benchmarks.faultfs BACKING MOUNT
CONTROL``); ``set`` rewrites the control file (JSON, atomically), which the file system reads
again before its next operation; it writes its byte counts to ``CONTROL.bytes.json`` (at most
every 0.2 s, and as it is unmounted). Needs root (``/dev/fuse``), Debian's ``fuse3`` and the
``mfusepy`` package; ``unavailable()`` says what is missing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Optional

from benchmarks import links
from benchmarks import machine

MODES = ("ok", "slow", "read_only", "full", "vanished", "stalled")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


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


def _make_operations(backing: str, control: str) -> Any:
  """The FUSE operations over ``backing`` under the behaviour ``control`` says (built here so
  that importing this module needs no libfuse)."""
  import mfusepy  # pylint: disable=g-import-not-at-top

  class FaultFS(mfusepy.Operations):
    """Pass-through to ``backing``, failing or slowing each operation as ``control`` says."""

    def __init__(self):
      self._stamp: Optional[int] = None
      self._behaviour: Dict[str, Any] = {"mode": "ok"}
      self._links = {side: links.Link() for side in ("read", "written")}
      self._moved = {"read": 0, "written": 0}
      self._counting = threading.Lock()
      self._reported_at = 0.0

    def _current(self) -> Dict[str, Any]:
      with contextlib.suppress(OSError, ValueError):  # being replaced: keep the last one read
        stamp = os.stat(control).st_mtime_ns
        if stamp != self._stamp:
          with open(control) as f:
            self._behaviour, self._stamp = json.load(f), stamp
      return self._behaviour

    def _enter(self, path: str, write: bool = False) -> str:
      """Applies the behaviour to one operation on ``path``; returns the backing path."""
      behaviour = self._current()
      while behaviour["mode"] == "stalled":
        time.sleep(0.05)
        behaviour = self._current()
      mode = behaviour["mode"]
      if mode == "slow":
        time.sleep(behaviour.get("delay_s", 2.0))
      elif mode == "vanished" and path != "/":
        raise mfusepy.FuseOSError(errno.ENOENT)
      elif write and mode == "read_only":
        raise mfusepy.FuseOSError(errno.EROFS)
      elif write and mode in ("full", "vanished"):
        raise mfusepy.FuseOSError(errno.ENOSPC if mode == "full" else errno.ENOENT)
      return os.path.join(backing, path.lstrip("/"))

    def _transfer(self, side: str, size: int) -> None:
      """Holds a read or write (``side``) of ``size`` bytes until a link of ``bytes_per_s``
      each way carried it, and counts it."""
      self._links[side].carry(size, self._current().get("bytes_per_s"))
      with self._counting:
        self._moved[side] += size
      self._report()

    def _report(self, force: bool = False) -> None:
      """Writes the byte counts (at most every 0.2 s unless ``force``)."""
      with self._counting:
        now = time.monotonic()
        if not force and now - self._reported_at < 0.2:
          return
        self._reported_at = now
        moved = dict(self._moved)
      machine.write_json(bytes_path(control), moved)

    def destroy(self, path):
      self._report(force=True)

    def __call__(self, op, *args):
      try:
        return super().__call__(op, *args)
      except OSError as e:
        if isinstance(e, mfusepy.FuseOSError):
          raise
        raise mfusepy.FuseOSError(e.errno or errno.EIO) from None

    def getattr(self, path, fh=None):
      st = os.lstat(self._enter(path))
      return {key: getattr(st, key) for key in (
          "st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size",
          "st_uid", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}

    def readdir(self, path, fh):
      real = self._enter(path)
      if path == "/" and self._current()["mode"] == "vanished":
        return [".", ".."]
      return [".", "..", *os.listdir(real)]

    def access(self, path, amode):
      if not os.access(self._enter(path, write=bool(amode & os.W_OK)), amode):
        raise mfusepy.FuseOSError(errno.EACCES)

    def open(self, path, flags):
      return os.open(self._enter(path, write=bool(flags & _WRITES)), flags)

    def create(self, path, mode, fi=None):
      return os.open(self._enter(path, write=True), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path, size, offset, fh):
      self._enter(path)
      data = os.pread(fh, size, offset)
      self._transfer("read", len(data))
      return data

    def write(self, path, data, offset, fh):
      self._enter(path, write=True)
      self._transfer("written", len(data))
      return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
      real = self._enter(path, write=True)
      if fh is None:
        os.truncate(real, length)
      else:
        os.ftruncate(fh, length)

    def flush(self, path, fh):
      return 0

    def release(self, path, fh):
      os.close(fh)
      return 0

    def fsync(self, path, datasync, fh):
      self._enter(path, write=True)
      (os.fdatasync if datasync else os.fsync)(fh)
      return 0

    def mkdir(self, path, mode):
      os.mkdir(self._enter(path, write=True), mode)

    def rmdir(self, path):
      os.rmdir(self._enter(path, write=True))

    def unlink(self, path):
      os.unlink(self._enter(path, write=True))

    def rename(self, old, new):
      os.rename(self._enter(old, write=True), self._enter(new, write=True))

    def chmod(self, path, mode):
      os.chmod(self._enter(path, write=True), mode)

    def utimens(self, path, times=None):
      os.utime(self._enter(path, write=True), ns=times)

    def statfs(self, path):
      st = os.statvfs(self._enter(path))
      return {key: getattr(st, key) for key in (
          "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
          "f_flag", "f_frsize", "f_namemax")}

  return FaultFS()


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
        [sys.executable, "-m", "benchmarks.faultfs", self.backing, self.path, self.control],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
    machine.write_json(self.control,
                       {"mode": mode, "delay_s": delay_s, "bytes_per_s": bytes_per_s})

  def bytes_moved(self) -> Dict[str, int]:
    """Bytes read and written through the directory so far (final once it is closed)."""
    if self._final is not None:
      return dict(self._final)
    return machine.read_json_or(bytes_path(self.control), {"read": 0, "written": 0})

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


def main(argv) -> None:
  backing, mount, control = argv[1:4]
  import mfusepy  # pylint: disable=g-import-not-at-top
  # No kernel caching of attributes, names or data: a fault shows on the very next operation.
  mfusepy.FUSE(_make_operations(backing, control), mount, foreground=True, nothreads=False,
               attr_timeout=0, entry_timeout=0, negative_timeout=0, direct_io=True)


if __name__ == "__main__":
  main(sys.argv)
