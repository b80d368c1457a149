"""Network faults made for real inside a private network namespace: a task cut off from every
other (a partition), losing a share of its packets, or reached through added latency.

The faults go into a namespace this machine made (``isolation.NetworkNamespace``, which every local
launch runs its tasks in, or one a test makes itself), entered with ``nsenter``; nothing outside
it is touched. The task's process stays alive: these are the faults a multi-machine job meets as
hangs, not crashes.

- ``cut_off`` and ``packet_loss``: nftables rules in a table of the fault's own
  (``inet tfc_fault_<n>``) drop the task's packets (all of them, or each with a probability),
  as a dead or lossy link does (dropped, not refused; TCP resends through loss). The task is
  matched by its sockets: those it has open (by their ports, from ``/proc/<pid>``), and every
  one it opens while the fault lasts (its process is moved into a cgroup of the fault's own,
  matched with ``socket cgroupv2``). Healing deletes the table and moves the process back.
- ``latency``: this kernel family ships without ``sch_netem``, so delay is made by a relay inside
  the namespace (``tf_codistill/testing/relay.py``) that holds every chunk, each way, for
  ``delay_s`` before passing it on to where the connection was addressed, and with a rate cap
  carries at most so many bytes a second in each direction (a slow link); nftables NAT rules
  redirect the task's new connections (its cgroup) and new connections to its ports through it (the
  relay's own connections carry a mark the rules skip). Connections open before the fault keep their
  direct path, so a whole-run latency is installed as the task starts (``connections`` counts what
  went through it, ``bytes_carried`` the bytes it carried each way).

Needs root (nftables in the namespace, cgroups), the ``nft`` tool (Debian's ``nftables``) and a
cgroup v2 hierarchy; ``unavailable()`` says what is missing.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import List, Optional, Sequence, Set

from tf_codistill import testing

_ESTABLISHED = "01"  # /proc/net/tcp's st column (hex) of a connected socket
RELAY_MARK = 0x7466  # packets of the relay's own connections: never redirected again
_ids = itertools.count()

CGROUP_ROOT = "/sys/fs/cgroup"  # where nft resolves ``socket cgroupv2`` paths


class NetFaultError(RuntimeError):
  """A fault could not be made or healed (names the namespace and the tool's message)."""


def cgroup2_mount() -> Optional[str]:
  """Where this machine's cgroup v2 hierarchy is mounted (under CGROUP_ROOT), or None."""
  with open("/proc/self/mounts") as f:
    for line in f:
      _, where, kind = line.split()[:3]
      if kind == "cgroup2" and (where + "/").startswith(CGROUP_ROOT + "/"):
        return where
  return None


def unavailable() -> Optional[str]:
  """Why network faults cannot be made on this machine, or None when they can."""
  if os.geteuid() != 0:
    return "network faults need root (nftables rules inside the namespace, cgroups)"
  missing = [tool for tool in ("nft", "nsenter") if shutil.which(tool) is None]
  if missing:
    return (f"{' and '.join(missing)} not found: install Debian's "
            f"{'nftables' if 'nft' in missing else 'util-linux'}")
  mount = cgroup2_mount()
  if mount is None:
    return f"no cgroup v2 hierarchy mounted under {CGROUP_ROOT}"
  probe = os.path.join(mount, f"tfc_fault_probe_{os.getpid()}")
  try:
    os.mkdir(probe)
    os.rmdir(probe)
  except OSError as e:
    return f"cannot make a cgroup in {mount}: {e.strerror}"
  return None


def socket_ports(pid: int, connected_only: bool = False) -> Set[int]:
  """The local TCP ports of every socket process ``pid`` has open (listening or connected;
  ``connected_only``: only the connected ones)."""
  inodes = set()
  for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
      link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:  # closed meanwhile
      continue
    if link.startswith("socket:["):
      inodes.add(link[len("socket:["):-1])
  ports = set()
  for table in ("tcp", "tcp6"):
    with open(f"/proc/{pid}/net/{table}") as f:
      next(f)
      for line in f:
        fields = line.split()
        if fields[9] in inodes and (not connected_only or fields[3] == _ESTABLISHED):
          ports.add(int(fields[1].rsplit(":", 1)[1], 16))
  return ports


class _Cgroup:
  """A cgroup v2 of one fault: the victim's process is moved in (its new sockets belong to it)
  and back to where it was on ``release``."""

  def __init__(self, pid: int, name: str):
    mount = cgroup2_mount()
    assert mount is not None  # unavailable() checked it
    self._mount, self.path = mount, os.path.join(mount, name)
    with open(f"/proc/{pid}/cgroup") as f:
      self._home = next(line.strip()[len("0::"):] for line in f if line.startswith("0::"))
    os.makedirs(self.path)
    with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
      f.write(str(pid))

  @property
  def match(self) -> str:
    """The nftables match of packets of sockets made in this cgroup."""
    return f'socket cgroupv2 level 1 "{os.path.relpath(self.path, CGROUP_ROOT)}"'

  def release(self, timeout_s: float = 5.0) -> None:
    """Moves every process in it back to the victim's cgroup and removes it. A process it
    started meanwhile, or one the kernel still counts while it exits, keeps the cgroup busy for
    a moment: moved and tried again, for up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
      with open(os.path.join(self.path, "cgroup.procs")) as f:
        pids = f.read().split()
      for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
          with open(os.path.join(self._mount, self._home.lstrip("/"), "cgroup.procs"), "w") as f:
            f.write(pid)
      try:
        os.rmdir(self.path)
        return
      except OSError as e:
        if e.errno != errno.EBUSY or time.monotonic() > deadline:
          raise
      time.sleep(0.05)


class Fault:
  """One fault in force; ``heal`` removes it (idempotent)."""

  def __init__(self, faults: "NetworkFaults", table: str, family: str, what: str,
               relay: Optional[subprocess.Popen] = None, cgroup: Optional[_Cgroup] = None):
    self._faults, self.table, self._family, self.what = faults, table, family, what
    self._relay, self._cgroup = relay, cgroup
    self.connections = 0  # connections that went through the latency relay (0 for other faults)
    self._carried = {"out": 0, "in": 0}
    self.healed = False
    self._counter = threading.Thread(target=self._count, daemon=True)
    if relay is not None:
      self._counter.start()

  def _count(self) -> None:
    for line in self._relay.stdout:
      words = line.split()
      if words == [b"connection"]:
        self.connections += 1
      elif len(words) == 3 and words[0] == b"bytes":
        self._carried = {"out": int(words[1]), "in": int(words[2])}

  @property
  def bytes_carried(self) -> dict:
    """Bytes the latency relay carried so far each way: ``out`` the task sent, ``in`` it
    received (zeros for other faults)."""
    return dict(self._carried)

  def dropped(self) -> int:
    """Packets the fault's rules have dropped so far (0 for latency, and once healed)."""
    if self.healed:
      return 0
    listing = json.loads(self._faults.nft("", "-j", "list", "table", self._family, self.table))
    return sum(expr["counter"]["packets"] for item in listing["nftables"] if "rule" in item
               for expr in item["rule"]["expr"] if "counter" in expr)

  def heal(self) -> None:
    """Removes the fault's rules (and stops its relay, releases its cgroup): packets flow as
    before."""
    if self.healed:
      return
    if self._faults.alive():  # else the namespace, and its rules, ended with its launch
      self._faults.nft(f"delete table {self._family} {self.table}\n")
    if self._relay is not None:
      self._relay.terminate()  # it prints its final counts first
      try:
        self._relay.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self._relay.kill()
        self._relay.wait()
      self._counter.join(timeout=10)
    if self._cgroup is not None:
      self._cgroup.release()
    self.healed = True

  def __enter__(self) -> "Fault":
    return self

  def __exit__(self, *exc) -> None:
    self.heal()


class NetworkFaults:
  """Makes faults in the network namespace of process ``namespace_pid`` (a launch's
  ``network`` event names it; ``isolation.NetworkNamespace.pid``)."""

  def __init__(self, namespace_pid: int):
    reason = unavailable()
    if reason:
      raise NetFaultError(reason)
    if os.readlink(f"/proc/{namespace_pid}/ns/net") == os.readlink("/proc/self/ns/net"):
      raise NetFaultError(f"process {namespace_pid} is in this machine's own network namespace: "
                          "faults are only made inside a private one")
    self.pid = namespace_pid
    self.faults: List[Fault] = []

  def alive(self) -> bool:
    """Whether the namespace's holder still runs (a launch's ends with the launch)."""
    return os.path.exists(f"/proc/{self.pid}/ns/net")

  def enter(self, command: List[str]) -> List[str]:
    """``command`` run inside the namespace."""
    return ["nsenter", f"--net=/proc/{self.pid}/ns/net", "--", *command]

  def nft(self, script: str = "", *args: str) -> str:
    """Runs ``nft -f -`` on ``script`` (or ``nft args``) inside the namespace; returns its
    output."""
    proc = subprocess.run(self.enter(["nft", *(args or ("-f", "-"))]), input=script.encode(),
                          capture_output=True, check=False)
    if proc.returncode:
      raise NetFaultError(f"nft in the namespace of pid {self.pid} failed: "
                          f"{proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode()

  def wait_inside(self, pid: int, timeout_s: float = 30.0) -> None:
    """Waits until process ``pid`` (e.g. just started through ``nsenter``) is in the namespace;
    NetFaultError if it is not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
      try:
        self._check_inside(pid)
        return
      except NetFaultError:
        if time.monotonic() > deadline:
          raise
        time.sleep(0.02)

  def _check_inside(self, pid: int) -> None:
    try:
      inside = os.readlink(f"/proc/{pid}/ns/net") == os.readlink(f"/proc/{self.pid}/ns/net")
    except FileNotFoundError:
      raise NetFaultError(f"process {pid} or the namespace's holder {self.pid} is gone") from None
    if not inside:
      raise NetFaultError(f"process {pid} is not in the namespace of pid {self.pid}")

  def _drop(self, pid: int, action: str, what: str) -> Fault:
    """A table whose rules apply ``action`` to every packet process ``pid``'s sockets send or
    are sent."""
    self._check_inside(pid)
    table = f"tfc_fault_{os.getpid()}_{next(_ids)}"
    ports = ", ".join(map(str, sorted(socket_ports(pid))))
    cgroup = _Cgroup(pid, table)
    old = ([f"tcp sport {{ {ports} }} {action}", f"tcp dport {{ {ports} }} {action}"]
           if ports else [])
    try:
      self.nft(_table(table, {"output": [f"{cgroup.match} {action}", *old],
                              "input": [f"{cgroup.match} {action}"]}))
    except NetFaultError:
      cgroup.release()
      raise
    fault = Fault(self, table, "inet", what, cgroup=cgroup)
    self.faults.append(fault)
    return fault

  def cut_off(self, pid: int) -> Fault:
    """Drops every packet of process ``pid`` (a task) and every packet sent to it: it is alive
    but unreachable, and reaches no one."""
    return self._drop(pid, "counter drop", f"process {pid} cut off")

  def packet_loss(self, pid: int, percent: int) -> Fault:
    """Drops ``percent``% of the packets of process ``pid`` and of those sent to it, each at
    random."""
    if not 0 < percent < 100:
      raise ValueError(f"percent={percent} must be in (0, 100)")
    return self._drop(pid, f"numgen random mod 100 < {percent} counter drop",
                      f"{percent}% packet loss at process {pid}")

  def latency(self, pid: int, delay_s: float, bytes_per_s: Optional[float] = None,
              timeout_s: float = 30.0, ports: Sequence[int] = ()) -> Fault:
    """Every new connection of process ``pid`` (a task), and to its ports, goes through a relay
    that delays each chunk, each way, by ``delay_s`` (a round trip takes ``2 * delay_s``
    longer) and carries at most ``bytes_per_s`` each way (None: no cap), as a slow link to the
    task would. ``ports``: ports of the task it does not listen on yet (its server's, from the
    cluster spec, for a fault made as it starts). Connections open before the fault keep their
    direct path."""
    self._check_inside(pid)
    relay = subprocess.Popen(
        self.enter([sys.executable, "-m", "tf_codistill.testing.relay", str(delay_s),
                    str(RELAY_MARK), str(bytes_per_s or 0)]),
        cwd=testing.PACKAGE_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True)
    timer = threading.Timer(timeout_s, relay.kill)
    timer.start()
    line = relay.stdout.readline().split()
    timer.cancel()
    if len(line) != 2 or not all(word.isdigit() for word in line):
      relay.kill()
      raise NetFaultError(f"the latency relay in the namespace of pid {self.pid} did not start")
    outgoing, incoming = (int(word) for word in line)
    table = f"tfc_fault_{os.getpid()}_{next(_ids)}"
    own = ", ".join(map(str, sorted(socket_ports(pid) | set(ports))))
    cgroup = _Cgroup(pid, table)
    skip = f"meta mark != {RELAY_MARK:#x}"
    rules = [f"{skip} {cgroup.match} tcp dport != {{ {outgoing}, {incoming} }} "
             f"redirect to :{outgoing}",
             *([f"{skip} tcp dport {{ {own} }} redirect to :{incoming}"] if own else [])]
    try:
      self.nft(_table(table, {"output": rules}, family="ip", kind="nat", priority=-100))
    except NetFaultError:
      relay.kill()
      cgroup.release()
      raise
    cap = f", {bytes_per_s * 8 / 1e6:g} Mbit/s" if bytes_per_s else ""
    fault = Fault(self, table, "ip", f"{delay_s * 1000:g} ms each way{cap} at process {pid}",
                  relay, cgroup)
    self.faults.append(fault)
    return fault

  def heal_all(self) -> None:
    """Removes every fault this object made."""
    for fault in self.faults:
      fault.heal()


def _table(name: str, chains: dict, family: str = "inet", kind: str = "filter",
           priority: int = 0) -> str:
  """An nftables script of one table: ``chains`` maps a hook to its rules."""
  lines = [f"table {family} {name} {{"]
  for hook, rules in chains.items():
    lines += [f"  chain {hook} {{", f"    type {kind} hook {hook} priority {priority}; "
              "policy accept;", *(f"    {rule}" for rule in rules), "  }"]
  return "\n".join(lines + ["}", ""])
