"""training/connections.py: TCP sockets of the process held at the group's connection timeout."""

import os
import socket
import subprocess
import sys
import time

import pytest

from tf_codistill.training import connections

import testing_utils


def _timeout_ms(sock: socket.socket) -> int:
  return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)


def _connected_pair():
  listener = socket.create_server(("127.0.0.1", 0))
  client = socket.create_connection(listener.getsockname())
  accepted, _ = listener.accept()
  return listener, client, accepted


def test_every_tcp_socket_of_the_process_is_set_and_nothing_else_is_touched():
  listener, client, accepted = _connected_pair()
  udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
  unix_a, unix_b = socket.socketpair()
  read_end, write_end = os.pipe()
  others = [udp, unix_a, unix_b]
  try:
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 20000)  # gRPC's server value
    assert connections.ConnectionTimeout(95).apply() >= 3
    assert [_timeout_ms(s) for s in (listener, client, accepted)] == [95000] * 3
    # A second pass finds nothing to do; the sockets and the pipe are still open and theirs.
    assert connections.ConnectionTimeout(95).apply() == 0
    client.sendall(b"ping")
    assert accepted.recv(4) == b"ping"
    unix_a.sendall(b"x")
    assert unix_b.recv(1) == b"x"
    os.write(write_end, b"y")
    assert os.read(read_end, 1) == b"y"
    assert all(s.fileno() >= 0 for s in others)
  finally:
    for s in (listener, client, accepted, *others):
      s.close()
    os.close(read_end)
    os.close(write_end)


def test_a_descriptor_that_is_not_a_tcp_socket_is_refused_untouched():
  read_end, write_end = os.pipe()
  try:
    assert not connections.set_user_timeout(read_end, 1000)
    os.write(write_end, b"z")
    assert os.read(read_end, 1) == b"z"  # still open
  finally:
    os.close(read_end)
    os.close(write_end)
  assert not connections.set_user_timeout(read_end, 1000)  # closed: no error either


def test_the_thread_sets_sockets_opened_after_it_started_and_stops():
  held = connections.ConnectionTimeout(42, poll_s=0.05).start()
  try:
    listener, client, accepted = _connected_pair()
    deadline = time.monotonic() + 5
    while _timeout_ms(accepted) != 42000 and time.monotonic() < deadline:
      time.sleep(0.05)
    assert [_timeout_ms(s) for s in (listener, client, accepted)] == [42000] * 3
    accepted.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 20000)  # reset by its owner
    deadline = time.monotonic() + 5
    while _timeout_ms(accepted) != 42000 and time.monotonic() < deadline:
      time.sleep(0.05)
    assert _timeout_ms(accepted) == 42000 and held.changed >= 4
  finally:
    held.stop()
    for s in (listener, client, accepted):
      s.close()
  assert not held._thread.is_alive()


_SERVER_CHILD = """
import socket, sys
import tensorflow as tf
from tf_codistill.training import connections
address = sys.argv[1]
tf.distribute.Server(tf.train.ClusterSpec({"worker": [address]}), job_name="worker",
                     task_index=0, start=True)
connections.ConnectionTimeout(77).apply()
for fd in connections.socket_fds():
  sock = socket.socket(fileno=fd)
  try:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
      if sock.getsockname()[1] == int(address.rsplit(":", 1)[1]):
        print("listener", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
  finally:
    sock.detach()
"""


@pytest.mark.cluster
def test_a_tf_servers_listening_socket_is_held_at_the_timeout():
  probe = socket.create_server(("127.0.0.1", 0))
  address = f"127.0.0.1:{probe.getsockname()[1]}"
  probe.close()
  proc = subprocess.run([sys.executable, "-c", _SERVER_CHILD, address], capture_output=True,
                        text=True, timeout=300, cwd=testing_utils.REPO)
  assert proc.returncode == 0, proc.stderr[-3000:]
  found = [line.split() for line in proc.stdout.splitlines() if line.startswith("listener")]
  assert found and {value for _, value in found} == {"77000"}, proc.stdout
