"""The file system process of ``tf_codistill.testing.faultfs``: a FUSE pass-through to a backing
directory that misbehaves as its control file says (``python -m tf_codistill.testing.faultfs_server
BACKING MOUNT CONTROL``; ``faultfs.FaultyDirectory`` starts and stops it)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import threading
import time
from typing import Any, Dict, Optional

import mfusepy

from tf_codistill.testing import faultfs
from tf_codistill.testing import json_files
from tf_codistill.testing import links

_WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class FaultFS(mfusepy.Operations):
  """Pass-through to ``backing``, failing or slowing each operation as the control file
  ``control`` says."""

  def __init__(self, backing: str, control: str):
    self._backing, self._control = backing, control
    self._stamp: Optional[int] = None
    self._behaviour: Dict[str, Any] = {"mode": "ok"}
    self._links = {side: links.Link() for side in ("read", "written")}
    self._moved = {"read": 0, "written": 0}
    self._counting = threading.Lock()
    self._reported_at = 0.0

  def _current(self) -> Dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):  # being replaced: keep the last one read
      stamp = os.stat(self._control).st_mtime_ns
      if stamp != self._stamp:
        with open(self._control) as f:
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
    return os.path.join(self._backing, path.lstrip("/"))

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
    json_files.write_json(faultfs.bytes_path(self._control), moved)

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


def main(argv) -> None:
  backing, mount, control = argv[1:4]
  # No kernel caching of attributes, names or data: a fault shows on the very next operation.
  mfusepy.FUSE(FaultFS(backing, control), mount, foreground=True, nothreads=False,
               attr_timeout=0, entry_timeout=0, negative_timeout=0, direct_io=True)


if __name__ == "__main__":
  main(sys.argv)
