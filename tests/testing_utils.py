"""Helpers for tests: command lines at test sizes, pids, progress, TensorBoard scalars, Criteo
lines, small Keras nets, and directories a write really fails in (unwritable, full)."""

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

from benchmarks import standalone

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Sizes that train in seconds per process; alpha/exchange values as in the gin configs.
SMALL_BINDINGS = (
    "NUM_BUCKETS = 1000",
    "models.ctr_model.embedding_dim = 4",
    "models.ctr_model.hidden_units = (32,)",
    "tfc.Data.batch_size = 120",
    "trainer.train.train_steps = 240",
    "trainer.train.steps_per_epoch = 80",
    "tfc.Exchange.publish_every_steps = 40",
    "tfc.Distillation.burn_in_steps = 40",
    "tfc.Exchange.poll_interval_s = 0.2",
    "tfc.Data.shuffle_buffer = 1000",
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
      f"tfc.Data.train_files = ['{data_dir}/{train}']",
      f"tfc.Data.eval_files = ['{data_dir}/eval-*']"] + list(bindings)
  return args + [f"--gin_bindings={b}" for b in all_bindings]


def train_args(model_dir, data_dir, *extra_flags, gin="baseline.gin", bindings=(),
               train="train-*"):
  """The tf-codistill-train command line (one group, one process) at test sizes."""
  args = [sys.executable, "-m", "tf_codistill.bin.train", f"--model_dir={model_dir}",
          f"--gin_file={REPO}/gin/criteo/{gin}", *extra_flags]
  all_bindings = list(SMALL_BINDINGS) + [
      f"tfc.Data.train_files = ['{data_dir}/{train}']",
      f"tfc.Data.eval_files = ['{data_dir}/eval-*']"] + list(bindings)
  return args + [f"--gin_bindings={b}" for b in all_bindings]


def run(args, timeout, env=None):
  """Runs a command from the repository root; returns the CompletedProcess (text output)."""
  return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                        env=None if env is None else {**os.environ, **env})


def error_lines(stderr):
  """The one-line errors the binaries print (``tf-codistill-<name>: error: ...``)."""
  return [line for line in stderr.splitlines() if re.match(r"tf-codistill-\w+: error: ", line)]


def tb_scalars(logdir):
  """{tag: [(step, value), ...]} of every TensorBoard event file under ``logdir``."""
  import tensorflow as tf
  tags = {}
  for path in glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        number = (float(tf.make_ndarray(value.tensor)) if value.HasField("tensor")
                  else value.simple_value)
        tags.setdefault(value.tag, []).append((event.step, number))
  return tags


# Criteo TSV lines: (label, 13 integer fields, 26 categorical fields); '' is a missing value.
CRITEO_ROWS = [
    ("0", ["1", "-5", "", "0", "12", "", "3", "", "100", "7", "", "2", "999999999"],
     ["68fd1e64", "80E51FF9", "", "deadBEEF", "a", "0123456789abcdef"] + ["05db9164"] * 20),
    ("1", [""] * 13, [""] * 26),
    ("1", ["-2", "0", "5"] + ["1"] * 9 + ["123456789012345678"],
     ["ABCDEF01"] * 13 + ["fffffff"] * 13),
]


def tsv_line(label, ints, cats):
  return "\t".join([label, *ints, *cats])


GOOD_LINES = [tsv_line(*row) for row in CRITEO_ROWS]


def write_lines(path, lines, trailing_newline=True):
  """Writes lines (str, or bytes for raw bytes) joined by newlines; returns the path as str."""
  data = b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines)
  path.write_bytes(data + (b"\n" if trailing_newline else b""))
  return str(path)


def collect(dataset):
  """(dense, categorical, labels) of a whole dataset as numpy arrays."""
  import numpy as np
  dense, cats, labels = [], [], []
  for features, label in dataset:
    dense.append(features["dense"].numpy())
    cats.append(features["categorical"].numpy())
    labels.append(label.numpy())
  return np.concatenate(dense), np.concatenate(cats), np.concatenate(labels)


def small_net(seed=0, outputs=1, inputs=4, hidden=8, input_dtype="float32", output_dtype=None):
  """A 2-layer Keras net on [B, inputs]; ``output_dtype`` casts its logits (e.g. 'float64')."""
  import tf_keras as keras
  x = keras.Input((inputs,), dtype=input_dtype)
  h = keras.layers.Dense(hidden, activation="relu",
                         kernel_initializer=keras.initializers.GlorotUniform(seed))(x)
  out = keras.layers.Dense(outputs,
                           kernel_initializer=keras.initializers.GlorotUniform(seed + 1))(h)
  if output_dtype:
    out = keras.layers.Lambda(lambda t: __import__("tensorflow").cast(t, output_dtype))(out)
  return keras.Model(x, out)


