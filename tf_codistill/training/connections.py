"""How long a connection between a group's tasks may go unanswered before it is dropped.

A gRPC server aborts a TCP connection whose sent data stays unacknowledged for 20 s: it sets
``TCP_USER_TIMEOUT`` from its keepalive timeout on the sockets it listens and accepts on, and
``tf.distribute.Server`` passes gRPC no option to change it. So a network partition longer than
20 s breaks the connection, and the first request after the heal fails with "Connection reset by
peer", which costs the group a restart from its checkpoint. ``ConnectionTimeout`` sets this
process's TCP sockets (its server's and its strategy's, as they appear) to a longer limit, from a
thread that looks at them every ``poll_s``; TCP's own retransmissions then carry a connection
across a partition shorter than the limit. Linux only (elsewhere it logs that it does nothing).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Iterator, Optional

from absl import logging

_FD_DIR = "/proc/self/fd"


def socket_fds() -> Iterator[int]:
  """This process's open file descriptors that are sockets (of any kind)."""
  try:
    names = os.listdir(_FD_DIR)
  except OSError:
    return
  for name in names:
    try:
      if os.readlink(os.path.join(_FD_DIR, name)).startswith("socket:"):
        yield int(name)
    except OSError:  # closed meanwhile
      continue


def set_user_timeout(fd: int, timeout_ms: int) -> bool:
  """Sets ``TCP_USER_TIMEOUT`` of the TCP socket ``fd`` (not closing it, not taking it over);
  False if ``fd`` is not an open TCP socket or already had ``timeout_ms``."""
  try:
    sock = socket.socket(fileno=fd)  # family and type read from the descriptor
  except OSError:  # closed meanwhile, or no longer a socket
    return False
  try:
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
      return False
    if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == timeout_ms:
      return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, timeout_ms)
    return True
  except OSError:
    return False
  finally:
    sock.detach()  # the descriptor stays its owner's (gRPC's)


class ConnectionTimeout:
  """Holds every TCP socket of this process at ``TCP_USER_TIMEOUT`` = ``timeout_s`` (see the
  module's docstring), checking them every ``poll_s`` from a daemon thread until ``stop``."""

  def __init__(self, timeout_s: float, poll_s: float = 1.0):
    self.timeout_ms = int(timeout_s * 1000)
    self.poll_s = poll_s
    self.changed = 0  # sockets set so far (a socket set again after gRPC reset it counts twice)
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def apply(self) -> int:
    """Sets every TCP socket open now; how many needed it."""
    changed = sum(set_user_timeout(fd, self.timeout_ms) for fd in socket_fds())
    self.changed += changed
    return changed

  def start(self) -> "ConnectionTimeout":
    """Applies now, then every ``poll_s`` in a daemon thread."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "TCP_USER_TIMEOUT"):
      logging.warning("tfc.Group.connection_timeout_s: TCP_USER_TIMEOUT is Linux-only; gRPC's "
                      "20 s stays in force on %s", sys.platform)
      return self
    self.apply()
    self._thread = threading.Thread(target=self._run, name="connection-timeout", daemon=True)
    self._thread.start()
    logging.info("TCP connections of this task outlive %.0f s without an answer "
                 "(tfc.Group.connection_timeout_s)", self.timeout_ms / 1000)
    return self

  def _run(self) -> None:
    while not self._stop.wait(self.poll_s):
      self.apply()

  def stop(self) -> None:
    """Stops the thread (the sockets keep their setting)."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
