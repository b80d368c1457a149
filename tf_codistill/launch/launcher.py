"""Starts n codistillation groups on this machine, each a real local TF cluster; supervises them.

A group is one process (``one_device``/``mirrored``) or one process per task of its cluster: chief,
``workers_per_group`` workers and, for ``parameter_server``, ``ps_per_group`` ps tasks. Every task
runs ``python -m tf_codistill.bin.train`` with its own ``TF_CONFIG`` whose addresses are free ports
on 127.0.0.1 (outside the kernel's ephemeral range, distinct within the launch); its log is
``model_dir/group_<i>/<task>_<k>.log``.

Isolation: by default the tasks of every cluster group run inside the launch's one private
network namespace with only loopback up (``isolation.NetworkNamespace``; a one-process group
serves no port and runs outside it): TF's servers listen on all interfaces and run whatever graph
a client sends, so nothing outside the launch may reach them. Where no namespace can be made, or
``isolate_network=False``, the launch refuses to start cluster tasks unless
``allow_exposed_ports=True``, and then warns what is exposed.

Supervision:
- a group is done when its chief exits 0; its remaining tasks (parameter-server workers and ps
  tasks, which serve forever) are then stopped; one of those that ends before (even with
  status 0) has failed;
- a parameter-server worker that dies is restarted (the coordinator reschedules its steps
  meanwhile); any other failed task restarts the whole group, which resumes from its checkpoint;
  at most ``max_restarts`` restarts per group (default ``DEFAULT_MAX_RESTARTS``); the tasks
  that died within ``SETTLE_S`` of the first count as one failure (one restart);
- a task that exits with one of ``errors.PERMANENT_EXIT_CODES`` (configuration error, bad input
  data, non-finite loss) fails its group at once: a restart would fail the same way;
- a group out of restarts has failed: ``on_group_failure='stop_all'`` stops every group,
  ``'continue'`` lets its peers finish (they keep their last teacher); either way ``launch_groups``
  then raises ``GroupFailedError`` naming the group, the task and its log;
- a group whose chief has made no progress for ``stall_timeout_s`` (its heartbeat.json: no step,
  no pulse of an evaluation or export) is hung: every task dumps its stacks into its log
  (SIGUSR1), then the group restarts as if a task had failed, or fails once out of restarts,
  naming the step and the setting; a time the launcher itself was stopped (SIGSTOP of the whole
  job, a suspended machine: a poll due more than ``SUSPENDED_AFTER_S`` earlier) is not counted,
  as the groups were stopped with it;
- Ctrl-Z (SIGTSTP) stops every task with the launcher (tasks run in sessions of their own, which
  the terminal's signal does not reach) and continuing the launcher continues them; the stall
  clocks skip the stop;
- SIGINT/SIGTERM stop every process started (no orphans), a second one included; a launcher
  killed outright (kill -9, out of memory) takes its tasks with it: the kernel sends each task
  SIGKILL when the launcher dies (Linux's parent-death signal), so no parameter server or worker
  serves on forever. (Checkpoints and published versions are written atomically: nothing is lost
  that a restart would not redo.)

``pin_groups`` pins each group's tasks to its own share of the CPUs (``split_cpus``).

Everything the launcher does is also written as one JSON object a line to
``model_dir/launch_events.jsonl`` (``EventLog``; read with ``read_events``): ``network``
(isolated, namespace_pid), ``launched`` (group, task, index, pid, cpus, log, address),
``stalled`` (group, step, seconds), ``suspended`` (seconds; signal ``SIGTSTP`` for a Ctrl-Z),
``restarted`` (group, task, index, status, scope ``task`` or ``group``, restart, max_restarts),
``finished`` (group), ``failed`` (group, task, index, status, reason) and ``interrupted``
(signal), each with ``time`` (epoch seconds) and ``monotonic`` (CLOCK_MONOTONIC, one clock for
every process here).
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from absl import logging

from tf_codistill import errors
from tf_codistill import layout
from tf_codistill.launch import isolation
from tf_codistill.training import group as group_lib

_GRACE_SECONDS = 10.0
_KILL_WAIT_SECONDS = 10.0  # after SIGKILL, for the kernel to end a task
DEFAULT_MAX_RESTARTS = 3
_SYNC_WORKER_FINISH_SECONDS = 60.0
SETTLE_S = 2.0  # tasks lost to one fault (a machine, a group killed) die within this of each other
DEFAULT_STALL_TIMEOUT_S = 1800.0
SUSPENDED_AFTER_S = 60.0  # a poll this late: the launcher (and the job with it) was stopped
_PR_SET_PDEATHSIG = 1  # prctl(2)
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
STALLED_STATUS = -1000  # the status a stalled group's failure is recorded with (no process exit)
FAILURE_POLICIES = ("stop_all", "continue")


class GroupFailedError(RuntimeError):
  """A group failed for good (out of restarts)."""


class Interrupted(KeyboardInterrupt):
  """The launcher was stopped by ``signum`` (SIGINT, SIGTERM); every task was stopped."""

  def __init__(self, signum: int):
    super().__init__(f"signal {signal.Signals(signum).name}")
    self.signum = signum


_NAMESPACE_EPHEMERAL = range(32768, 61000)  # Linux's default, what a new network namespace has


def _ephemeral_ports() -> range:
  """The local ports outgoing connections may take: this machine's range (Linux; its default
  else) and a fresh network namespace's, where isolated tasks run, whatever this one is tuned to."""
  try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
      low, high = (int(x) for x in f.read().split())
  except (OSError, ValueError):
    return _NAMESPACE_EPHEMERAL
  return range(min(low, _NAMESPACE_EPHEMERAL.start), max(high + 1, _NAMESPACE_EPHEMERAL.stop))


