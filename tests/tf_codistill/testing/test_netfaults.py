"""Network faults are real: inside a namespace the test makes, a process cut off takes no
connection and makes none until healed, a lossy process drops packets that TCP resends, and a
delayed process answers a round trip no sooner than twice the delay."""

import errno
import json
import os
import subprocess
import sys
import time

import pytest

from tf_codistill.launch import isolation
from tf_codistill.testing import netfaults

pytestmark = pytest.mark.skipif(netfaults.unavailable() is not None,
                                reason=str(netfaults.unavailable()))

# An echo server: prints its port, answers every message with itself.
_ECHO = r"""
import socket, threading
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(16)
print(server.getsockname()[1], flush=True)
def serve(c):
  while True:
    data = c.recv(4096)
    if not data:
      return
    c.sendall(data)
while True:
  c, _ = server.accept()
  c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# A client: connects (timeout 3 s), sends `rounds` 100-byte messages one after the other, each
# echoed before the next; prints whether it connected, what came back and the round trips' times.
_CLIENT = r"""
import json, socket, sys, time
port, rounds = int(sys.argv[1]), int(sys.argv[2])
result = {"connected": False, "echoed": 0, "round_trips_s": []}
try:
  c = socket.create_connection(("127.0.0.1", port), timeout=3)
  c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  c.settimeout(30)
  result["connected"] = True
  for i in range(rounds):
    message = bytes([i % 256]) * 100
    start = time.monotonic()
    c.sendall(message)
    got = b""
    while len(got) < len(message):
      got += c.recv(4096)
    result["round_trips_s"].append(time.monotonic() - start)
    result["echoed"] += got == message
except OSError as e:
  result["error"] = str(e)
print(json.dumps(result))
"""


# A process with no socket until told to dial: connects to the port given on each stdin line
# (timeout 3 s), prints "connected" or the error.
_DIALER = r"""
import socket, sys
print("ready", flush=True)
for line in sys.stdin:
  try:
    socket.create_connection(("127.0.0.1", int(line)), timeout=3).close()
    print("connected", flush=True)
  except OSError as e:
    print(e, flush=True)
"""


@pytest.fixture
def namespace():
  """The faults of a namespace made for the test, and an echo server in it (process, port)."""
  with isolation.NetworkNamespace() as ns:
    faults = netfaults.NetworkFaults(ns.pid)
    echo = subprocess.Popen(faults.enter([sys.executable, "-c", _ECHO]), stdout=subprocess.PIPE)
    port = int(echo.stdout.readline())
    try:
      yield faults, echo, port
    finally:
      faults.heal_all()
      echo.kill()
      echo.wait()


@pytest.fixture
def dialer(namespace):
  """A process in the namespace with no socket until asked: ``dial(port)`` connects and says
  "connected" or the error."""
  faults = namespace[0]
  proc = subprocess.Popen(faults.enter([sys.executable, "-c", _DIALER]), text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
  assert proc.stdout.readline().strip() == "ready"

  def dial(port):
    proc.stdin.write(f"{port}\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()
  proc.dial = dial
  yield proc
  proc.kill()
  proc.wait()


def _client(faults, port, rounds=1):
  out = subprocess.run(faults.enter([sys.executable, "-c", _CLIENT, str(port), str(rounds)]),
                       capture_output=True, text=True, timeout=120, check=True).stdout
  return json.loads(out)


def test_a_process_cut_off_takes_no_connection_until_healed(namespace):
  faults, echo, port = namespace
  assert _client(faults, port)["echoed"] == 1
  with faults.cut_off(echo.pid) as fault:
    cut = _client(faults, port)
    assert not cut["connected"] and "timed out" in cut["error"], cut
    assert fault.dropped() >= 1  # the SYNs were dropped, not refused
  assert fault.healed and _client(faults, port)["echoed"] == 1


def test_a_process_cut_off_reaches_no_one_through_sockets_it_opens_meanwhile(namespace, dialer):
  faults, _, port = namespace
  with faults.cut_off(dialer.pid):
    assert "timed out" in dialer.dial(port)
  assert dialer.dial(port) == "connected"


def test_a_lossy_process_drops_packets_that_tcp_sends_again(namespace):
  faults, echo, port = namespace
  with faults.packet_loss(echo.pid, 10) as fault:
    result = _client(faults, port, rounds=30)
    dropped = fault.dropped()
  assert result["echoed"] == 30, result  # every message arrived, through retransmissions
  assert dropped >= 1, dropped
  with pytest.raises(ValueError, match="percent=100"):
    faults.packet_loss(echo.pid, 100)


def _eventually(condition, timeout_s=10.0):
  deadline = time.monotonic() + timeout_s
  while not condition() and time.monotonic() < deadline:
    time.sleep(0.05)
  return condition()


def test_a_delayed_process_answers_a_round_trip_after_twice_the_delay(namespace):
  faults, echo, port = namespace
  with faults.latency(echo.pid, 0.15) as fault:
    delayed = _client(faults, port, rounds=5)
    assert _eventually(lambda: fault.connections == 1)
  assert delayed["echoed"] == 5, delayed
  assert min(delayed["round_trips_s"]) >= 0.3, delayed  # 0.15 s each way, never less
  healed = _client(faults, port, rounds=5)
  assert healed["echoed"] == 5 and fault.connections == 1  # the new connection went direct


def test_a_capped_link_carries_no_more_than_its_bytes_a_second(namespace):
  faults, echo, port = namespace
  with faults.latency(echo.pid, 0.0, bytes_per_s=400_000) as fault:
    capped = _client(faults, port, rounds=2000)  # 200 kB each way through a 400 kB/s link
  assert capped["echoed"] == 2000
  assert sum(capped["round_trips_s"]) >= 0.45, sum(capped["round_trips_s"])
  # Counted from the task's side: it received the 200 kB and sent them back.
  assert fault.bytes_carried == {"in": 200_000, "out": 200_000}


# A server that listens only when told (on the port given on stdin), then echoes.
_LATE_ECHO = r"""
import socket, sys
print("ready", flush=True)
server = socket.socket()
server.bind(("127.0.0.1", int(sys.stdin.readline())))
server.listen(16)
print("listening", flush=True)
c, _ = server.accept()
while True:
  data = c.recv(4096)
  if not data:
    break
  c.sendall(data)
