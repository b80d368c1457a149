"""Step times of one codistillation group on real local clusters, on the step-time harness: a
parameter-server group (2 workers + 1 ps, this benchmark's coordinator) and a MultiWorkerMirrored
group (2 worker processes), each with three arms interleaved round by round: no teacher, one
loaded teacher, and one teacher refreshed from a peer's newer versions while it trains; and, on
request (``bench.cluster_step_times.groups = ['one_process']``), the same arms in one process
with no cluster, where a refresh's cost is not lost in the noise of four processes sharing the
machine. Each group is launched ``launches`` times (fresh task processes each time, the groups
alternating): single launches disagree by more than their own intervals, so the rounds of every
launch are pooled and their intervals resample launches first (``step_times.pool_processes``).

Every task is a real ``tf.distribute.Server`` or worker process on 127.0.0.1 (a measuring task is
this benchmark's ``child``: ``registry.child_command``). The refreshing arm runs the real
``TeacherPool`` (the library's default polling interval and loader priority) and
``TeacherRefresh`` (loads off the training thread, flips between steps); a peer's versions, real
SavedModels written before the arm, appear in the exchange directory every
``refresh_every_steps`` steps of the group (as a peer as fast as it, publishing every K steps,
would).

Each launch ends with the refresh-windows fit (``window_pairs``): the refreshing arm in one
``fit``, its time cut into windows as long as ``refresh_every_steps`` steps took in its rounds,
a quiet window (no new version) then a refreshing one (a version appears at its start), pair
after pair. Each pair's ratio compares steps seconds apart in one fit, where the arms' rounds
compare separate fits, whose mean step times differ by up to 20% (the ps's CPU per step moving
with them), more than the 3% the refresh goal allows. A refreshing window holds one load, as a
round of ``refresh_every_steps`` steps would, so the pairs' ratio is the throughput kept at that
cadence; the refresh goal reads it. The arms' ``refresh_vs_teacher`` is reported beside it: it
also counts what the refreshing machinery costs with no new version (the pool's polling, the
step-hook driver's thread), which runs in both windows.

Step times: per-step times inside one ``fit`` (MultiWorkerMirrored: the chief's batch ends;
parameter servers: the gaps between finished step functions on either worker, whose mean is the
group's step time). Ratios are formed within each round (their mean step times) and summarized
over rounds (``step_times``). A launch's raw times are kept in the work directory
(``<--work_dir>/cluster_step_times``) with its settings, the digest of the sources it ran and the
load around it: a run given the same ``--work_dir`` again reuses the launches finished there
under the same settings and sources (those still missing then run in the same order, maybe
invocations after the others: the summary lists each launch's record, with its time and load).

  python -m benchmarks.run cluster_step_times
  python -m benchmarks.run cluster_step_times \
      --gin_bindings='bench.cluster_step_times.launches = 3' \
      --gin_bindings='bench.cluster_step_times.rounds = 4' \
      --gin_bindings='bench.cluster_step_times.steps = 300'
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import gin
import tensorflow as tf
import tf_keras as keras
from absl import logging

import tf_codistill as tfc
from benchmarks import machine
from benchmarks import models
from benchmarks import registry
from benchmarks import standalone
from benchmarks import step_times
from benchmarks import verdicts
from tf_codistill import step_hooks
from tf_codistill.exchange import config as exchange_config
from tf_codistill.exchange import directory as exchange
from tf_codistill.models import ctr
from tf_codistill.teachers import pool as teachers
from tf_codistill.testing import local_cluster

NAME = "cluster_step_times"
ARMS = ("no_teacher", "teacher", "teacher_refresh")
GROUPS = ("parameter_server", "multi_worker_mirrored", "one_process")
TEACHER_FORMS = ("stacked", "clone")
GOALS = {"teacher_throughput_ratio_parameter_server": (">=", 0.93),
         "refresh_throughput_loss": ("<=", 0.03)}
PEER = 1
# What the summary keeps of each launch's record (beside its pooled measurement).
LAUNCH_RECORD = ("reused", "sources", "finished_at", "load_avg_1m_before", "load_avg_1m_after")


def _make_model(num_buckets: int) -> keras.Model:
  return ctr.ctr_model(num_buckets=num_buckets, embedding_dim=16, seed=0)


def _dataset(global_batch: int, num_buckets: int) -> tf.data.Dataset:
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
  return (models.ctr_examples(global_batch, num_buckets).batch(global_batch).repeat()
          .with_options(options))


def _build_arms(strategy: tf.distribute.Strategy,
                settings: dict) -> Dict[str, tfc.CodistillModel]:
  """The arms' compiled models, each with the same student weights; teachers hold them too."""
  sample = next(iter(_dataset(8, settings["num_buckets"])))[0]
  stacked = settings["teacher_form"] == "stacked"
  arms = {}
  with strategy.scope():
    for name in ARMS:
      student = _make_model(settings["num_buckets"])
      factory = (lambda s=student: ctr.ctr_teacher(s)) if stacked else None
      model = tfc.CodistillModel(student, 0 if name == "no_teacher" else 1,
                                 teachers=tfc.TeacherSpec(factory=factory))
      model.compile(optimizer=keras.optimizers.Adam(1e-3),
                    loss=keras.losses.BinaryCrossentropy(from_logits=True))
      model(sample)
      if name != "no_teacher":
        model.set_teacher_weights(0, model.student.get_weights(), step=0)
      arms[name] = model
  return arms