def normalized_net(data):
  """A Normalization layer adapted to ``data`` ([B, 4]; it keeps an int64 ``count`` beside its
  float statistics), then a Dense logit."""
  import tf_keras as keras
  x = keras.Input((4,))
  norm = keras.layers.Normalization()
  norm.adapt(data)
  return keras.Model(x, keras.layers.Dense(1)(norm(x)))


def project_model(name):
  """(model, output, a batch of 8 inputs) of a small project model: 'lm', 'resnet' or 'ctr'."""
  import tensorflow as tf

  from tf_codistill.models import ctr
  from tf_codistill.models import lm
  from tf_codistill.models import resnet
  if name == "lm":
    return lm.lstm_lm(200, 32, (64,), seed=0), "softmax", {
        "tokens": tf.random.stateless_uniform([8, 20], [1, 2], 0, 200, tf.int32)}
  if name == "resnet":
    return resnet.resnet(10, widths=(8, 16), seed=0), "softmax", {
        "image": tf.random.stateless_uniform([8, 28, 28, 1], [1, 2])}
  return ctr.ctr_model(num_buckets=100, embedding_dim=4, hidden_units=(16,), seed=0), "sigmoid", {
      "dense": tf.random.stateless_uniform([8, 13], [1, 2]),
      "categorical": tf.random.stateless_uniform([8, 26], [1, 2], 0, 100, tf.int64)}


def restored_lm_teacher(exchange_dir, teacher_precision, probe=False):
  """A float32 LM peer published as group 1 at step 40, and a student distilling from it in
  ``teacher_precision`` whose pool restored and activated that version: (peer, output, x,
  model, teacher)."""
  import tensorflow as tf

  from tf_codistill.exchange import directory as exchange
  from tf_codistill.exchange.config import Exchange
  from tf_codistill.teachers import pool as teachers
  from tf_codistill.teachers.spec import TeacherSpec
  from tf_codistill.training.model import CodistillModel
  peer, output, x = project_model("lm")
  spec = {"tokens": tf.TensorSpec([None, 20], tf.int32)}
  exchange.publish(peer, str(exchange_dir), 1, 40, spec)
  student, _, _ = project_model("lm")
  model = CodistillModel(student, exchange=Exchange(str(exchange_dir), group=0),
                         teachers=TeacherSpec(precision=teacher_precision), output="softmax")
  model(x)
  pool = teachers.TeacherPool(str(exchange_dir), [1], model, spec, [None, 20, 200],
                              probe=x if probe else None)
  assert pool.poll_once() == 1 and pool.rejections == 0
  model.activate_teacher(0, 40)
  return peer, output, x, model, model.active_teacher(0)


def student_and_pool(exchange_dir, peers=(1,), poll_interval_s=0.05, probe=None,
                     teacher_policy=None):
  """A CodistillModel over ``small_net()`` with ``len(peers)`` teachers (clones in the tf_keras
  dtype policy ``teacher_policy``, e.g. 'bfloat16', if given) and its TeacherPool."""
  import tensorflow as tf

  from tf_codistill.teachers import pool as teachers
  from tf_codistill.teachers.spec import TeacherSpec
  from tf_codistill.training.model import CodistillModel
  from tf_codistill.training.model import clone_architecture
  student = small_net()
  factory = teacher_policy and (lambda: clone_architecture(student, teacher_policy))
  model = CodistillModel(student, len(peers), teachers=TeacherSpec(factory=factory))
  model(tf.zeros([1, 4]))
  pool = teachers.TeacherPool(str(exchange_dir), list(peers), model,
                              tf.TensorSpec([None, 4], tf.float32), [None, 1],
                              poll_interval_s=poll_interval_s, probe=probe)
  return model, pool


def activate_all(model, pool):
  """Swaps in every teacher the pool has loaded (what TeacherRefresh does between steps);
  returns their updates."""
  return pool.activate_updates(lambda update: model.activate_teacher(update.index, update.step))


def _can_write(directory):
  probe = os.path.join(directory, f".probe-{uuid.uuid4().hex}")
  try:
    with open(probe, "w") as f:
      f.write("x")
    os.remove(probe)
    return True
  except OSError:
    return False


