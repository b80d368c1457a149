"""Starts n codistillation groups as processes on this machine, waits, and fails loudly.

Each group runs ``python -m tf_codistill.bin.train --group=i`` with its log in
``model_dir/group_<i>/train.log``. SIGINT/SIGTERM to the launcher stop every child; a child that
fails stops the others and raises ``GroupFailedError`` naming the group and its log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from absl import logging

_GRACE_SECONDS = 10.0


class GroupFailedError(RuntimeError):
  """A group's process exited with a non-zero status."""


def group_model_dir(model_dir: str, group: int) -> str:
  return os.path.join(model_dir, f"group_{group}")


def train_command(model_dir: str, group: int, num_groups: int, exchange_dir: str,
                  gin_files: Sequence[str], gin_bindings: Sequence[str]) -> List[str]:
  """The command line that trains one group."""
  cmd = [sys.executable, "-m", "tf_codistill.bin.train", f"--model_dir={model_dir}",
         f"--group={group}", f"--num_groups={num_groups}", f"--exchange_dir={exchange_dir}"]
  cmd += [f"--gin_file={f}" for f in gin_files]
  cmd += [f"--gin_bindings={b}" for b in gin_bindings]
  return cmd


def _tail(path: str, lines: int = 15) -> str:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 8192))
      text = f.read().decode("utf-8", "replace")
  except OSError:
    return ""
  return "\n".join(text.splitlines()[-lines:])


def _stop_all(procs: Dict[int, subprocess.Popen]) -> None:
  """SIGTERM every live child's process group, then SIGKILL what is left after a grace period."""
  for proc in procs.values():
    if proc.poll() is None:
      _signal_group(proc, signal.SIGTERM)
  deadline = time.monotonic() + _GRACE_SECONDS
  for proc in procs.values():
    try:
      proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      _signal_group(proc, signal.SIGKILL)
      proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
  try:
    os.killpg(proc.pid, sig)
  except ProcessLookupError:
    pass


def launch(model_dir: str, num_groups: int, *, exchange_dir: Optional[str] = None,
           gin_files: Sequence[str] = (), gin_bindings: Sequence[str] = (),
           poll_seconds: float = 0.5) -> Dict[int, str]:
  """Runs ``num_groups`` groups to completion; returns each group's model dir."""
  if num_groups < 1:
    raise ValueError(f"--num_groups={num_groups} must be >= 1")
  exchange_dir = exchange_dir or os.path.join(model_dir, "exchange")
  os.makedirs(model_dir, exist_ok=True)
  procs: Dict[int, subprocess.Popen] = {}
  logs: Dict[int, str] = {}
  dirs = {g: group_model_dir(model_dir, g) for g in range(num_groups)}

  def on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")

  previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    for g in range(num_groups):
      os.makedirs(dirs[g], exist_ok=True)
      logs[g] = os.path.join(dirs[g], "train.log")
      with open(logs[g], "ab") as log:
        # Own session: a terminal's Ctrl-C reaches the launcher, which stops children in order.
        procs[g] = subprocess.Popen(
            train_command(dirs[g], g, num_groups, exchange_dir, gin_files, gin_bindings),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
      logging.info("launched group %d (pid %d), log %s", g, procs[g].pid, logs[g])
    running = set(procs)
    while running:
      for g in sorted(running):
        code = procs[g].poll()
        if code is None:
          continue
        running.discard(g)
        if code != 0:
          raise GroupFailedError(
              f"group {g} exited with status {code}; log {logs[g]}:\n{_tail(logs[g])}")
        logging.info("group %d finished", g)
      time.sleep(poll_seconds)
  finally:
    _stop_all(procs)
    for s, handler in previous.items():
      signal.signal(s, handler)
  return dirs