def free_port(taken: Set[int]) -> int:
  """A port that is free on every interface now, outside the ephemeral range and ``taken``
  (joins it).

  Outside the ephemeral range, the outgoing connections of tasks already running cannot take
  the port in the seconds before its server binds it (bind(0) ports are ephemeral ones).
  """
  ephemeral = _ephemeral_ports()
  if ephemeral.start > 11000:
    candidates = range(10000, ephemeral.start)
  elif ephemeral.stop < 64536:
    candidates = range(ephemeral.stop, 65536)
  else:  # the ephemeral range is (nearly) everything: take what is free
    candidates = range(10000, 65536)
  for _ in range(200):
    port = random.choice(candidates)
    if port in taken:
      continue
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      try:  # every interface, as a TF server binds: a port held on any of them is taken
        s.bind(("", port))
      except OSError:
        continue
    taken.add(port)
    return port
  raise RuntimeError(f"no free port in {candidates} after 200 tries")


def cluster_spec(shape: group_lib.Group, taken: Optional[Set[int]] = None) -> Dict[str, List[str]]:
  """A TF cluster for ``shape`` on unused 127.0.0.1 ports ({} for a single process).

  ``taken``: ports handed out earlier in the same launch (other groups' tasks, which may not
  have bound theirs yet); the new ports are added to it.
  """
  if not shape.is_cluster:
    return {}
  taken = set() if taken is None else taken
  spec: Dict[str, List[str]] = {}
  for task_type, _ in shape.tasks():
    spec.setdefault(task_type, []).append(f"127.0.0.1:{free_port(taken)}")
  return spec


def train_command(model_dir: str, group: int, num_groups: int, exchange_dir: str,
                  gin_files: Sequence[str], gin_bindings: Sequence[str]) -> List[str]:
  """The command line of one task of one group."""
  cmd = [sys.executable, "-m", "tf_codistill.bin.train", f"--model_dir={model_dir}",
         f"--group={group}", f"--num_groups={num_groups}", f"--exchange_dir={exchange_dir}"]
  cmd += [f"--gin_file={f}" for f in gin_files]
  cmd += [f"--gin_bindings={b}" for b in gin_bindings]
  return cmd


def log_tail(path: str, lines: int = 15) -> str:
  """The last ``lines`` lines of a task log (of at most its last 8 KiB); '' if unreadable."""
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 8192))
      text = f.read().decode("utf-8", "replace")
  except OSError:
    return ""
  return "\n".join(text.splitlines()[-lines:])


def _in_child(cpus: Optional[Set[int]], launcher_pid: int) -> None:
  """Runs in a task between fork and exec: pins it to ``cpus`` (before TF sizes its thread
  pools) and asks the kernel for SIGKILL when the launcher dies."""
  if cpus:
    os.sched_setaffinity(0, cpus)
  if _LIBC is not None:
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher_pid:  # the launcher died before the request
      os._exit(1)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
  try:
    os.killpg(proc.pid, sig)
  except ProcessLookupError:
    pass