def make_unwritable(directory):
  """Makes an existing ``directory`` unwritable for this process, for real: mode 0555 for a
  normal user; for root (whom modes do not stop) the immutable attribute, else a read-only bind
  mount. Returns the function that undoes it, or None where none of these works here."""
  undo = None
  if os.geteuid() != 0:
    mode = os.stat(directory).st_mode
    os.chmod(directory, 0o555)
    undo = lambda: os.chmod(directory, mode)
  elif shutil.which("chattr") and subprocess.run(["chattr", "+i", directory],
                                                 capture_output=True).returncode == 0:
    undo = lambda: subprocess.run(["chattr", "-i", directory], check=True)
  elif subprocess.run(["mount", "--bind", "-o", "ro", directory, directory],
                      capture_output=True).returncode == 0:
    undo = lambda: subprocess.run(["umount", directory], check=True)
  if undo is not None and _can_write(directory):
    undo()
    undo = None
  return undo


@contextlib.contextmanager
def unwritable(directory):
  """``make_unwritable`` for the duration of a with-block; skips the test where impossible."""
  import pytest
  undo = make_unwritable(directory)
  if undo is None:
    pytest.skip(f"cannot make {directory} unwritable on this machine")
  try:
    yield directory
  finally:
    undo()


@contextlib.contextmanager
def small_filesystem(directory, size_bytes):
  """Mounts a tmpfs of ``size_bytes`` at ``directory`` (a real full disk when it fills up);
  yields None where mounting is not allowed (not root, or no CAP_SYS_ADMIN)."""
  os.makedirs(directory, exist_ok=True)
  if os.geteuid() != 0 or subprocess.run(
      ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", directory],
      capture_output=True).returncode != 0:
    yield None
    return
  try:
    yield directory
  finally:
    subprocess.run(["umount", "-l", directory], check=False)


# A TensorFlow/gRPC fault seen once in CI and in none of many local runs: a parameter server
# cannot parse one of the coordinator's RunComponentFunction requests ("Unable to parse request")
# and the chief dies with an InternalError; the launcher restarts the group from its checkpoint.
# The request that failed was the chief's own, so another launch reaching a reused port (which
# the private network namespaces of launches now rule out) is not a likely cause: the
# parameter-server tests still accept a restart after this fault, and only after it.
TRANSIENT_PS_FAULTS = ("Unable to parse request",)


class Launch(standalone.Launch):
  """A running launcher (see ``benchmarks.standalone.Launch``) that conftest stops after each
  test, and that fails a test with its tasks' logs."""

  running = []  # every Launch not yet waited for; conftest stops them after each test

  def __init__(self, args, cpus=None):
    """``cpus``: the CPUs the launcher (and so every task it starts) may run on."""
    super().__init__(args, cpus)
    Launch.running.append(self)

  def wait(self, timeout):
    """The exit status; past ``timeout`` the launcher is killed and TimeoutExpired raised."""
    try:
      self.proc.wait(timeout=timeout)
    finally:
      if self.proc.poll() is None:
        self.proc.kill()
      self._forget()
    return self.proc.returncode

  def stop(self):
    code = super().stop()
    self._forget()
    return code

  def _forget(self):
    self._reader.join(timeout=10)
    if self in Launch.running:
      Launch.running.remove(self)

  def wait_for(self, condition, timeout, what):
    """Waits for ``condition`` while the launcher runs; else fails with its stderr and task logs.

    On a timeout every task first dumps its Python stacks into its log (SIGUSR1), so the
    failure shows where training stood.
    """
    deadline = time.time() + timeout
    while time.time() < deadline:
      if condition():
        return
      if self.proc.poll() is not None:
        self._fail(f"the launcher exited with status {self.proc.returncode} before {what}")
      time.sleep(0.2)
    for pid in self.pids.values():
      try:
        os.kill(pid, signal.SIGUSR1)
      except OSError:
        pass
    time.sleep(3)
    self._fail(f"timed out after {timeout}s waiting for {what}")

  def _fail(self, message):
    from tf_codistill.launch import (
      launcher,  # only here: most tests' Bazel targets do not depend on it
    )
    self.stop()
    logs = sorted(glob.glob(os.path.join(self.model_dir or "/nonexistent", "group_*", "*.log")))
    tails = "".join(f"\n--- {path} (tail) ---\n{launcher.log_tail(path, 80)}"
                    for path in logs)
    raise AssertionError(f"{message}\nlauncher stderr (tail):\n{self.stderr[-3000:]}{tails}")

  def assert_restart_scopes(self, expected):
    """Fails, with every restart event and the tail of each restarted task's log, unless the
    launcher's restarts had exactly the scopes ``expected`` ('task' or 'group'), in order."""
    from tf_codistill import layout
    from tf_codistill.launch import launcher
    restarts = [e for e in self.events() if e["event"] == "restarted"]
    if [e["scope"] for e in restarts] == list(expected):
      return
    shown = []
    for event in restarts:
      path = layout.group_run(self.model_dir, event["group"]).task_log(event["task"],
                                                                      event["index"])
      shown.append(f"{json.dumps(event, sort_keys=True)}\n--- {path} (tail) ---\n"
                   f"{launcher.log_tail(path, 80)}")
    raise AssertionError(f"restart scopes {[e['scope'] for e in restarts]}, expected "
                         f"{list(expected)}:\n" + "\n".join(shown)
                         + f"\nlauncher stderr (tail):\n{self.stderr[-3000:]}")

  def assert_no_restarts(self, except_after=()):
    """Fails, with the dead task's log, if the launcher restarted anything, unless the dead
    task's log shows one of the faults ``except_after``."""
    from tf_codistill import layout
    for event in self.events():
      if event["event"] == "restarted":
        group, task, index = event["group"], event["task"], event["index"]
        with open(layout.group_run(self.model_dir, group).task_log(task, index)) as f:
          log = f.read()
        if not any(fault in log for fault in except_after):
          raise AssertionError(f"group {group} {task}:{index} died (status {event['status']}) "
                               f"and was restarted:\n{log[-6000:]}")


