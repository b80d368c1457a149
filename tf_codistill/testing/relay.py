"""The relay of ``netfaults.latency``: a slow link between a task and the rest, in user space.

Runs inside the fault's network namespace (``python -m tf_codistill.testing.relay DELAY_S MARK
BYTES_PER_S``): listens on two free loopback ports, printed first as ``OUT IN`` (one for the
task's own connections, one for connections to the task), and forwards each connection nftables
redirected to it to the port it was addressed to (SO_ORIGINAL_DST), from a socket marked MARK so
that the rules skip it. Each chunk is held DELAY_S seconds; with BYTES_PER_S > 0 each direction
of the link ("out": the task sends, "in": it receives) carries at most that many bytes a second
over all its connections. Prints ``connection`` per accepted connection and ``bytes OUT IN``
(the totals carried) at most every 0.2 s, as a connection ends and as it is stopped (SIGTERM).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import struct
import sys
import threading
import time
from typing import List

from tf_codistill.testing import links

SO_ORIGINAL_DST = 80


class Relay:
  """Forwards redirected connections with a delay and a rate cap, counting the bytes carried."""

  def __init__(self, delay_s: float, mark: int, bytes_per_s: float):
    self.delay_s, self.mark, self.bytes_per_s = delay_s, mark, bytes_per_s
    self.links = {side: links.Link() for side in ("out", "in")}
    self.carried = {"out": 0, "in": 0}
    self._printing = threading.Lock()
    self._printed_at = 0.0

  def report(self, force: bool = False) -> None:
    """Prints the bytes carried each way (at most every 0.2 s unless ``force``)."""
    with self._printing:
      now = time.monotonic()
      if force or now - self._printed_at >= 0.2:
        self._printed_at = now
        print("bytes", self.carried["out"], self.carried["in"], flush=True)

  def pipe(self, src: socket.socket, dst: socket.socket, side: str) -> None:
    """Copies ``src`` to ``dst`` on two threads: one reads and stamps each chunk with when it
    is due, the other sends it then, across the link of ``side``."""
    chunks: queue.Queue = queue.Queue()

    def read() -> None:
      while True:
        try:
          data = src.recv(1 << 16)
        except OSError:
          data = b""
        chunks.put((time.monotonic() + self.delay_s, data))
        if not data:
          return

    def write() -> None:
      while True:
        due, data = chunks.get()
        time.sleep(max(0.0, due - time.monotonic()))
        try:
          if not data:
            dst.shutdown(socket.SHUT_WR)
            self.report(force=True)
            return
          self.links[side].carry(len(data), self.bytes_per_s)
          dst.sendall(data)
        except OSError:
          self.report(force=True)
          return
        with self._printing:
          self.carried[side] += len(data)
        self.report()

    for fn in (read, write):
      threading.Thread(target=fn, daemon=True).start()

  def serve(self, server: socket.socket, outgoing: bool) -> None:
    """Accepts connections on ``server`` forever (``outgoing``: the task's own)."""
    while True:
      client, _ = server.accept()
      address = client.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
      target = struct.unpack("!H", address[2:4])[0]
      upstream = socket.socket()
      upstream.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.mark)
      try:
        upstream.connect(("127.0.0.1", target))
      except OSError:
        client.close()
        continue
      for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      self.pipe(client, upstream, "out" if outgoing else "in")
      self.pipe(upstream, client, "in" if outgoing else "out")
      print("connection", flush=True)


def main(argv: List[str]) -> None:
  relay = Relay(float(argv[1]), int(argv[2]), float(argv[3]))

  def stop(*_) -> None:
    relay.report(force=True)
    os._exit(0)
  signal.signal(signal.SIGTERM, stop)
  servers = []
  for _ in range(2):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(128)
    servers.append(server)
  print(*(s.getsockname()[1] for s in servers), flush=True)
  threading.Thread(target=relay.serve, args=(servers[1], False), daemon=True).start()
  relay.serve(servers[0], True)


if __name__ == "__main__":
  main(sys.argv)
