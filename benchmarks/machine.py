"""One benchmark at a time, on a quiet machine: an exclusive lock and the load around every figure.

Every benchmark (``benchmarks.run``) runs inside ``exclusive``: it
takes an exclusive ``flock`` on one lock file per machine, so a second benchmark refuses to start
(naming the one that runs) instead of measuring beside it; the test suite takes the same lock
shared (tests/conftest.py), so benchmarks and tests exclude each other too. Before each measured
run ``settle`` waits for the 1-minute load average to fall to the number of usable cores and
refuses to go on above it unless the user passed ``--allow_load``; runs taken that way are marked
(``started_above_nproc_load``) and reports say so.

The lock file is ``$TF_CODISTILL_BENCH_LOCK`` or ``<tmp>/tf_codistill_benchmark.lock``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Iterator, List, Optional, Sequence

# Benchmarks read and write their records as machine.write_json / read_json / read_json_or.
from tf_codistill.testing.json_files import read_json  # noqa: F401
from tf_codistill.testing.json_files import read_json_or
from tf_codistill.testing.json_files import write_json  # noqa: F401

LOCK_ENV = "TF_CODISTILL_BENCH_LOCK"


class MachineBusy(RuntimeError):
  """Another benchmark (or the test suite) holds the machine."""


class MachineLoaded(RuntimeError):
  """The load average is above the number of cores and --allow_load was not given."""


def lock_path() -> str:
  """The machine's benchmark lock file."""
  return os.environ.get(LOCK_ENV) or os.path.join(tempfile.gettempdir(),
                                                   "tf_codistill_benchmark.lock")


def cores() -> int:
  """CPUs this process may run on (what `nproc` prints; its main thread's, whatever CPUs the
  calling thread is pinned to)."""
  return len(os.sched_getaffinity(os.getpid()))


def load_1m() -> float:
  """The 1-minute load average."""
  return os.getloadavg()[0]


def cpu_model() -> str:
  """The CPU's model name (``/proc/cpuinfo``): step times from different CPU models are not
  comparable, so every figure records it."""
  with contextlib.suppress(OSError):
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.lower().startswith("model name"):
          return line.split(":", 1)[1].strip()
  return platform.processor() or platform.machine() or "unknown"


def code_commit() -> Optional[str]:
  """The git commit of the checkout these benchmarks run from, ``+changes`` when tracked files
  differ from it (None outside a git checkout): a run that goes on across invocations records
  each part's."""
  here = os.path.dirname(os.path.abspath(__file__))
  with contextlib.suppress(OSError, subprocess.SubprocessError):
    head = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                          text=True, timeout=30)
    changed = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True, timeout=30)
    if head.returncode == 0:
      return head.stdout.strip() + ("+changes" if changed.stdout.strip() else "")
  return None


def tensorflow_version() -> str:
  """The installed TensorFlow's version, read from its package metadata (no import)."""
  try:
    return importlib.metadata.version("tensorflow")
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def busy_cpu_seconds() -> float:
  """CPU seconds the whole machine has spent busy since boot (``/proc/stat``: all but idle and
  iowait)."""
  with open("/proc/stat") as f:
    fields = [int(v) for v in f.readline().split()[1:]]
  idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
  return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
  """CPU seconds of this process and its waited-for children."""
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


# Others may use at most this share of the cores' time while a figure is taken (the machine's
# own daemons use about 0.1%).
FOREIGN_LIMIT = 0.05


@dataclasses.dataclass
class Session:
  """A benchmark's hold on the machine, and the load when it started.

  The 1-minute load average at the end counts the benchmark's own threads (one TF process that
  keeps both cores busy leaves it at 2-3 here: about two runnable threads on average, and more
  at moments), so it cannot tell whether anything else ran. ``foreign_cpu_share`` can: the
  machine's busy CPU time over the run less the benchmark's own (its process and the child
  processes it waited for), as a share of the cores' time.
  """
  name: str
  allow_load: bool
  load_before: float
  cores: int
  started: float = dataclasses.field(default_factory=time.monotonic)
  busy_before: float = dataclasses.field(default_factory=busy_cpu_seconds)
  own_before: float = dataclasses.field(default_factory=own_cpu_seconds)

  def foreign_cpu_share(self) -> float:
    """Share of the cores' time since the start used by processes other than the benchmark's."""
    wall = max(time.monotonic() - self.started, 1e-9)
    foreign = ((busy_cpu_seconds() - self.busy_before) - (own_cpu_seconds() - self.own_before))
    return max(0.0, foreign) / (wall * self.cores)

  def record(self) -> dict:
    """Load before and now, and the CPU others used meanwhile, for a summary.json: figures mean
    little without it. ``above_nproc_load`` marks a figure taken on a loaded machine: it started
    above ``cores``, or other processes used more than ``FOREIGN_LIMIT`` of the cores' time while
    it ran (so the benchmark never had the cores to itself). The load after the run is recorded,
    not judged: it counts the benchmark's own threads. The CPU model and TensorFlow version say
    which machine kind a figure belongs to."""
    foreign = self.foreign_cpu_share()
    started_above, others_busy = self.load_before > self.cores, foreign > FOREIGN_LIMIT
    return {"benchmark": self.name, "cores": self.cores, "cpu_model": cpu_model(),
            "tensorflow": tensorflow_version(), "allow_load": self.allow_load,
            "load_avg_1m_before": self.load_before, "load_avg_1m_after": load_1m(),
            "foreign_cpu_share": round(foreign, 4), "started_above_nproc_load": started_above,
            "others_busy": others_busy, "above_nproc_load": started_above or others_busy}


