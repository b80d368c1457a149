"""The teacher pool: finds peers' newest complete versions and loads them off the training thread.

A background thread polls the exchange directory. For each peer with a version newer than the one
in use it refuses links (``exchange.check_contained``), verifies the completeness marker and file
sizes, checks the serving signature against the student's, restores the SavedModel's variables
into the *inactive* copy of that peer's double-buffered teacher (``load_weights`` +
``assert_existing_objects_matched``, so a half-restored model is an error; a teacher in another
precision or form reads the float32 values by key on the task that holds it, then casts or
converts them: ``restoring``) or rebuilds a lean version's arrays whole (bfloat16/int8 weights,
row deltas: ``lean_versions.LeanReader``) and assigns them (an int8 teacher quantizes them:
``quantization.py``), and rejects non-finite values and a teacher whose predictions on a probe
batch of real inputs are NaN/Inf. The peer's graph (``saved_model.pb``) is parsed for its
signature but never run. The training thread then only flips the peer's ``active_slot`` between
two steps (``TeacherRefresh``, a step_hooks.StepHook): no I/O, no copy, no retrace on the
training thread. Anything wrong with a version is logged with its path and the previous teacher
(or none) stays in use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
import tf_keras as keras
from absl import logging

from tf_codistill import step_hooks
from tf_codistill.exchange import directory as exchange
from tf_codistill.exchange import lean_versions
from tf_codistill.exchange.config import LOADER_NICE_RANGE
from tf_codistill.teachers import quantization
from tf_codistill.teachers import restoring


@dataclasses.dataclass
class TeacherUpdate:
  """A peer version restored into teacher ``index``'s inactive copy, ready to be activated."""
  index: int
  peer: int
  step: int
  path: str
  load_seconds: float
  started_at: float  # time.monotonic() when its load began


# Errors of a filesystem or service that is busy or briefly away (gs:// rate limits): the
# version is not refused for good.
_TRANSIENT = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
              tf.errors.ResourceExhaustedError, tf.errors.AbortedError)