def stop_processes(procs: Sequence[subprocess.Popen], grace: float = _GRACE_SECONDS) -> None:
  """SIGTERM every live process and its process group (its children), SIGKILL what is left of
  those groups after ``grace``. The groups of processes that had ended before are not
  signalled: their ids may belong to other processes by now."""
  live = [proc for proc in procs if proc.poll() is None]
  for proc in live:
    _signal_group(proc, signal.SIGTERM)
  deadline = time.monotonic() + grace
  for proc in live:
    try:
      proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      pass
  for proc in live:
    _signal_group(proc, signal.SIGKILL)
    try:
      proc.wait(timeout=_KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired:  # uninterruptible (a hung filesystem): not waited for
      logging.error("pid %d did not end %.0f s after SIGKILL (in uninterruptible sleep?): "
                    "left behind", proc.pid, _KILL_WAIT_SECONDS)


def split_cpus(num_groups: int, cpus: Optional[Set[int]] = None) -> List[Set[int]]:
  """Disjoint, equal shares of ``cpus`` (default: the CPUs this process may run on), one per
  group, as if each group had its own machine."""
  ordered = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
  if len(ordered) < num_groups:
    raise errors.ConfigurationError(f"--pin_groups needs a CPU per group: {num_groups} groups, "
                                    f"{len(ordered)} CPUs ({','.join(map(str, ordered))})")
  share = len(ordered) // num_groups
  return [set(ordered[g * share:(g + 1) * share]) for g in range(num_groups)]


class EventLog:
  """Appends the launcher's events to ``path`` as JSON lines, one complete line per event."""

  def __init__(self, path: str):
    self.path = path
    self._lock = threading.Lock()

  def write(self, event: str, **fields) -> None:
    record = {"event": event, "time": time.time(), "monotonic": time.monotonic(), **fields}
    with self._lock, open(self.path, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")


def read_events(model_dir: str) -> List[dict]:
  """The events a launch into ``model_dir`` has written so far (a line being written is left
  for the next read)."""
  path = layout.launch_events(model_dir)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f.read().split("\n")[:-1] if line]


def task_pids(events: Sequence[dict]) -> Dict[Tuple[int, str, int], int]:
  """(group, task type, index) -> the newest pid launched for it."""
  return {(e["group"], e["task"], e["index"]): e["pid"] for e in events
          if e["event"] == "launched"}


class _Group:
  """The processes of one group and its restart bookkeeping."""

  def __init__(self, index: int, num_groups: int, shape: group_lib.Group, model_dir: str,
               exchange_dir: str, gin_files: Sequence[str], gin_bindings: Sequence[str],
               ports: Set[int], events: EventLog, cpus: Optional[Set[int]] = None,
               network: Optional[isolation.NetworkNamespace] = None):
    self.index = index
    self.network = network  # the launch's private network namespace (None: this machine's)
    self.events = events
    self.cpus = cpus  # CPUs every task of the group is pinned to (None: not pinned)
    self.ports = ports  # every port of this launch, shared by its groups
    self.shape = shape
    self.dir = layout.group_dir(model_dir, index)
    self.command = train_command(self.dir, index, num_groups, exchange_dir, gin_files,
                                 [*gin_bindings, *shape.shape_bindings()])
    self.procs: Dict[Tuple[str, int], subprocess.Popen] = {}
    self.cluster: Dict[str, List[str]] = {}
    self.restarts = 0
    # The chief's newest heartbeat progress (step, phase, pulses between steps).
    self.progress_mark: Optional[Tuple] = None
    self.progress_at = time.monotonic()  # when it last changed (or the group started)
    self.chief_done_at: Optional[float] = None
    self.done = False
    self.failed: Optional[str] = None

  def log_path(self, task: Tuple[str, int]) -> str:
    return layout.RunDir(self.dir).task_log(*task)

  def heartbeat(self) -> Optional[Tuple]:
    """The progress mark of the chief's heartbeat.json: (step, phase, pulses between steps: an
    evaluation or export going on), None before one is readable."""
    try:
      with open(layout.RunDir(self.dir).heartbeat) as f:
        record = json.load(f)
      return int(record["step"]), record.get("phase"), record.get("beats")
    except (OSError, ValueError, KeyError, TypeError):
      return None

  def start_all(self) -> None:
    os.makedirs(self.dir, exist_ok=True)
    self.cluster = cluster_spec(self.shape, self.ports)
    self.chief_done_at = None
    self.progress_mark, self.progress_at = self.heartbeat(), time.monotonic()
    for task in self.shape.tasks():
      self.start(task)

  def start(self, task: Tuple[str, int]) -> None:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    if self.cluster:
      env["TF_CONFIG"] = json.dumps({"cluster": self.cluster,
                                    "task": {"type": task[0], "index": task[1]}})
    cpus, launcher_pid = self.cpus, os.getpid()
    with open(self.log_path(task), "ab") as log:
      # Own session: a terminal's Ctrl-C reaches the launcher, which stops tasks in order.
      command = self.network.command(self.command) if self.network else self.command
      self.procs[task] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env,
                                          start_new_session=True,
                                          preexec_fn=lambda: _in_child(cpus, launcher_pid))
    logging.info("launched group %d %s:%d (pid %d)%s, log %s", self.index, task[0], task[1],
                 self.procs[task].pid,
                 f" on CPUs {','.join(map(str, sorted(cpus)))}" if cpus else "",
                 self.log_path(task))
    self.events.write("launched", group=self.index, task=task[0], index=task[1],
                      pid=self.procs[task].pid, cpus=sorted(cpus) if cpus else None,
                      log=self.log_path(task),
                      address=self.cluster[task[0]][task[1]] if self.cluster else None)

  def stop_all(self) -> None:
    stop_processes(list(self.procs.values()))

  def running(self) -> bool:
    return not self.done and self.failed is None