class PeerVersions:
  """A peer's versions of one real SavedModel, written before the arms run: while the refreshing
  arm trains, a new version (hard links to its files, its own COMPLETE marker) appears in the
  exchange directory whenever ``versions_due()`` has grown past the versions published
  (``publishing``), checked every ``check_s``."""

  def __init__(self, work: str, check_s: float, num_buckets: int):
    self.exchange_dir = os.path.join(work, "exchange")
    self._saved = os.path.join(work, "peer_saved_model")
    self._check_s = check_s
    peer = _make_model(num_buckets)
    peer(next(iter(_dataset(8, num_buckets)))[0])
    exchange.save_model(peer, self._saved, models.CTR_SPEC)
    self.published = 0

  @contextlib.contextmanager
  def publishing(self, versions_due: Callable[[], int]) -> Iterator[None]:
    """While the block runs, publishes a version each time ``versions_due()`` passes the count
    due when it began."""
    stop = threading.Event()
    thread = threading.Thread(target=self._run, args=(versions_due, stop), daemon=True)
    thread.start()
    try:
      yield
    finally:
      stop.set()
      thread.join()

  def _link(self, tmp: str) -> None:
    shutil.copytree(self._saved, tmp, copy_function=os.link, dirs_exist_ok=True)

  def _run(self, versions_due: Callable[[], int], stop: threading.Event) -> None:
    last = versions_due()
    while not stop.wait(self._check_s):
      now = versions_due()
      if now > last:
        last = now
        self.published += 1
        exchange.write_version(self.exchange_dir, PEER, self.published, self._link, {},
                               keep_last=3)