def _holder(fd: int) -> str:
  """Who holds the lock: a benchmark writes itself into the file (and empties it on release);
  an empty file means the test suite."""
  try:
    info = json.loads(os.pread(fd, 4096, 0).decode() or "null")
    if info is None:
      return "the test suite"
    return (f"{info.get('name', '?')} (pid {info.get('pid', '?')}, since "
            f"{time.strftime('%H:%M:%S', time.localtime(info.get('since', 0)))}: "
            f"{info.get('command', '?')})")
  except (OSError, ValueError):
    return "an unknown process"


@contextlib.contextmanager
def hold(name: str, shared: bool = False, path: Optional[str] = None) -> Iterator[int]:
  """Holds the machine's lock (exclusive for a benchmark, shared for the test suite) or raises
  MachineBusy naming the holder."""
  path = path or lock_path()
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
  locked = False
  try:
    try:
      fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
        raise
      raise MachineBusy(f"{name}: the machine is busy: {_holder(fd)} holds {path}. Run one "
                        f"benchmark at a time, and never beside the tests.") from None
    locked = not shared
    if locked:
      os.ftruncate(fd, 0)
      os.pwrite(fd, json.dumps({"name": name, "pid": os.getpid(), "since": time.time(),
                                "command": " ".join(sys.argv)[:300]}).encode(), 0)
    yield fd
  finally:
    if locked:
      os.ftruncate(fd, 0)
    os.close(fd)  # releases the lock


def settle(allow_load: bool, max_wait_s: float = 180.0, poll_s: float = 5.0,
           what: str = "this run", log: Callable[[str], None] = print) -> tuple:
  """Waits up to ``max_wait_s`` for the 1-minute load to fall to ``cores()`` (a previous run's own
  load decays within a minute or two); returns (load, above). Above it after the wait: raises
  MachineLoaded, or with ``allow_load`` logs a warning and returns above=True."""
  deadline = time.time() + max_wait_s
  load, limit = load_1m(), cores()
  while load > limit and time.time() < deadline:
    time.sleep(poll_s)
    load = load_1m()
  if load <= limit:
    return load, False
  if not allow_load:
    raise MachineLoaded(f"{what}: the 1-minute load average is {load:.2f}, above the {limit} "
                        f"usable cores, after waiting {max_wait_s:.0f} s; figures taken now would "
                        f"not be trustworthy. Stop what else runs, or pass --allow_load (the "
                        f"figures are then marked).")
  log(f"WARNING: {what} starts at load {load:.2f} > {limit} cores (--allow_load): its figures "
      f"are marked started_above_nproc_load")
  return load, True


@dataclasses.dataclass(frozen=True)
class Quiet:
  """How a benchmark waits for a quiet machine, before it starts and before each run of a suite
  that starts alone: up to ``settle_s`` for the load to fall (``settle``), and whether it may go
  on above it (``allow_load``: its figures are then marked). Tests set ``settle_s`` to 0."""
  allow_load: bool = False
  settle_s: float = 180.0

  def settle(self, what: str, log: Callable[[str], None] = print) -> tuple:
    """``settle`` under this policy: (load, above)."""
    return settle(self.allow_load, max_wait_s=self.settle_s, what=what, log=log)


@contextlib.contextmanager
def exclusive(name: str, quiet: Quiet = Quiet()) -> Iterator[Session]:
  """The machine to one benchmark: the exclusive lock, then a settled load (see ``settle``)."""
  with hold(name):
    load, _ = quiet.settle(what=name)
    yield Session(name=name, allow_load=quiet.allow_load, load_before=load, cores=cores())


class CpuPool:
  """The CPUs a benchmark hands out to runs that go on at once, each pinned to its own share, so
  that concurrent runs never share a core (as if each had its own machine)."""

  def __init__(self, cpus: Optional[Sequence[int]] = None):
    self._free = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    self.size = len(self._free)
    self._changed = threading.Condition()

  def in_use(self) -> bool:
    """Whether some holder has CPUs of the pool now."""
    with self._changed:
      return len(self._free) < self.size

  @contextlib.contextmanager
  def take(self, count: int) -> Iterator[List[int]]:
    """Waits for ``count`` free CPUs and pins the calling thread (and so the processes it starts)
    to them until the block ends."""
    if not 0 < count <= self.size:
      raise ValueError(f"a run needs {count} CPUs; this pool has {self.size}")
    with self._changed:
      self._changed.wait_for(lambda: len(self._free) >= count)
      taken, self._free = self._free[:count], self._free[count:]
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, taken)
    try:
      yield taken
    finally:
      os.sched_setaffinity(0, before)
      with self._changed:
        self._free = sorted(self._free + taken)
        self._changed.notify_all()


def write_text(path: str, text: str) -> str:
  """Writes ``text`` to ``path``, making its directory; returns the path."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)
  return path


def recorded(path: str, settings: dict) -> Optional[dict]:
  """The record at ``path`` if an earlier run wrote it under the same ``settings`` (its
  ``settings`` key), else None: measurements that resume record by record keep only those."""
  record = read_json_or(path)
  return record if record is not None and record.get("settings") == settings else None