def progress_steps(group_dir):
  """Steps at which the group's chief finished an epoch (its progress.jsonl)."""
  from tf_codistill import layout
  path = layout.RunDir(group_dir).progress
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [int(re.search(r'"step": (\d+)', line).group(1)) for line in f if line.strip()]


def process_state(pid):
  """The process's state letter (/proc/PID/stat): 'T' stopped, 'Z' a zombie (it has exited and
  waits for its parent)."""
  with open(f"/proc/{pid}/stat") as f:
    return f.read().rsplit(")", 1)[-1].split()[0]


def alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  try:
    return process_state(pid) != "Z"
  except FileNotFoundError:
    return False


def require_fashion_mnist():
  """Skips the calling test, saying how to install it, when Debian's Fashion-MNIST is missing."""
  import pytest

  from data_pipelines import images
  if not os.path.isdir(images.FASHION_MNIST_DIR):
    pytest.skip(f"{images.FASHION_MNIST_DIR} is missing: `make data` (as root) or "
                f"`apt-get install -y {images.FASHION_MNIST_PACKAGE}` installs it")


def require_kjv():
  """Skips the calling test, saying how to install it, when Debian's King James Bible is missing."""
  import shutil

  import pytest

  from data_pipelines import text_lm
  if shutil.which("bible") is None:
    pytest.skip(f"the King James Bible is not installed: `make data` (as root) or "
                f"`{text_lm.KJV_INSTALL}` installs it")


_PS_SERVER = ("import json, sys, tensorflow as tf; tf.distribute.Server(tf.train.ClusterSpec("
              "json.loads(sys.argv[1])), job_name=sys.argv[2], task_index=0, "
              "protocol='grpc').join()")
# Defines, for a coordinator script: cluster, ps_pid, args (its own arguments) and strategy.
_PS_COORDINATOR_PREAMBLE = """
import json, sys
import tensorflow as tf
cluster, ps_pid, args = json.loads(sys.argv[1]), int(sys.argv[3]), sys.argv[4:]
sys.path.insert(0, sys.argv[2])
strategy = tf.distribute.experimental.ParameterServerStrategy(
    tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"))
"""


def run_ps_coordinator(script, *args):
  """Runs ``script`` as the coordinator of a real cluster of 1 worker and 1 ps on 127.0.0.1, in
  its own process (connecting to a cluster changes a process's eager context for good), after a
  preamble that defines ``cluster``, ``ps_pid``, ``args`` and ``strategy``; the script prints a
  JSON report as its last line, which is returned."""
  import json

  from tf_codistill.launch import launcher
  taken = set()
  cluster = {job: [f"127.0.0.1:{launcher.free_port(taken)}"] for job in ("chief", "worker", "ps")}
  servers = {job: subprocess.Popen([sys.executable, "-c", _PS_SERVER, json.dumps(cluster), job])
             for job in ("worker", "ps")}
  try:
    done = subprocess.run(
        [sys.executable, "-c", _PS_COORDINATOR_PREAMBLE + script, json.dumps(cluster),
         os.path.dirname(os.path.abspath(__file__)), str(servers["ps"].pid), *map(str, args)],
        capture_output=True, text=True, timeout=300)
  finally:
    for server in servers.values():
      server.kill()
      server.wait()
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])