"""


def test_a_task_delayed_before_it_listens_is_reached_through_the_relay(namespace):
  faults = namespace[0]
  late = subprocess.Popen(faults.enter([sys.executable, "-c", _LATE_ECHO]), text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
  try:
    assert late.stdout.readline().strip() == "ready"
    port = 45678  # the namespace is the test's own: nothing else listens in it
    with faults.latency(late.pid, 0.1, ports=[port]) as fault:
      late.stdin.write(f"{port}\n")
      late.stdin.flush()
      assert late.stdout.readline().strip() == "listening"
      delayed = _client(faults, port, rounds=3)
      assert _eventually(lambda: fault.connections == 1)
    assert delayed["echoed"] == 3 and min(delayed["round_trips_s"]) >= 0.2, delayed
    assert fault.bytes_carried == {"in": 300, "out": 300}
  finally:
    late.kill()
    late.wait()


def test_a_delayed_process_reaches_others_through_the_relay_too(namespace, dialer):
  faults, _, port = namespace
  with faults.latency(dialer.pid, 0.05) as fault:
    assert dialer.dial(port) == "connected"
    assert _eventually(lambda: fault.connections == 1)


def test_faults_are_only_made_inside_a_private_namespace(namespace):
  with pytest.raises(netfaults.NetFaultError, match="this machine's own network namespace"):
    netfaults.NetworkFaults(os.getpid())
  faults, _, _ = namespace
  with pytest.raises(netfaults.NetFaultError, match=f"not in the namespace of pid {faults.pid}"):
    faults.cut_off(os.getpid())


def test_a_fault_cgroup_still_busy_for_a_moment_is_removed_once_free(monkeypatch):
  # The kernel can count a moved process in the cgroup for a moment (EBUSY on rmdir): release
  # tries again instead of leaving the fault half healed; a cgroup busy for good is an error.
  sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  name, rmdir, calls = f"tfc_test_busy_{os.getpid()}", os.rmdir, []

  def busy_twice(path):
    calls.append(path)
    if len(calls) <= 2:
      raise OSError(errno.EBUSY, "Device or resource busy", path)
    rmdir(path)

  def always_busy(path):
    raise OSError(errno.EBUSY, "Device or resource busy", path)

  path = None
  try:
    cgroup = netfaults._Cgroup(sleeper.pid, name)
    path = cgroup.path
    monkeypatch.setattr(netfaults.os, "rmdir", busy_twice)
    cgroup.release()
    assert len(calls) == 3 and not os.path.exists(path)
    with open(f"/proc/{sleeper.pid}/cgroup") as f:
      assert name not in f.read()  # back in its own cgroup
    cgroup = netfaults._Cgroup(sleeper.pid, name)
    monkeypatch.setattr(netfaults.os, "rmdir", always_busy)
    with pytest.raises(OSError, match="busy"):
      cgroup.release(timeout_s=0.2)
  finally:
    monkeypatch.undo()
    if path and os.path.exists(path):
      os.rmdir(path)
    sleeper.kill()
    sleeper.wait()