class TeacherPool:
  """Loads the newest complete version of each peer group in a background thread, into the
  inactive teacher copies of ``model`` (a training.model.CodistillModel). ``loader_nice`` > 0
  lowers that thread's priority (Linux: a per-thread nice increment). It is 0 by default: at 10
  a 2-core parameter-server group lost as much throughput to refreshes as at 0 and its loads
  took longer (benchmarks/results/CHANGELOG.md, cluster step times), likely because the thread
  shares the GIL with the training loop, which then waits while a deprioritized holder is not
  scheduled."""

  def __init__(self, exchange_dir: str, peers: Sequence[int], model: keras.Model,
               input_spec, output_shape, *, poll_interval_s: float = 2.0, probe=None,
               loader_nice: int = 0):
    if len(peers) != model.num_teachers:
      raise ValueError(f"{len(peers)} peers for a model with {model.num_teachers} teachers")
    low, high = LOADER_NICE_RANGE
    if not low <= loader_nice <= high:
      raise ValueError(f"loader_nice={loader_nice} must be in [{low}, {high}]")
    self.loader_nice = int(loader_nice)
    self.exchange_dir = exchange_dir
    self.peers = list(peers)
    self.poll_interval_s = float(poll_interval_s)
    self.probe = exchange.ProbeForward(probe)  # a teacher must predict finite values on it
    self._model = model
    self._expected = exchange.expected_signature(input_spec, output_shape)
    self._lock = threading.Lock()
    self._loaded = threading.Condition(self._lock)  # notified after each version loaded
    self._pending: Dict[int, TeacherUpdate] = {}
    self._newest_seen: Dict[int, int] = {i: -1 for i in range(len(self.peers))}
    self._rejected: set = set()
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._float_copy: Optional[keras.Model] = None  # its structure gives checkpoint keys
    self._lean: Dict[int, lean_versions.LeanReader] = {}  # per teacher: the lean version held
    self._finite: Dict[int, FinitenessCheck] = {}  # per teacher copy (id), made at first load
    self.loads = 0
    self.rejections = 0

  def start(self) -> None:
    """Starts polling in a background thread (again after ``stop``: a model may ``fit`` again)."""
    if self._thread is None:
      self._stop.clear()
      self._thread = threading.Thread(target=self._run, name="teacher-pool", daemon=True)
      self._thread.start()

  def stop(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None

  def activate_updates(self, activate: Callable[[TeacherUpdate], None]) -> List[TeacherUpdate]:
    """Calls ``activate`` on each update loaded since the last call, then forgets them, under
    the lock the loader holds while it decides which copy it may overwrite: a copy is never
    written while it becomes the active one. Cheap, never blocks on I/O."""
    with self._lock:
      updates = list(self._pending.values())
      for update in updates:
        activate(update)
      self._pending.clear()
    return updates

  def poll_once(self) -> int:
    """Checks every peer once; returns how many new teacher versions were loaded."""
    loaded = 0
    for index, peer in enumerate(self.peers):
      with self._lock:
        if index in self._pending:  # Its inactive copy holds the pending version: keep it.
          continue
      try:
        update = self._load_newest(index, peer)
      except Exception:  # A bug with one peer's versions must not keep the others stale.
        logging.exception("teacher pool: unexpected error loading peer group %d", peer)
        continue
      if update is not None:
        with self._lock:  # seen and pending together: a waiter woken here finds the update
          self._newest_seen[index] = update.step
          self._pending[index] = update
          self._loaded.notify_all()
        loaded += 1
    return loaded

  def wait_until_loaded(self, timeout_s: float) -> List[int]:
    """Blocks until every teacher has had a version loaded (now or earlier) or ``timeout_s``
    has passed; returns the peer groups still without one."""
    deadline = time.monotonic() + timeout_s
    with self._loaded:
      while True:
        missing = [self.peers[i] for i, step in self._newest_seen.items() if step < 0]
        remaining = deadline - time.monotonic()
        if not missing or remaining <= 0:
          return missing
        self._loaded.wait(remaining)

  def _run(self) -> None:
    _lower_thread_priority(self.loader_nice)
    while not self._stop.is_set():
      try:
        self.poll_once()
      except Exception:  # A bug here must not kill training; it is logged loudly instead.
        logging.exception("teacher pool: unexpected error while polling %s", self.exchange_dir)
      self._stop.wait(self.poll_interval_s)

  def _load_newest(self, index: int, peer: int) -> Optional[TeacherUpdate]:
    for version in exchange.list_versions(self.exchange_dir, peer):
      if version.step <= self._newest_seen[index]:
        return None
      if version.path in self._rejected:
        continue
      try:
        update = self._load(index, version)
      except exchange.InvalidVersionError as e:
        self._reject(version, str(e))
        continue
      except _TRANSIENT as e:  # the version may be fine: tried again at the next poll
        logging.warning("teacher pool: cannot read peer group %d step %d now, keeping the "
                        "previous teacher: %s", version.group, version.step, e)
        return None
      except (tf.errors.OpError, ValueError, AssertionError, KeyError, TypeError) as e:
        self._reject(version, f"{version.path}: cannot restore variables ({e})")
        continue
      self.loads += 1
      return update
    return None

  def _reject(self, version: exchange.Version, reason: str) -> None:
    self._rejected.add(version.path)
    self.rejections += 1
    logging.warning("teacher pool: ignoring peer group %d step %d, keeping the previous "
                    "teacher: %s", version.group, version.step, reason)

  def _load(self, index: int, version: exchange.Version) -> TeacherUpdate:
    start = time.monotonic()
    exchange.check_contained(self.exchange_dir, version)
    marker = exchange.verify(version)
    target = self._model.inactive_teacher(index)
    commit = None
    if lean_versions.is_lean(marker):
      reader = self._lean.setdefault(index, lean_versions.LeanReader())
      version_id, arrays = reader.read(self.exchange_dir, version, marker, self._expected,
                                       quantization.float_shapes(target))
      quantization.assign_float_weights(target, arrays)
      commit = lambda: reader.commit(version_id, arrays)
    else:
      exchange.check_signature(version.path, self._expected)
      self._restore(target, tf.io.gfile.join(version.path, "variables", "variables"))
    bad = self._finiteness_check(index, target)()
    if bad:
      raise exchange.InvalidVersionError(f"{version.path}: variable {bad[0]} has NaN/Inf")
    if not self.probe.finite(target):
      raise exchange.InvalidVersionError(
          f"{version.path}: its predictions on a probe batch of real inputs are NaN/Inf")
    if commit is not None:
      commit()
    return TeacherUpdate(index, version.group, version.step, version.path,
                         time.monotonic() - start, start)

  def _finiteness_check(self, index: int, target: keras.Model) -> "FinitenessCheck":
    """``target``'s check; at teacher ``index``'s first load every copy of it gets one, so no
    function is traced later (a parameter server keeps every function it is sent)."""
    if id(target) not in self._finite:
      for copy in self._model.teacher_slots[index]:
        self._finite[id(copy)] = FinitenessCheck(copy.weights)
    return self._finite[id(target)]

  def _restore(self, target: keras.Model, prefix: str) -> None:
    """Restores the checkpoint at ``prefix`` into ``target``. A checkpoint restores only into
    variables of its saved dtype (float32) and form: a teacher kept in another precision
    (bfloat16, int8) or form (stacked tables, ``quantization.ConvertedLayer``) gets the float32
    values read by key (``restoring``, the keys found through a float32 copy of its
    architecture, made once) and cast or converted into it, on the task that holds it; int8
    codes are computed here (numpy, ``weight_codecs``), so an int8 teacher's values are read
    here too."""
    if quantization.restores_from_float32(target):
      target.load_weights(prefix).assert_existing_objects_matched()
      return
    if self._float_copy is None:
      self._float_copy = self._model.float32_copy()
    here = quantization.is_quantized(target)
    with contextlib.nullcontext() if here else tf.device(restoring.host_cpu(target)):
      values = restoring.read_weights(prefix, self._float_copy)  # its errors name prefix
      try:
        quantization.assign_float_weights(target, values)
      except ValueError as e:
        raise ValueError(f"{prefix}: {e}") from None


def _lower_thread_priority(nice: int) -> None:
  """Raises the calling thread's nice value by ``nice`` (Linux keeps one per thread; elsewhere,
  where it would apply to the whole process, nothing is done). Threads it starts inherit it."""
  if nice <= 0:
    return
  if not sys.platform.startswith("linux"):
    logging.info("teacher pool: loader_nice=%d ignored: per-thread priorities are Linux's", nice)
    return
  tid = threading.get_native_id()
  try:
    os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
  except OSError as e:  # e.g. a sandbox that forbids it: loads then compete at normal priority
    logging.warning("teacher pool: cannot lower the loading thread's priority: %s", e)


class FinitenessCheck:
  """Tells which floating ``weights`` (a model's) hold a NaN or Inf, each variable (each shard of a
  sharded one) checked on the device that holds it, so under parameter servers only the verdicts
  travel to this process. One traced function for all of them: a coordinator that checked with
  eager ops per variable grew its ps by about 0.19 MiB per load of a 30-variable model, one call
  per load by about 4 KiB (tests/reliability/test_soak.py)."""

  def __init__(self, weights: Sequence[tf.Variable]):
    self._names, parts = [], []
    for var in weights:
      if var.dtype.is_floating:
        for part in getattr(var, "variables", None) or [var]:
          self._names.append(var.name)
          parts.append(part)

    def finite():
      verdicts = []
      for part in parts:
        with tf.device(part.device):
          verdicts.append(tf.reduce_all(tf.math.is_finite(part)))
      return tf.stack(verdicts) if verdicts else tf.zeros([0], tf.bool)
    self._check = tf.function(finite, autograph=False).get_concrete_function()

  def __call__(self) -> List[str]:
    """The names of the variables with a value that is not finite (empty: all finite)."""
    verdicts = self._check().numpy()
    return list(dict.fromkeys(name for name, ok in zip(self._names, verdicts) if not ok))


class TeacherRefresh(step_hooks.StepHook):
  """Activates newly loaded teachers of a CodistillModel between training steps."""

  reads_logs = False

  def __init__(self, pool: TeacherPool, summary_writer: Optional[tf.summary.SummaryWriter] = None):
    self.pool = pool
    self.summary_writer = summary_writer
    self.swaps = 0
    self.loads_by_group: Dict[int, int] = {}  # peer group -> versions swapped in
    self.swap_seconds: List[float] = []
    self.load_seconds: List[float] = []  # each swapped version's load, off the training thread
    self.windows: List[Tuple[float, float]] = []  # (load began, swap ended), time.monotonic()

  def on_begin(self, model, step):
    self.pool.start()

  def on_end(self, model, step):
    self.stop()

  def stop(self) -> None:
    """Stops loading teachers (training ended, or stopped early)."""
    self.pool.stop()

  @property
  def rejections(self) -> int:
    """Peer versions refused (corrupt, non-finite, mismatched) so far."""
    return self.pool.rejections

  def wait_until_loaded(self, timeout_s: float) -> List[int]:
    """Blocks until every peer has a version loaded or ``timeout_s`` passed; the peers still
    missing."""
    return self.pool.wait_until_loaded(timeout_s)

  def on_step(self, model, step, logs):
    swaps: Dict[int, Tuple[float, float]] = {}

    def activate(update: TeacherUpdate) -> None:
      start = time.monotonic()
      model.activate_teacher(update.index, update.step)
      swaps[update.index] = (start, time.monotonic() - start)
    for update in self.pool.activate_updates(activate):
      start, swap = swaps[update.index]
      self.swaps += 1
      self.loads_by_group[update.peer] = self.loads_by_group.get(update.peer, 0) + 1
      self.swap_seconds.append(swap)
      self.load_seconds.append(update.load_seconds)
      self.windows.append((update.started_at, start + swap))
      logging.info("teacher: loaded peer group %d step %d from %s at step %d "
                   "(load %.3fs off-thread, swap %.4fs)", update.peer, update.step, update.path,
                   step, update.load_seconds, swap)
      if self.summary_writer is not None:
        with self.summary_writer.as_default(step=step):
          tf.summary.scalar(f"teacher/group_{update.peer}_step", update.step)
          tf.summary.scalar(f"teacher/group_{update.peer}_load_seconds", update.load_seconds)


class FirstTeachersWait(step_hooks.StepHook):
  """Holds the training thread once, at the first step from ``at_step`` on, until every teacher
  has a version loaded or ``timeout_s`` has passed, then activates them: a process that runs
  ahead of its peers (a faster machine, a later start) would otherwise train its whole run, or
  most of it, with no teacher. Not when every teacher is loaded already (a resumed run restores
  them with the model). Comes after the publisher among the hooks, so a version of this group
  from that step or earlier is published or on its way to the peers that wait for it."""

  reads_logs = False

  def __init__(self, refresh: TeacherRefresh, at_step: int, timeout_s: float):
    self.refresh = refresh
    self.at_step = at_step
    self.timeout_s = timeout_s
    self.waited_seconds: Optional[float] = None  # None: not reached yet
    self.windows: List[Tuple[float, float]] = []  # (wait began, ended), time.monotonic()

  def on_step(self, model, step, logs):
    if self.waited_seconds is not None or step < self.at_step:
      return
    if all(int(s) >= 0 for s in model.teacher_steps.numpy()):
      self.waited_seconds = 0.0
      return
    start = time.monotonic()
    missing = self.refresh.wait_until_loaded(self.timeout_s)
    self.waited_seconds = time.monotonic() - start
    self.windows.append((start, start + self.waited_seconds))
    if missing:
      logging.warning("teacher: no version of peer group(s) %s after waiting %.1fs at step %d "
                      "(wait_for_first_teachers_s=%s): training on without them", missing,
                      self.waited_seconds, step, self.timeout_s)
    else:
      logging.info("teacher: waited %.1fs at step %d for the peers' first versions",
                   self.waited_seconds, step)
    self.refresh.on_step(model, step, logs)
