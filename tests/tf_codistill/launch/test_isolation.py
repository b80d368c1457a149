"""Private network namespaces for local launches, and the refusal to expose ports without one."""

import logging
import os
import subprocess
import sys

import pytest

from tf_codistill import errors
from tf_codistill.launch import isolation
from tf_codistill.launch import launcher

# Listens on every interface (as TF's servers do), checks its own loopback, says so, then waits.
SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", 0)); s.listen()
socket.create_connection(("127.0.0.1", s.getsockname()[1])).close()
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""
PROBE = """
import socket, sys
try:
  socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close()
  print("reached")
except OSError as e:
  print(type(e).__name__)
"""


def _probe(port, namespace=None):
  command = [sys.executable, "-c", PROBE, str(port)]
  if namespace:
    command = namespace.command(command)
  return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout.strip()


def test_a_server_in_a_namespace_is_reachable_only_from_inside_it():
  with isolation.NetworkNamespace() as first, isolation.NetworkNamespace() as second:
    server = subprocess.Popen(first.command([sys.executable, "-c", SERVER]),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
      port = int(server.stdout.readline())
      assert os.readlink(f"/proc/{server.pid}/ns/net") != os.readlink("/proc/self/ns/net")
      assert _probe(port, first) == "reached"  # the positive control
      assert _probe(port) == "ConnectionRefusedError"  # this machine's network
      assert _probe(port, second) == "ConnectionRefusedError"  # another launch's namespace
    finally:
      server.stdin.close()
      server.wait(timeout=30)


def test_the_namespace_ends_with_its_holder():
  namespace = isolation.NetworkNamespace()
  holder = namespace.pid
  assert os.path.exists(f"/proc/{holder}/ns/net")
  namespace.close()
  assert not os.path.exists(f"/proc/{holder}")  # exited and reaped


@pytest.fixture
def no_util_linux(monkeypatch, tmp_path):
  """A PATH without unshare and nsenter (as on a machine without util-linux)."""
  monkeypatch.setenv("PATH", str(tmp_path))


def test_without_unshare_no_namespace_is_made_and_the_launch_refuses(no_util_linux):
  with pytest.raises(isolation.IsolationError,
                     match=r"unshare and nsenter \(util-linux\) not found"):
    isolation.NetworkNamespace()
  with pytest.raises(errors.ConfigurationError,
                     match=r"no private network namespace can be made here "
                           r".*--allow_exposed_ports"):
    launcher.private_network(isolate_network=True, allow_exposed_ports=False)


def test_exposed_ports_only_when_allowed_and_then_with_a_warning(no_util_linux, caplog):
  with pytest.raises(errors.ConfigurationError, match="isolate_network is off: .*unauthenticated"):
    launcher.private_network(isolate_network=False, allow_exposed_ports=False)
  with caplog.at_level(logging.WARNING):
    assert launcher.private_network(isolate_network=True, allow_exposed_ports=True) is None
  assert "listens on all interfaces of this machine" in caplog.text
  assert "--allow_exposed_ports" in caplog.text


def test_a_negative_restart_budget_is_refused_and_the_default_survives_faults(tmp_path):
  with pytest.raises(errors.ConfigurationError, match=r"--max_restarts=-1 must be >= 0"):
    launcher.launch_groups(str(tmp_path), 1, max_restarts=-1)
  assert launcher.DEFAULT_MAX_RESTARTS == 3


def test_loopback_is_up_in_the_namespace():
  with isolation.NetworkNamespace() as namespace:
    out = subprocess.run(namespace.command(
        [sys.executable, "-c", "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
         "s.listen(); socket.create_connection(s.getsockname()).close(); print('ok')"]),
        capture_output=True, text=True, timeout=60)
  assert out.stdout.strip() == "ok", out.stderr