def private_network(isolate_network: bool = True,
                    allow_exposed_ports: bool = False) -> Optional[isolation.NetworkNamespace]:
  """The launch's private network namespace, or None where its tasks are to share this
  machine's network: allowed only with ``allow_exposed_ports`` (then a warning says what is
  exposed); a ConfigurationError otherwise."""
  if isolate_network:
    try:
      return isolation.NetworkNamespace()
    except isolation.IsolationError as e:
      reason = f"no private network namespace can be made here ({e})"
  else:
    reason = "isolate_network is off"
  if not allow_exposed_ports:
    raise errors.ConfigurationError(
        f"{reason}: the tasks' TF servers would listen on every interface of this machine and "
        "run any graph sent to them, unauthenticated. Run as root or allow unprivileged user "
        "namespaces (sysctl kernel.unprivileged_userns_clone=1), or pass --allow_exposed_ports "
        "to start them anyway on a machine only you can reach")
  logging.warning("%s: every task's TF server listens on all interfaces of this machine "
                  "(its ports are in launch_events.jsonl) and runs any graph sent to it, "
                  "unauthenticated (--allow_exposed_ports)", reason)
  return None


def launch_groups(model_dir: str, num_groups: int, *, exchange_dir: Optional[str] = None,
                  gin_files: Sequence[str] = (), gin_bindings: Sequence[str] = (),
                  shape: Optional[group_lib.Group] = None, max_restarts: int = DEFAULT_MAX_RESTARTS,
                  on_group_failure: str = "stop_all", poll_seconds: float = 0.5,
                  groups: Optional[Sequence[int]] = None, pin_groups: bool = False,
                  isolate_network: bool = True, allow_exposed_ports: bool = False,
                  stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S) -> Dict[int, str]:
  """Runs ``num_groups`` groups of ``shape`` to completion; returns each group's model dir.

  ``shape`` (a ``tfc.Group``; default: one process per group) gives the tasks to start and
  their strategy; its ``allreduce_dtype`` is not read here: the tasks take it, like every other
  setting, from the gin configuration (``launch_job`` checks that configuration first).
  ``groups`` runs only those of the ``num_groups`` groups here (the others run elsewhere, or
  are frozen teachers already published to the exchange). ``pin_groups`` pins each group's
  tasks to its own share of this machine's CPUs (split_cpus). ``isolate_network`` and
  ``allow_exposed_ports``: see ``private_network``. ``stall_timeout_s``: a group whose chief's
  step does not move for this long (a hang: a lost peer, a stalled filesystem) dumps every
  task's stacks and is restarted like a failed one (0: never). Raises ConfigurationError on bad
  arguments, GroupFailedError when a group fails for good.
  """
  if num_groups < 1:
    raise errors.ConfigurationError(f"--num_groups={num_groups} must be >= 1")
  indices = list(range(num_groups)) if groups is None else list(groups)
  if not indices or any(not 0 <= g < num_groups for g in indices):
    raise errors.ConfigurationError(
        f"groups={groups} must be a non-empty subset of 0..{num_groups - 1}")
  if on_group_failure not in FAILURE_POLICIES:
    raise errors.ConfigurationError(
        f"--on_group_failure={on_group_failure!r} is not one of {FAILURE_POLICIES}")
  if max_restarts < 0:
    raise errors.ConfigurationError(f"--max_restarts={max_restarts} must be >= 0")
  if stall_timeout_s < 0:
    raise errors.ConfigurationError(f"--stall_timeout_s={stall_timeout_s} must be >= 0")
  shape = shape or group_lib.Group("one_device", 0, 0, "float32")
  shape.check_startable()
  exchange_dir = exchange_dir or layout.exchange_dir(model_dir)
  os.makedirs(model_dir, exist_ok=True)
  shares: List[Optional[Set[int]]] = (list(split_cpus(len(indices))) if pin_groups
                                       else [None] * len(indices))
  network = private_network(isolate_network, allow_exposed_ports) if shape.is_cluster else None
  events = EventLog(layout.launch_events(model_dir))
  events.write("network", isolated=network is not None,
               namespace_pid=network.pid if network else None)
  ports: Set[int] = set()
  running = [_Group(g, num_groups, shape, model_dir, exchange_dir, gin_files, list(gin_bindings),
                    ports, events, cpus, network) for g, cpus in zip(indices, shares)]
  try:
    _run(running, max_restarts, on_group_failure, poll_seconds, stall_timeout_s)
  finally:
    if network:
      network.close()
  failed = [g.failed for g in running if g.failed]
  if failed:
    raise GroupFailedError("\n".join(failed))
  return {g.index: g.dir for g in running}


