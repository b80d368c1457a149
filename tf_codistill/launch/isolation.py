"""A private network namespace for the tasks of one local launch.

TF's gRPC servers listen on every interface of the network they run in (a cluster spec that says
``127.0.0.1:PORT`` still binds ``*:PORT``) and run any graph a client sends, file reads and writes
included, without authentication. So a local launch starts all its tasks, of every group, inside
one network namespace of its own with only loopback up: nothing outside it reaches their ports,
and two launches on one machine cannot reach each other's.

The namespace is held by a small process made with util-linux ``unshare --net`` (plus ``--user
--map-root-user`` when not root, so that an unprivileged user can make one); every task starts
through ``nsenter`` into it, so task pids stay those of this machine. The holder exits when its
owner closes its stdin or dies, and the namespace goes with the last process in it. Tasks in it
reach no network but their own loopback: a cloud exchange directory (``gs://``) needs
``isolate_network=False``.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
from typing import List, Sequence

# Brings loopback up (SIOCGIFFLAGS / SIOCSIFFLAGS on "lo", needs no `ip` tool), says so, and
# holds the namespace until stdin closes.
_HOLDER = r"""
import fcntl, socket, struct, sys
ifreq = struct.pack("16sH", b"lo", 0)
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
  flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, ifreq)[:18])[1]
  fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))
print("ready", flush=True)
sys.stdin.read()
"""


class IsolationError(RuntimeError):
  """No private network namespace can be made on this machine (no privilege, no util-linux)."""


class NetworkNamespace:
  """A private network namespace with loopback up, held open until ``close``."""

  def __init__(self, timeout_s: float = 30.0):
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
      raise IsolationError(f"{' and '.join(missing)} (util-linux) not found")
    self.user_namespace = os.geteuid() != 0
    command = ["unshare", "--net",
               *(["--user", "--map-root-user"] if self.user_namespace else []),
               "--", sys.executable, "-c", _HOLDER]
    self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, start_new_session=True)
    ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
    if not ready or self._proc.stdout.readline().strip() != b"ready":
      self.close()
      reason = self._proc.stderr.read().decode(errors="replace").strip().splitlines()
      raise IsolationError(f"`{' '.join(command[:4])} ...` failed: "
                           f"{reason[-1] if reason else 'no namespace after %gs' % timeout_s}")

  @property
  def pid(self) -> int:
    """The holder's pid: ``/proc/<pid>/ns/net`` is the namespace."""
    return self._proc.pid

  def command(self, command: Sequence[str]) -> List[str]:
    """``command`` run inside the namespace (``nsenter`` execs it: the pid is the command's)."""
    return ["nsenter", f"--target={self.pid}", "--net",
            *(["--user", "--preserve-credentials"] if self.user_namespace else []), "--",
            *command]

  def close(self) -> None:
    """Lets the holder go; the namespace ends with the last task in it."""
    if self._proc.poll() is None:
      self._proc.stdin.close()
      try:
        self._proc.wait(timeout=5)
      except subprocess.TimeoutExpired:
        self._proc.kill()
        self._proc.wait()

  def __enter__(self) -> "NetworkNamespace":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