class RefreshWindows:
  """The schedule of the refresh-windows fit: from its first timed step on, ``pairs`` pairs of
  windows of ``window_s`` seconds each, a window with no new version then one at whose start a
  peer version appears (``versions_due``). Windows are of time, so a step's window is known from
  its own timestamps (``split``). With ``stop_fit`` it stops the fit after the last window
  (not under MultiWorkerMirrored, whose other worker would wait for the chief's next step)."""

  def __init__(self, model: keras.Model, clock, window_s: float, pairs: int, stop_fit: bool):
    self.model, self.clock, self.window_s, self.pairs = model, clock, window_s, pairs
    self.stop_fit = stop_fit
    self.start: Optional[float] = None

  def versions_due(self) -> int:
    """The versions due by now: one at the start of every second window, none before the first
    timed step."""
    if self.start is None:
      if not self.clock.intervals:
        return 0
      self.start = self.clock.intervals[0][1]
    window = int((time.monotonic() - self.start) // self.window_s)
    if window >= 2 * self.pairs and self.stop_fit:
      self.model.stop_training = True
    return (min(window, 2 * self.pairs - 1) + 1) // 2

  def window_of(self, t: float) -> Optional[int]:
    """The window ``t`` (time.monotonic()) falls in, or None outside them all."""
    if self.start is None or t < self.start:
      return None
    window = int((t - self.start) // self.window_s)
    return window if window < 2 * self.pairs else None

  def split(self, loads: Sequence[Tuple[float, float]]) -> dict:
    """The step times of each pair of windows the fit finished (a step's window is its end's) as
    {"quiet": [[...], ...], "refreshing": [[...], ...]}, and where each of ``loads`` (load began,
    swap ended) began: the count in each window of the pairs, and those begun outside them or
    swapped in a later window than they began in."""
    ends = [interval[1] for interval in self.clock.intervals]
    finished = 0 if self.start is None or not ends else min(
        self.pairs, int((ends[-1] - self.start) // (2 * self.window_s)))
    windows: List[List[float]] = [[] for _ in range(2 * finished)]
    for interval in self.clock.intervals:
      window = self.window_of(interval[1])
      if window is not None and window < 2 * finished:
        windows[window].append(interval[1] - interval[0])
    began = [0] * (2 * finished)
    outside = spilled = 0
    for load_start, swap_end in loads:
      window = self.window_of(load_start)
      if window is None or window >= 2 * finished:
        outside += 1
        continue
      began[window] += 1
      spilled += self.window_of(swap_end) != window
    return {"times": {"quiet": windows[0::2], "refreshing": windows[1::2]},
            "loads": {"quiet": began[0::2], "refreshing": began[1::2], "outside": outside,
                      "swapped_in_a_later_window": spilled},
            "window_s": self.window_s}


def _measure(strategy: tf.distribute.Strategy, data, work: str, chief: bool,
             settings: dict) -> dict:
  """Every arm once per round, the order rotated; the refreshing arm with a live teacher pool;
  then, unless ``settings['window_pairs']`` is 0, the refreshing arm's refresh-windows fit.
  Returns the raw step times and refresh records of this launch (``summarize`` pools them)."""
  arms = _build_arms(strategy, settings)
  ps = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
  model = arms["teacher_refresh"]
  every = settings["refresh_every_steps"]
  peer = (PeerVersions(work, settings["poll_interval_s"] / 4, settings["num_buckets"]) if chief
          else None)
  exchange_dir = os.path.join(work, "exchange")
  pool = teachers.TeacherPool(exchange_dir, [PEER], model, models.CTR_SPEC, [None, 1],
                              poll_interval_s=settings["poll_interval_s"],
                              loader_nice=settings["loader_nice"])
  refresh = teachers.TeacherRefresh(pool)
  driver = (step_hooks.ThreadDriver if ps else step_hooks.BatchDriver)([refresh])
  swaps: List[int] = []
  # Seconds from each refresh's load beginning to its swap: a version loaded as a round's fit
  # ends is swapped in at the arm's next round, so these can span other arms' rounds (the load
  # itself is ``refresh.load_seconds``).
  load_to_swap: List[float] = []

  def run_refreshing() -> List[float]:
    before = refresh.swaps
    # The peer is the harness's, not the group's: its step reads (a remote read under parameter
    # servers) stay few, at the cost of a version appearing up to its check late.
    with (peer.publishing(lambda: int(model.optimizer.iterations.numpy()) // every)
          if peer is not None else contextlib.nullcontext()):
      times = step_times.fit_step_times(model, data, settings["steps"], callbacks=[driver])
    swaps.append(refresh.swaps - before)
    load_to_swap.extend(end - start for start, end in refresh.windows[before:])
    return times

  calls = {name: (lambda m=arms[name]: step_times.fit_step_times(m, data, settings["steps"]))
           for name in ARMS[:2]}
  calls["teacher_refresh"] = run_refreshing
  times = step_times.interleave(calls, settings["rounds"])
  result = {"times": times, "refreshes_per_round": swaps,
            "load_seconds": list(refresh.load_seconds), "load_to_swap_seconds": load_to_swap}
  if settings["window_pairs"]:
    # A window as long as the refreshing arm's rounds took for refresh_every_steps steps.
    step_s = statistics.median(statistics.fmean(r) for r in times["teacher_refresh"])
    mirrored = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    windows = _refresh_windows(model, data, driver, refresh, peer, every * step_s, mirrored,
                               settings)
    if chief:
      result["windows"] = windows
  return result


def _refresh_windows(model: tfc.CodistillModel, data, driver, refresh: teachers.TeacherRefresh,
                     peer: Optional[PeerVersions], window_s: float, mirrored: bool,
                     settings: dict) -> Optional[dict]:
  """The refresh-windows fit: the refreshing arm in one ``fit`` through ``settings
  ['window_pairs']`` pairs of windows (``RefreshWindows``); its step times by window, with the
  loads begun in each. It runs half again as many steps as the windows should take (under
  MultiWorkerMirrored all of them, on every worker). Elsewhere the schedule stops it after its
  last window, and it may run three times the windows' steps, so steps faster than the rounds'
  (load that eased) still fill every window. A worker that does not measure (``peer`` None) only
  trains along."""
  clock = step_times.step_clock(model)
  pairs = settings["window_pairs"]
  schedule = RefreshWindows(model, clock, window_s, pairs, stop_fit=not mirrored)
  before = len(refresh.windows)
  window_steps = 2 * pairs * settings["refresh_every_steps"]
  with peer.publishing(schedule.versions_due) if peer is not None else contextlib.nullcontext():
    model.fit(data, epochs=1, verbose=0, callbacks=[driver, clock],
              steps_per_epoch=step_times.SKIP + int((1.5 if mirrored else 3) * window_steps))
  return schedule.split(refresh.windows[before:]) if peer is not None else None


def child(spec: dict) -> None:
  """One task of a launch, in a process of its own (``run_group`` starts it): ``spec`` holds its
  ``role``, the ``cluster``, its ``task_index``, the launch's ``work`` directory, where the
  measuring task (task 0) writes its times (``part_out``) and the launch's ``settings``. Roles:
  ``coordinate``, the parameter-server group's coordinator; ``mirrored``, a MultiWorkerMirrored
  worker (TF_CONFIG set by the parent); ``one_process``, the arms with no cluster (the default
  strategy): a refresh's cost where no other task shares the machine."""
  settings, role = spec["settings"], spec["role"]
  batch, buckets = settings["batch_size"], settings["num_buckets"]
  if role == "coordinate":
    strategy = local_cluster.ps_strategy(spec["cluster"])
    data = keras.utils.experimental.DatasetCreator(lambda _: _dataset(batch, buckets))
  elif role == "mirrored":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    data = _dataset(batch * 2, buckets)
  elif role == "one_process":
    strategy, data = tf.distribute.get_strategy(), _dataset(batch, buckets)
  else:
    raise ValueError(f"unknown role {role!r}")
  chief = spec["task_index"] == 0
  result = _measure(strategy, data, spec["work"], chief, settings)
  if chief:
    machine.write_json(spec["part_out"], result)


def finished_launch(work: str, settings: dict, sources: str) -> Optional[dict]:
  """The record a launch left in ``work`` under ``settings`` (what ``measure_step_times``
  builds) and ``sources`` (``standalone.source_digest()``), or None."""
  launch = machine.read_json_or(os.path.join(work, "launch.json"))
  if (not isinstance(launch, dict) or "part" not in launch
      or launch.get("config") != settings or launch.get("sources") != sources):
    return None
  return launch


def _child(role: str, part: str, cluster: dict, settings: dict, index: int = 0,
           env: Optional[dict] = None) -> subprocess.Popen:
  """A task of the launch whose times go to ``part``: this benchmark's ``child`` in a process of
  its own, given everything it needs (no flags, no gin)."""
  spec = {"role": role, "cluster": cluster, "task_index": index, "part_out": part,
          "work": os.path.dirname(part), "settings": settings}
  return local_cluster.start(registry.child_command(NAME, spec),
                             env={**os.environ, **(env or {})}, cwd=os.getcwd())


def run_group(group: str, work: str, settings: dict, sources: str) -> dict:
  """Starts one group's tasks on 127.0.0.1 under ``settings`` (what ``measure_step_times``
  builds) and returns its launch record (``part``: the measurement; kept in ``work``). A launch
  finished there before under the same settings and ``sources`` is returned instead, marked
  ``reused``."""
  done = finished_launch(work, settings, sources)
  if done is not None:
    logging.info("%s: reusing the launch finished in %s", group, work)
    return {**done, "reused": True}
  if os.path.exists(work):
    logging.warning("%s: %s holds no launch finished under these settings and sources; "
                    "measuring it again", group, work)
  shutil.rmtree(work, ignore_errors=True)
  os.makedirs(work)
  part = os.path.join(work, "part.json")
  if group == "parameter_server":
    cluster = local_cluster.free_cluster({"chief": 1, "worker": 2, "ps": 1})
    serving = local_cluster.servers(cluster)
    measuring = lambda: [_child("coordinate", part, cluster, settings)]
  elif group == "one_process":
    serving = contextlib.nullcontext()
    measuring = lambda: [_child("one_process", part, {}, settings)]
  else:
    cluster = local_cluster.free_cluster({"worker": 2})
    serving = contextlib.nullcontext()
    measuring = lambda: [_child("mirrored", part, cluster, settings, i, {"TF_CONFIG": json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": i}})}) for i in range(2)]
  load_before = os.getloadavg()[0]
  with serving:
    tasks = measuring()
    try:
      codes = [p.wait(timeout=3600) for p in tasks]
    finally:
      for p in tasks:
        p.kill()
        p.wait()
  if any(codes):
    raise RuntimeError(f"{group}: a measuring task exited with {codes}")
  launch = {"config": settings, "sources": sources, "part": machine.read_json(part),
            "load_avg_1m_before": load_before, "load_avg_1m_after": os.getloadavg()[0],
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
  machine.write_json(os.path.join(work, "launch.json"), launch)
  return {**launch, "reused": False}


def run_launches(groups: Sequence[str], launches: int, work: str, settings: dict,
                 sources: str, run: Callable[..., dict] = run_group,
                 progress: Callable[[str], None] = print) -> Dict[str, List[dict]]:
  """``launches`` launches of every group, the groups alternating (``run``: ``run_group``),
  each in ``work/<group>_<index>``; every group's launch records in order."""
  records: Dict[str, List[dict]] = {group: [] for group in groups}
  for index in range(launches):
    for group in groups:
      records[group].append(run(group, os.path.join(work, f"{group}_{index}"), settings, sources))
      progress(f"{group}: launch {index + 1} of {launches} done")
  return records


def _median_max(values: List[float]) -> Dict[str, Optional[float]]:
  return {"median": statistics.median(values) if values else None,
          "max": max(values, default=None)}


def summarize(launches: List[dict]) -> dict:
  """One group's launches (their measurements, ``part``) pooled: step-time statistics, the paired
  ratios (mean step times per round; intervals that resample launches, each launch's median),
  the refreshes' records and, where launches ran one, the refresh windows
  (``summarize_windows``)."""
  times, clusters = step_times.pool_processes([launch["times"] for launch in launches])
  ratio = lambda arm, baseline: step_times.throughput_ratio(times, arm, baseline,
                                                            statistics.fmean, clusters)
  every = lambda key: [value for launch in launches for value in launch[key]]
  summary = {"step_times": step_times.describe(times), "launches": len(launches),
             "refreshes_per_round": every("refreshes_per_round"),
             "load_seconds": _median_max(every("load_seconds")),
             "load_to_swap_seconds": _median_max(every("load_to_swap_seconds")),
             "ratios": {"teacher_vs_no_teacher": ratio("teacher", "no_teacher"),
                        "refresh_vs_teacher": ratio("teacher_refresh", "teacher")}}
  windows = [launch["windows"] for launch in launches if launch.get("windows")]
  if windows:
    summary["refresh_windows"] = summarize_windows(windows)
  return summary


def summarize_windows(launches: List[dict]) -> dict:
  """The refresh windows of several launches pooled: per pair, the refreshing window's
  throughput over the quiet window's before it (mean step times; the interval resamples
  launches), the pairs counted (a pair with a window of no step is left out) and where the
  loads began."""
  runs = []
  for launch in launches:
    pairs = [(quiet, busy) for quiet, busy in zip(launch["times"]["quiet"],
                                                  launch["times"]["refreshing"]) if quiet and busy]
    runs.append({"quiet": [q for q, _ in pairs], "refreshing": [b for _, b in pairs]})
  runs = [run for run in runs if run["quiet"]]
  if not runs:
    return {"pairs": 0}
  times, clusters = step_times.pool_processes(runs)
  total = lambda key: sum(launch["loads"][key] for launch in launches)
  loads = {"in_quiet_windows": sum(sum(launch["loads"]["quiet"]) for launch in launches),
           "in_refreshing_windows": sum(sum(launch["loads"]["refreshing"]) for launch in launches),
           "outside": total("outside"),
           "swapped_in_a_later_window": total("swapped_in_a_later_window")}
  return {"pairs": len(clusters), "window_s": [launch["window_s"] for launch in launches],
          "refreshing_vs_quiet": step_times.throughput_ratio(times, "refreshing", "quiet",
                                                             statistics.fmean, clusters),
          "step_times": step_times.describe(times), "loads": loads,
          "refreshing_windows_with_one_load": sum(
              count == 1 for launch in launches for count in launch["loads"]["refreshing"])}


def goals(groups: Dict[str, dict]) -> Dict[str, dict]:
  """The goals from the groups measured: the teacher's throughput ratio in the
  parameter-server group, and the largest throughput share lost to refreshes in any group (its
  refresh windows' ratio where it has them, else its arms' ``refresh_vs_teacher``); each with
  its interval and its value in every launch."""
  out = {}
  if "parameter_server" in groups:
    ratio = groups["parameter_server"]["ratios"]["teacher_vs_no_teacher"]
    out["teacher_throughput_ratio_parameter_server"] = (
        ratio["median"], ratio["interval90"], ratio.get("process_medians"))
  refresh = {g: (r["refresh_windows"]["refreshing_vs_quiet"]
                 if "refreshing_vs_quiet" in r.get("refresh_windows", {})
                 else r["ratios"]["refresh_vs_teacher"]) for g, r in groups.items()}
  losses = {g: 1.0 - ratio["median"] for g, ratio in refresh.items()}
  worst = max(losses, key=losses.get)
  low, high = refresh[worst]["interval90"]
  medians = refresh[worst].get("process_medians")
  out["refresh_throughput_loss"] = (losses[worst], [1.0 - high, 1.0 - low],
                                    None if medians is None else [1.0 - m for m in medians])
  met = verdicts.judge({name: value for name, (value, _, _) in out.items()},
                          {name: GOALS[name] for name in out})
  judged = {name: {**met[name], "value": value, "interval90": interval,
                   "launch_values": launch_values}
            for name, (value, interval, launch_values) in out.items()}
  judged["refresh_throughput_loss"]["group"] = worst
  return judged


def _check(groups: Sequence[str], launches: int, window_pairs: int, loader_nice: int,
           teacher_form: str) -> None:
  """Refuses, naming the gin parameter, what the benchmark cannot run."""
  if isinstance(groups, str) or not groups or set(groups) - set(GROUPS):
    raise ValueError(f"bench.{NAME}.groups: each must be one of {', '.join(GROUPS)} "
                     f"(got {groups!r})")
  if teacher_form not in TEACHER_FORMS:
    raise ValueError(f"bench.{NAME}.teacher_form={teacher_form!r}: one of {TEACHER_FORMS}")
  if launches < 1:
    raise ValueError(f"bench.{NAME}.launches={launches}: at least 1")
  if window_pairs < 0:
    raise ValueError(f"bench.{NAME}.window_pairs={window_pairs}: at least 0")
  low, high = exchange_config.LOADER_NICE_RANGE
  if not low <= loader_nice <= high:
    raise ValueError(f"bench.{NAME}.loader_nice={loader_nice}: from {low} to {high}")


@gin.configurable(NAME, module="bench", denylist=["ctx"])
def measure_step_times(ctx: registry.Context, batch_size: int = 256, num_buckets: int = 20_000,
                       steps: int = 300, rounds: int = 4, launches: int = 3,
                       refresh_every_steps: int = 100, window_pairs: int = 15,
                       poll_interval_s: float = tfc.Exchange.poll_interval_s,
                       loader_nice: int = tfc.Exchange.loader_nice,
                       teacher_form: str = "stacked",
                       groups: Sequence[str] = ("parameter_server", "multi_worker_mirrored")
                       ) -> dict:
  """Every group's launches (each kept in ``ctx.work_dir``, reused by a run under the same
  settings and sources), pooled, and the goals.

  Args:
    ctx: the run's context.
    batch_size: examples per worker step.
    num_buckets: hash buckets per categorical feature.
    steps: timed steps per arm per round (each in one fit).
    rounds: interleaved rounds per launch.
    launches: fresh launches of each group, their rounds pooled (at least 1).
    refresh_every_steps: a new peer version appears every this many steps of the group measured
      (a peer as fast as it publishing every K steps).
    window_pairs: pairs of windows in each launch's refresh-windows fit (0: none): the refreshing
      arm in one fit, a window with no new version, then one at whose start a version appears,
      each as long as ``refresh_every_steps`` steps took in its rounds; the refresh goal reads
      their throughput ratio.
    poll_interval_s: how often the refreshing arm's teacher pool looks for new versions (the
      library's default); the harness's peer checks the step 4 times as often.
    loader_nice: the refreshing arm's loading thread's nice increment (the library's default),
      within ``exchange_config.LOADER_NICE_RANGE``.
    teacher_form: the teachers' form: ``stacked``, the CTR model's own (models.ctr_teacher, one
      stacked table), or ``clone``, a clone of the student.
    groups: the groups measured, of parameter_server, multi_worker_mirrored, one_process.
  """
  _check(groups, launches, window_pairs, loader_nice, teacher_form)
  # The settings a launch's times depend on (a finished launch is reused only under these).
  settings = {"batch_size": batch_size, "num_buckets": num_buckets, "steps": steps,
              "rounds": rounds, "refresh_every_steps": refresh_every_steps,
              "window_pairs": window_pairs, "poll_interval_s": float(poll_interval_s),
              "loader_nice": loader_nice, "teacher_form": teacher_form}
  records = run_launches(list(groups), launches, ctx.work_dir, settings,
                         standalone.source_digest(), progress=ctx.progress)
  summary = summarize_groups(records, settings, launches)
  ctx.progress("\n".join(_tables(summary)))
  for name, v in summary["goal_verdicts"].items():
    ctx.progress(f"goal {name}: {v['value']:.3f} {v['threshold'][0]} {v['threshold'][1]} "
                 f"-> {'met' if v['met'] else 'MISSED'}")
  return summary


def summarize_groups(records: Dict[str, List[dict]], settings: dict, launches: int) -> dict:
  """The summary: every group's launch records (``run_launches``) pooled (``summarize``), with
  what the summary keeps of each record, and the goals."""
  groups = {group: {**summarize([r["part"] for r in runs]),
                    "launch_records": [{key: r.get(key) for key in LAUNCH_RECORD} for r in runs]}
            for group, runs in records.items()}
  judged = goals(groups)
  return {"groups": groups, "goals": {k: v["value"] for k, v in judged.items()},
          "goal_verdicts": judged, "config": {**settings, "launches": launches},
          "harness": "per-step times inside one fit, arms interleaved, mean step time ratios, "
                     "launches pooled (intervals resample launches); refresh windows "
                     "alternating inside one fit of the refreshing arm"}


def _tables(summary: dict) -> List[str]:
  """Every group's step times, throughput ratios and refresh windows, as Markdown."""
  groups = summary["groups"]
  lines = ["| group | arm | median ms | mean ms | p90 ms | steps |",
           "| --- | --- | --- | --- | --- | --- |"]
  lines += [f"| {group} | {arm} | {row['median_ms']:.2f} | {row['mean_ms']:.2f} | "
            f"{row['p90_ms']:.2f} | {row['steps']} |"
            for group, result in groups.items() for arm, row in result["step_times"].items()]
  lines += ["", "| group | throughput ratio | median | 90% interval | per launch | refreshes per "
            "round |", "| --- | --- | --- | --- | --- | --- |"]
  for group, result in groups.items():
    for name, ratio in result["ratios"].items():
      low, high = ratio["interval90"]
      by_launch = ", ".join(f"{m:.3f}" for m in ratio.get("process_medians") or ())
      lines.append(f"| {group} | {name} | {ratio['median']:.3f} | [{low:.3f}, {high:.3f}] | "
                   f"{by_launch} | {result['refreshes_per_round']} |")
  windows = {group: result["refresh_windows"] for group, result in groups.items()
             if result.get("refresh_windows", {}).get("pairs")}
  if windows:
    lines += ["", "| group | refresh windows: refreshing vs quiet | 90% interval | pairs | loads |",
              "| --- | --- | --- | --- | --- |"]
    for group, window in windows.items():
      ratio = window["refreshing_vs_quiet"]
      low, high = ratio["interval90"]
      loads = ", ".join(f"{key} {count}" for key, count in window["loads"].items())
      lines.append(f"| {group} | {ratio['median']:.3f} | [{low:.3f}, {high:.3f}] | "
                   f"{window['pairs']} | {loads} |")
  return lines


BENCHMARK = registry.Benchmark(
    NAME, measure_step_times, tables=_tables, child=child,
    title="Cluster step times: a teacher's and a refresh's cost on real local clusters")