def _run(groups: Sequence[_Group], max_restarts: int, on_group_failure: str,
         poll_seconds: float, stall_timeout_s: float = 0.0) -> None:
  """Starts the groups and supervises them until each has finished or failed; on SIGINT or
  SIGTERM, or when a group fails under ``stop_all``, every process started is stopped."""

  def on_signal(signum, frame):
    raise Interrupted(signum)

  def on_terminal_stop(signum, frame):
    nonlocal polled  # the poll loop must not take the stop for a suspension again
    polled += _stop_job(groups)

  # Only the main thread may set handlers; a launch from another thread (benchmarks running
  # several at once) is stopped by its caller's process ending, or runs to its end.
  main = threading.current_thread() is threading.main_thread()
  previous = ({s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
              if main else {})
  polled = time.monotonic()
  previous_stop = signal.signal(signal.SIGTSTP, on_terminal_stop) if main else None
  try:
    for group in groups:
      group.start_all()
    polled = time.monotonic()
    while any(g.running() for g in groups):
      polled = _discount_suspension(groups, polled, poll_seconds)
      for group in groups:
        if group.running():
          _supervise(group, max_restarts)
          if group.running() and not group.chief_done_at:
            _check_progress(group, stall_timeout_s, max_restarts)
          if group.failed and on_group_failure == "stop_all":
            raise GroupFailedError(group.failed)
      time.sleep(poll_seconds)
  except Interrupted as e:
    if groups:
      groups[0].events.write("interrupted", signal=signal.Signals(e.signum).name)
    raise
  finally:
    for s in previous:  # a second signal must not cut the clean-up short, orphaning tasks
      signal.signal(s, signal.SIG_IGN)
    stop_processes([p for g in groups for p in g.procs.values()])
    for s, handler in previous.items():
      signal.signal(s, handler)
    if main:  # None: a handler not set from Python, which cannot be put back; the default then
      signal.signal(signal.SIGTSTP, signal.SIG_DFL if previous_stop is None else previous_stop)


def _stop_job(groups: Sequence[_Group]) -> float:
  """Ctrl-Z (SIGTSTP): every task stops with the launcher (each runs in a process group of its
  own, which the terminal's signal does not reach) and goes on when the launcher is continued
  (fg, bg, SIGCONT). The stall clocks skip the stop, however short (recorded as ``suspended``).
  Returns how long it lasted."""
  procs = [p for g in groups for p in g.procs.values() if p.poll() is None]
  logging.warning("stopped (SIGTSTP): stopping the launcher and its %d tasks until SIGCONT",
                  len(procs))
  for proc in procs:
    _signal_group(proc, signal.SIGSTOP)
  stopped_at = time.monotonic()
  os.kill(os.getpid(), signal.SIGSTOP)  # returns once the launcher is continued
  stopped_s = time.monotonic() - stopped_at
  for proc in procs:
    _signal_group(proc, signal.SIGCONT)
  _skip_stall_clocks(groups, stopped_s, signal="SIGTSTP")
  logging.warning("continued after %.0f s: %d tasks continued with the launcher", stopped_s,
                  len(procs))
  return stopped_s


def _discount_suspension(groups: Sequence[_Group], polled: float, poll_seconds: float) -> float:
  """Stops the stall clocks for a time the launcher was stopped: a poll more than
  SUSPENDED_AFTER_S later than due (CLOCK_MONOTONIC runs on while a process is stopped, and the
  groups stopped with the job would look hung when it resumes). Returns this poll's time."""
  now = time.monotonic()
  late = now - polled - poll_seconds
  if late > SUSPENDED_AFTER_S:
    logging.warning("the launcher resumed after %.0f s stopped (SIGSTOP or a suspended machine): "
                    "the stall watchdog does not count them", late)
    _skip_stall_clocks(groups, late)
  return now


def _skip_stall_clocks(groups: Sequence[_Group], seconds: float, **event: Any) -> None:
  """Moves every group's stall clock past a time the job was stopped, recorded as
  ``suspended`` (with ``event``'s fields)."""
  for group in groups:
    group.progress_at += seconds
  if groups:
    groups[0].events.write("suspended", seconds=seconds, **event)


def _fail(group: _Group, task: Tuple[str, int], status: int, what: str) -> None:
  """Marks ``group`` failed for good because ``task`` ``what``: logged with its log's tail,
  recorded in the events, every task stopped."""
  log = group.log_path(task)
  group.failed = f"group {group.index} {task[0]}:{task[1]} {what}; log {log}:\n{log_tail(log)}"
  logging.error("%s", group.failed)
  group.events.write("failed", group=group.index, task=task[0], index=task[1], status=status,
                     reason=group.failed.splitlines()[0])
  group.stop_all()


def _describe(status: int) -> str:
  """An exit status as people read it: 'status 1', 'signal SIGKILL'."""
  if status < 0:
    try:
      return f"signal {signal.Signals(-status).name}"
    except ValueError:
      return f"signal {-status}"
  return f"status {status}"


def _supervise(group: _Group, max_restarts: int) -> None:
  """One look at a group's processes: finish, restart or fail it."""
  chief = group.procs[("chief", 0)]
  code = chief.poll()
  if code == 0:
    # Parameter-server workers and ps tasks serve until stopped; sync workers end by themselves,
    # give or take their clean-up.
    finishing = [task for task, proc in group.procs.items()
                 if proc.poll() is None and group.shape.strategy == "multi_worker_mirrored"]
    if group.chief_done_at is None:
      group.chief_done_at = time.monotonic()
    if finishing and time.monotonic() - group.chief_done_at < _SYNC_WORKER_FINISH_SECONDS:
      return
    if finishing:
      logging.warning("group %d: %s still running %.0fs after the chief finished; their stacks "
                      "go to their logs, then they are stopped", group.index,
                      ", ".join(f"{t}:{k}" for t, k in finishing), _SYNC_WORKER_FINISH_SECONDS)
      for task in finishing:
        group.procs[task].send_signal(signal.SIGUSR1)  # tf-codistill-train dumps its stacks
      time.sleep(1.0)
    logging.info("group %d finished", group.index)
    group.events.write("finished", group=group.index)
    group.done = True
    group.stop_all()
    return
  first = _dead_tasks(group)
  if not first:
    return
  # One more look a moment later sees every task one fault took, so that they cost one restart
  # of the right scope (not a worker's restart, then the group's for its chief, gone a bit later).
  # The cause named is a task seen dead first (the chief of a killed ps dies of it moments later).
  time.sleep(SETTLE_S)
  if chief.poll() == 0:  # training ended meanwhile (a task died in its clean-up): finished
    logging.warning("group %d: %s exited with %s as its chief finished", group.index,
                    ", ".join(f"{t}:{k}" for (t, k), _ in first), _describe(first[0][1]))
    return  # the next look takes the finished path
  dead = _dead_tasks(group)
  task, status = first[0]
  permanent = [(t, code) for t, code in dead if code in errors.PERMANENT_EXIT_CODES]
  if permanent:
    task, status = permanent[0]
    _fail(group, task, status, f"stopped on a {errors.PERMANENT_EXIT_CODES[status]} (exit status "
                               f"{status}), not restarted")
    return
  worker_only = (group.shape.strategy == "parameter_server"
                 and all(t[0] == "worker" for t, _ in dead))
  what = f"exited with {_describe(status)}" + (
      " while its chief trains (parameter-server tasks serve until stopped)" if status == 0 else "")
  _restart(group, task, status, what, max_restarts, [t for t, _ in dead] if worker_only else None)


def _dead_tasks(group: _Group) -> List[Tuple[Tuple[str, int], int]]:
  """The group's tasks that failed, with their exit statuses. Synchronous workers finish by
  themselves, status 0, just before their chief; parameter-server workers and ps tasks serve
  until stopped, so one that ended while its chief trains failed, whatever its status."""
  serving = group.shape.strategy == "parameter_server"
  return [(task, proc.returncode) for task, proc in group.procs.items()
          if proc.poll() is not None and (proc.returncode != 0 or (serving and task[0] != "chief"))]


def _restart(group: _Group, task: Tuple[str, int], status: int, what: str, max_restarts: int,
             workers: Optional[List[Tuple[str, int]]] = None) -> None:
  """Restarts ``workers`` alone (parameter-server workers) or the whole group, because ``task``
  ``what``; fails the group once it is out of restarts."""
  if group.restarts >= max_restarts:
    _fail(group, task, status, f"{what}; out of restarts (--max_restarts={max_restarts})")
    return
  group.restarts += 1
  group.events.write("restarted", group=group.index, task=task[0], index=task[1], status=status,
                     scope="task" if workers else "group", restart=group.restarts,
                     max_restarts=max_restarts)
  if workers:
    logging.warning("group %d: %s:%d %s; restarting it (restart %d/%d); training goes on "
                    "meanwhile (the coordinator reschedules its steps)", group.index, task[0],
                    task[1], what, group.restarts, max_restarts)
    for worker in workers:
      group.start(worker)
    return
  logging.warning("group %d: %s:%d %s; restarting the group from its last checkpoint "
                  "(restart %d/%d)", group.index, task[0], task[1], what, group.restarts,
                  max_restarts)
  group.stop_all()
  group.start_all()


def _check_progress(group: _Group, stall_timeout_s: float, max_restarts: int) -> None:
  """Restarts (or fails) a group whose chief has made no progress for ``stall_timeout_s``: no
  step, and no pulse of an evaluation or export between steps (heartbeat.json; counted from the
  group's start until its first heartbeat), after every task dumped its stacks into its log."""
  mark = group.heartbeat()
  step = mark and mark[0]
  now = time.monotonic()
  if mark != group.progress_mark:  # a step, or a pulse of an evaluation or export
    group.progress_mark, group.progress_at = mark, now
    return
  if not stall_timeout_s or now - group.progress_at < stall_timeout_s:
    return
  where = "before its first step" if step is None else f"at step {step}"
  logging.error("group %d made no progress for %.0f s (no step, evaluation or export; %s): "
                "every task dumps its stacks into its log", group.index, now - group.progress_at,
                where)
  for proc in group.procs.values():
    if proc.poll() is None:
      proc.send_signal(signal.SIGUSR1)  # tf-codistill-train dumps its stacks
  time.sleep(1.0)
  chief = group.procs.get(("chief", 0))
  if chief is not None and chief.poll() == 0:  # it ended meanwhile: finished, not stalled
    return
  group.events.write("stalled", group=group.index, step=step, seconds=now - group.progress_at)
  _restart(group, ("chief", 0), STALLED_STATUS,
           f"made no progress for {stall_timeout_s:.0f} s (no step, evaluation or export; {where}; "
           "--stall_timeout_s)",
           max_restarts)
