"""Helpers for tests that launch real groups: command lines at test sizes, pids, progress."""

import os
import re
import subprocess
import sys
import threading
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Sizes that train in seconds per process; alpha/exchange values as in the gin configs.
SMALL_BINDINGS = (
    "NUM_BUCKETS = 1000",
    "models.ctr_model.embedding_dim = 4",
    "models.ctr_model.hidden_units = (32,)",
    "trainer.train.batch_size = 120",
    "trainer.train.train_steps = 240",
    "trainer.train.steps_per_epoch = 80",
    "trainer.train.exchange_every_steps = 40",
    "trainer.train.burn_in_steps = 40",
    "trainer.train.poll_interval_s = 0.2",
    "trainer.train.shuffle_buffer = 1000",
    "trainer.train.verbose = 0",
    "trainer.train.intra_op_threads = 1",
    "trainer.train.inter_op_threads = 1",
)


def launch_args(model_dir, data_dir, *extra_flags, gin="codistill_2way.gin", bindings=(),
                train="train-*"):
  """The tf-codistill-launch command line at test sizes."""
  args = [sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={model_dir}",
          f"--gin_file={REPO}/gin/criteo/{gin}", *extra_flags]
  all_bindings = list(SMALL_BINDINGS) + [
      f"trainer.train.train_files = ['{data_dir}/{train}']",
      f"trainer.train.eval_files = ['{data_dir}/eval-*']"] + list(bindings)
  return args + [f"--gin_bindings={b}" for b in all_bindings]


class Launch:
  """A running launcher whose stderr is collected in the background; knows its tasks' pids."""

  def __init__(self, args):
    self.proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
    self.lines = []
    self.pids = {}  # (group, task, index) -> newest pid
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.proc.stderr:
      self.lines.append(line)
      match = re.search(r"launched group (\d+) (\w+):(\d+) \(pid (\d+)\)", line)
      if match:
        g, task, k, pid = match.groups()
        self.pids[(int(g), task, int(k))] = int(pid)

  def wait(self, timeout):
    try:
      self.proc.wait(timeout=timeout)
    finally:
      if self.proc.poll() is None:
        self.proc.kill()
    self._reader.join(timeout=10)
    return self.proc.returncode

  @property
  def stderr(self):
    return "".join(self.lines)


def wait_for(condition, timeout, what):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if condition():
      return
    time.sleep(0.2)
  raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def progress_steps(group_dir):
  """Steps at which the group's chief finished an epoch (its progress.jsonl)."""
  path = os.path.join(group_dir, "progress.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [int(re.search(r'"step": (\d+)', line).group(1)) for line in f if line.strip()]


def alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  try:
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited and waits for its parent
      return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
  except FileNotFoundError:
    return False
