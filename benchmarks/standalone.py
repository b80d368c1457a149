"""What the registered benchmarks share: generated CTR data, a ``tf-codistill-launch`` job run
as users run it, waiting on it, a digest of the sources a reusable measurement was made with,
and Markdown tables. TensorFlow and the package are imported only where used, so the tests'
helpers can use ``Launch`` without them.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = TypeVar("T")


def ensure_ctr_data(data_dir: str, train_rows: int, eval_rows: int = 10_000,
                    vocab_size: Optional[int] = None) -> str:
  """Generated Criteo-format files under ``data_dir`` (4 training files, 1 eval file), made
  once: a later run with the same directory reuses them."""
  if not os.path.exists(os.path.join(data_dir, "eval-00000-of-00001.tsv")):
    from data_pipelines import make_criteo_like  # pylint: disable=g-import-not-at-top
    extra = {} if vocab_size is None else {"vocab_size": vocab_size}
    make_criteo_like.generate(data_dir, train_rows, num_files=4, seed=0, prefix="train", **extra)
    make_criteo_like.generate(data_dir, eval_rows, num_files=1, seed=1, prefix="eval", **extra)
  return data_dir


def ctr_data_bindings(data_dir: str) -> List[str]:
  """The gin bindings that point the trainer at ``ensure_ctr_data``'s files."""
  return [f"tfc.Data.train_files = ['{data_dir}/train-*']",
          f"tfc.Data.eval_files = ['{data_dir}/eval-*']"]


def launch_args(model_dir: str, gin_file: str, launch_flags: Sequence[str] = (),
                bindings: Sequence[str] = ()) -> List[str]:
  """The ``tf-codistill-launch`` command line (``gin_file`` relative to ``gin/criteo/`` unless
  absolute)."""
  gin_path = gin_file if os.path.isabs(gin_file) else os.path.join(REPO, "gin", "criteo", gin_file)
  return ([sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={model_dir}",
           f"--gin_file={gin_path}", *launch_flags]
          + [f"--gin_bindings={b}" for b in bindings])


class Launch:
  """A running ``tf-codistill-launch``: its stderr collected in the background, its tasks'
  pids and events read from the launcher's event log, its groups' results."""

  def __init__(self, args: Sequence[str], cpus: Optional[Sequence[int]] = None):
    """``cpus``: the CPUs the launcher (and so every task it starts) may run on."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    self.start = time.monotonic()
    self.proc = subprocess.Popen(list(args), cwd=REPO, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, preexec_fn=pin)
    self.model_dir = next((a.split("=", 1)[1] for a in args if a.startswith("--model_dir=")),
                          None)
    self.lines: List[str] = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self) -> None:
    for line in self.proc.stderr:
      self.lines.append(line)

  @property
  def stderr(self) -> str:
    return "".join(self.lines)

  def events(self) -> List[dict]:
    """The launcher's structured events so far (``launch_events.jsonl``)."""
    from tf_codistill.launch import launcher  # pylint: disable=g-import-not-at-top
    return launcher.read_events(self.model_dir) if self.model_dir else []

  @property
  def pids(self) -> Dict[Tuple[int, str, int], int]:
    """(group, task, index) -> the newest pid the launcher started for it."""
    from tf_codistill.launch import launcher  # pylint: disable=g-import-not-at-top
    return launcher.task_pids(self.events())

  @property
  def started(self) -> Dict[Tuple[int, str, int], float]:
    """(group, task, index) -> when its newest process was started (``time.monotonic``)."""
    return {(e["group"], e["task"], e["index"]): e["monotonic"] for e in self.events()
            if e["event"] == "launched"}

  def wait(self, timeout: Optional[float] = None) -> Optional[int]:
    """The launcher's exit status; past ``timeout`` it is stopped (SIGTERM: it stops its tasks;
    SIGKILL a minute later) and None is returned."""
    try:
      self.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.stop()
      return None
    self._reader.join(timeout=10)
    return self.proc.returncode

  def stop(self) -> Optional[int]:
    """SIGTERM to the launcher (which stops its tasks); SIGKILL if it is not gone in 60 s."""
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGTERM)
      try:
        self.proc.wait(timeout=60)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
    self._reader.join(timeout=10)
    return self.proc.returncode

  def finish(self, timeout: Optional[float] = None) -> float:
    """Waits for a successful exit and returns the wall time since the start; raises
    RuntimeError with the end of stderr on a failure or timeout."""
    code = self.wait(timeout)
    if code != 0:
      raise RuntimeError(f"launch in {self.model_dir} exited {code}:\n" +
                         "".join(self.lines[-30:]))
    return time.monotonic() - self.start

  def results(self, group: int = 0) -> Optional[dict]:
    """Group ``group``'s results.json, or None while it is not written."""
    from tf_codistill import layout  # pylint: disable=g-import-not-at-top
    try:
      with open(layout.group_run(self.model_dir, group).results) as f:
        return json.load(f)
    except (OSError, ValueError):
      return None


def wait_for(condition: Callable[[], T], timeout: float, what: str, poll: float = 0.05) -> T:
  """The first true value of ``condition()``, polled; TimeoutError naming ``what`` after
  ``timeout`` seconds."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    value = condition()
    if value:
      return value
    time.sleep(poll)
  raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def source_digest(packages: Sequence[str] = ("tf_codistill", "benchmarks")) -> str:
  """A digest of the Python sources of ``packages`` (paths and contents): what a measurement
  kept for a later run to reuse must have been made with."""
  digest = hashlib.sha256()
  for package in packages:
    for root, dirs, files in os.walk(os.path.join(REPO, package)):
      dirs[:] = sorted(d for d in dirs if d != "__pycache__")
      for name in sorted(f for f in files if f.endswith(".py")):
        path = os.path.join(root, name)
        digest.update(os.path.relpath(path, REPO).encode() + b"\0")
        with open(path, "rb") as f:
          digest.update(f.read() + b"\0")
  return digest.hexdigest()[:16]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
  """A Markdown table (cells rendered with ``str``)."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
  return "\n".join(lines)


def replaced_entry_point(command: str, name: str) -> Optional[str]:
  """What runs benchmark ``name`` today, where ``command`` (as recorded) went through an entry
  point since removed; None where it is today's."""
  today = f"python -m benchmarks.run {name}"
  if not name or command.split()[:4] == today.split():
    return None
  return (f"recorded through an entry point since removed; today `{today}`, its settings as "
          "`--gin_bindings`")


def command_line(summary: dict, name: str = "") -> str:
  """The command ``summary`` recorded (in backquotes), and what runs benchmark ``name`` today
  where that differs."""
  recorded = summary.get("command")
  if recorded is None:
    return "command not recorded"
  note = replaced_entry_point(recorded, name)
  return f"`{recorded}`" + (f" ({note})" if note else "")
