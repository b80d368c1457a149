"""Wall-clock across a slow link: the case rare communication between groups exists for.

Two "machines" on this one, each one CPU, joined by a link of limited bandwidth and added
latency; the methods of a recorded suite (default ``english_lm``) run across it as a user would
run them on two machines:

- a sync arm (one group, e.g. ``sync_2b``): one MultiWorkerMirrored group of 2 tasks (chief + 1
  worker) at the arm's global batch, each task pinned to its own CPU; every connection of the
  worker, and every connection to it, goes through a relay in the launch's network namespace
  that holds each chunk for the link's one-way latency and carries at most its bandwidth each
  way (``netfaults.latency``): the all-reduce crosses the link every step;
- a cross-group arm (2 groups: ``codistill``, ``diloco_h500``, ...): each group one process
  pinned to its own CPU, launched by its own ``tf-codistill-launch --groups=<g>`` as on two
  machines; the exchange directory lives on group 0's side and group 1 reaches it through a
  FUSE mount (``faultfs``) that delays every file operation by the link's round trip and
  carries at most its bandwidth each way (a pessimistic remote file system: no pipelining).

Each (method, link) run trains ``steps`` steps from the arm's recorded configuration (seed
``seed``, the suite's evaluation interval) and records the seconds per step between its first
and last evaluation (evaluations included at the protocol's rate; the slower group for
cross-group arms) and the bytes that crossed the link (the relay's or the mount's counts).

Time to the target is projected, not run: the steps the method's recorded seed-mean curve needs
to reach the best sync arm's best loss (the suite's target) x its seconds per step over the
link. Methods whose recorded curve never reaches the target have no time; so that every method
has one, the same projection is given for the *common* loss: the highest best loss among the
methods, which every recorded method reaches.

  python -m benchmarks.run slow_link
  python -m benchmarks.run slow_link --gin_bindings="bench.slow_link.links = ['100mbit_20ms']"

Runs are recorded as they end (``<results_dir>/runs/<method>_<link>.json``, with the load
before and after) and reused by a later invocation with the same settings: the benchmark goes
on across invocations. Needs what ``netfaults`` and ``faultfs`` need (root, nftables, FUSE).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import sys
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import gin

from benchmarks import machine
from benchmarks import protocol
from benchmarks import registry
from benchmarks import runner
from benchmarks import standalone
from benchmarks import suite_spec as spec
from tf_codistill import layout
from tf_codistill.testing import faultfs
from tf_codistill.testing import netfaults

_LINK = re.compile(r"^(\d+(?:\.\d+)?)(mbit|gbit)_(\d+(?:\.\d+)?)ms$")
NO_LINK = "none"
TIMEOUT_S = 4 * 3600.0  # one run may take this long before it is stopped as hung


@dataclasses.dataclass(frozen=True)
class Link:
  """A link between the two machines: ``bytes_per_s`` each way (None: no link, both on this
  machine's loopback and disk) and ``one_way_s`` of added latency."""
  name: str
  bytes_per_s: Optional[float]
  one_way_s: float

  @classmethod
  def parse(cls, name: str) -> "Link":
    """'100mbit_20ms' (100 Mbit/s, 20 ms each way), '1gbit_20ms', or 'none'."""
    if name == NO_LINK:
      return cls(name, None, 0.0)
    match = _LINK.match(name)
    if not match:
      raise ValueError(f"bench.slow_link.links: {name!r} is not '<rate>mbit_<ms>ms', "
                       f"'<rate>gbit_<ms>ms' or {NO_LINK!r} (e.g. '100mbit_20ms')")
    rate, unit, ms = match.groups()
    bits = float(rate) * (1e9 if unit == "gbit" else 1e6)
    return cls(name, bits / 8, float(ms) / 1000)

  def describe(self) -> str:
    if self.bytes_per_s is None:
      return "no link (same machine)"
    bits = self.bytes_per_s * 8
    rate = f"{bits / 1e9:g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:g} Mbit/s"
    return f"{rate}, {self.one_way_s * 1000:g} ms each way"


def _command(model_dir: str, arm: spec.Arm, bindings: Sequence[str], flags: Sequence[str]
             ) -> List[str]:
  """The tf-codistill-launch command line of one side of a run."""
  return ([sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={model_dir}",
           "--max_restarts=0", *flags]
          + [f"--gin_file={runner.gin_path(f)}" for f in arm.gin_files]
          + [f"--gin_bindings={b}" for b in bindings])


def _pin(pid: int, cpu: int) -> None:
  """Pins every thread process ``pid`` has now (and so those it starts) to ``cpu``; nothing if
  it has ended (its launch then fails, saying why)."""
  try:
    tids = os.listdir(f"/proc/{pid}/task")
  except FileNotFoundError:
    return
  for tid in tids:
    with contextlib.suppress(ProcessLookupError, FileNotFoundError):  # the thread ended meanwhile
      os.sched_setaffinity(int(tid), {cpu})


@contextlib.contextmanager
def _held(faults: netfaults.NetworkFaults, pids: Sequence[int]) -> Iterator[None]:
  """Keeps the tasks ``pids`` stopped from when this process sees each in the launch's
  namespace until the block ends, so that none connects before a fault made in the block (a
  connection opened earlier keeps its direct path); refuses at once if one already had."""
  stopped: List[int] = []
  try:
    for pid in pids:
      faults.wait_inside(pid)
      stopped.append(pid)
      with contextlib.suppress(ProcessLookupError):  # it ended: the launch says why
        os.kill(pid, signal.SIGSTOP)
    yield
    with contextlib.suppress(FileNotFoundError):
      early = {pid: netfaults.socket_ports(pid, connected_only=True) for pid in pids}
      if any(early.values()):
        raise RuntimeError(f"slow_link: tasks connected before the link was made ({early}: "
                           "pid -> local ports); a time with a direct path is not recorded")
  finally:
    for pid in stopped:
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def _two_cpus() -> Tuple[int, int]:
  """The two CPUs the two machines run on (this process's first two)."""
  cpus = sorted(os.sched_getaffinity(0))
  if len(cpus) < 2:
    raise RuntimeError(f"slow_link needs 2 CPUs (one per machine), this process may use {cpus}")
  return cpus[0], cpus[1]


def _sync_over_link(arm: spec.Arm, link: Link, model_dir: str, bindings: Sequence[str],
                    timeout_s: float) -> dict:
  """Runs the sync arm as a MultiWorkerMirrored group of chief + 1 worker, the worker across the
  link; returns the group dirs and the link's byte counts."""
  cpus = _two_cpus()
  launch = standalone.Launch(_command(model_dir, arm, bindings, [
      "--num_groups=1", "--strategy=multi_worker_mirrored", "--workers_per_group=1"]))
  tasks = ((0, "chief", 0), (0, "worker", 0))
  faults, fault = None, None
  try:
    def started():
      events = launch.events()
      network = next((e for e in events if e["event"] == "network"), None)
      launched = {(e["group"], e["task"], e["index"]): e for e in events
                  if e["event"] == "launched"}
      return (network, launched) if network and all(t in launched for t in tasks) else None
    network, launched = standalone.wait_for(started, 120.0, "the sync group's two tasks")
    for task, cpu in zip(tasks, cpus):
      _pin(launched[task]["pid"], cpu)
    if link.bytes_per_s is not None:
      worker = launched[tasks[1]]
      faults = netfaults.NetworkFaults(network["namespace_pid"])
      with _held(faults, [launched[t]["pid"] for t in tasks]):
        fault = faults.latency(worker["pid"], link.one_way_s, link.bytes_per_s,
                               ports=[int(worker["address"].rsplit(":", 1)[1])])
    launch.finish(timeout_s)
  except BaseException:
    launch.stop()
    raise
  finally:
    if faults is not None:
      faults.heal_all()
  if fault is not None and fault.connections < 2:
    raise RuntimeError(
        f"slow_link: {fault.connections} of the sync group's connections crossed the "
        f"{link.name} link (at least 2 must: the worker's own, and the chief's to it); a time "
        f"taken with a direct path beside the link is not recorded ({model_dir})")
  carried = fault.bytes_carried if fault else {"out": 0, "in": 0}
  return {"group_dirs": [layout.group_dir(model_dir, 0)],
          "link_bytes": {"worker_sent": carried["out"], "worker_received": carried["in"]},
          "relayed_connections": fault.connections if fault else 0}


def _groups_over_link(arm: spec.Arm, link: Link, model_dir: str, bindings: Sequence[str],
                      timeout_s: float) -> dict:
  """Runs a 2-group arm as two launches (one per machine, ``--groups``), group 1 reaching the
  exchange directory on group 0's side across the link; returns the group dirs and the bytes
  group 1 read and wrote through it."""
  if arm.num_groups != 2:
    raise ValueError(f"bench.slow_link.methods: arm {arm.name!r} has {arm.num_groups} groups; "
                     "a cross-group method runs with 2 (one per machine)")
  exchange = os.path.join(model_dir, "exchange")
  far = (faultfs.FaultyDirectory(exchange, os.path.join(model_dir, "exchange_across_link"))
         if link.bytes_per_s is not None else None)
  launches = []
  try:
    if far is not None:
      far.set("slow", delay_s=2 * link.one_way_s, bytes_per_s=link.bytes_per_s)
    for group, cpu in enumerate(_two_cpus()):
      where = far.path if far is not None and group == 1 else exchange
      launches.append(standalone.Launch(_command(
          os.path.join(model_dir, f"machine_{group}"), arm, bindings,
          [f"--num_groups={arm.num_groups}", f"--groups={group}", f"--exchange_dir={where}"]),
          cpus=[cpu]))
    deadline = time.monotonic() + timeout_s
    for launch in launches:
      launch.finish(max(1.0, deadline - time.monotonic()))
  except BaseException:
    for launch in launches:
      launch.stop()
    raise
  finally:
    if far is not None:
      far.close()
  moved = far.bytes_moved() if far is not None else {"read": 0, "written": 0}
  return {"group_dirs": [layout.group_dir(os.path.join(model_dir, f"machine_{g}"), g)
                         for g in range(2)],
          "link_bytes": {"group_1_read": moved["read"], "group_1_wrote": moved["written"]}}


def seconds_per_step(progress: Sequence[dict]) -> Tuple[float, int]:
  """(seconds per step, steps measured) between a run's first and last evaluation."""
  points = sorted((int(r["step"]), float(r["wall_time_s"])) for r in progress
                  if r.get("wall_time_s") is not None)
  if len(points) < 2 or points[-1][0] == points[0][0]:
    raise ValueError(f"a run needs 2 evaluations to time its steps, it has {len(points)}: "
                     "raise bench.slow_link.steps to at least twice the suite's "
                     "trainer.train.steps_per_epoch")
  (first_step, first_s), (last_step, last_s) = points[0], points[-1]
  return (last_s - first_s) / (last_step - first_step), last_step - first_step


def run_method(arm: spec.Arm, suite: spec.Suite, link: Link, model_dir: str,
               data: Sequence[str], steps: int, seed: int, timeout_s: float = TIMEOUT_S) -> dict:
  """Trains ``steps`` steps of ``arm`` across ``link``; its seconds per step and link bytes."""
  shutil.rmtree(model_dir, ignore_errors=True)
  threads = suite.threads_per_group  # as the suite's recorded runs had
  bindings = (list(suite.common_bindings) + list(arm.gin_bindings) + list(data)
              + [f"trainer.train.seed = {seed}", f"trainer.train.train_steps = {steps}",
                 f"tfc.Checkpoints.every_steps = {steps}", "trainer.train.verbose = 0"]
              + ([f"trainer.train.intra_op_threads = {threads}",
                  f"trainer.train.inter_op_threads = {threads}"] if threads else []))
  started = time.monotonic()
  over = _sync_over_link if arm.num_groups == 1 else _groups_over_link
  ran = over(arm, link, model_dir, bindings, timeout_s)
  timed = [seconds_per_step(runner.read_curve(layout.RunDir(group_dir).progress))
           for group_dir in ran["group_dirs"]]
  total = sum(ran["link_bytes"].values())
  return {"method": arm.name, "link": link.name, "steps": steps, "seed": seed,
          "seconds_per_step": max(s for s, _ in timed),
          "seconds_per_step_per_group": [round(s, 4) for s, _ in timed],
          "steps_timed": min(n for _, n in timed), "link_bytes": ran["link_bytes"],
          "link_bytes_per_step": total / steps, "wall_s": round(time.monotonic() - started, 1),
          **({"relayed_connections": ran["relayed_connections"]}
             if "relayed_connections" in ran else {})}


def recorded_curves(suite: spec.Suite, paths: spec.RunPaths, names: Sequence[str]
                    ) -> Dict[str, protocol.Curve]:
  """{arm: its recorded seed-mean validation curve} for those of ``names`` that are recorded."""
  arms = {a.name: a for a in suite.arms}
  curves = {}
  for name in names:
    try:
      seeds = runner.recorded_curves(arms[name], paths, suite.loss_key)
    except OSError:  # not every seed recorded yet
      continue
    curve = protocol.mean_curve(list(seeds.values()))
    if curve:
      curves[name] = curve
  return curves


def projections(runs: Sequence[dict], curves: Dict[str, protocol.Curve],
                target_arms: Sequence[str]) -> dict:
  """The target and common losses, and per run the recorded steps to each and the projected
  wall time (steps x its seconds per step across the link)."""
  sync = [protocol.best_loss(curves[a]) for a in target_arms if a in curves]
  target = min(sync) if sync else None
  methods = sorted({r["method"] for r in runs} & set(curves))
  common = max((protocol.best_loss(curves[m]) for m in methods), default=None)
  rows = []
  for run in runs:
    curve = curves.get(run["method"])
    row = {"method": run["method"], "link": run["link"]}
    for name, loss in (("target", target), ("common", common)):
      steps = protocol.steps_to(curve, loss) if curve and loss is not None else None
      row[f"steps_to_{name}"] = steps
      row[f"hours_to_{name}"] = (None if steps is None
                                 else round(steps * run["seconds_per_step"] / 3600, 3))
    rows.append(row)
  return {"target_loss": target, "target_arms": [a for a in target_arms if a in curves],
          "common_loss": common, "rows": rows}


def _suite(name: str, results_root: str, work_root: str, prepare_data: bool = True
           ) -> Tuple[spec.Suite, spec.RunPaths, List[str]]:
  """Suite ``name`` as recorded (B* and learning rates resolved), its paths and data bindings
  (its data prepared, for runs)."""
  suite = spec.load_suite([os.path.join(registry.SUITES_DIR, f"{name}.gin")])
  paths = spec.RunPaths(work_dir=os.path.join(work_root, suite.name),
                        results_dir=os.path.join(results_root, suite.name),
                        data_dir=os.path.join(work_root, "data"))
  data = runner.data_bindings(suite, paths.data_dir, paths.corpus_manifest, prepare_data)
  concrete, _ = runner.prepare(suite, paths, data)
  return concrete, paths, data


@gin.configurable("slow_link", module="bench", denylist=["ctx", "run_missing"])
def measure_links(ctx: registry.Context, suite: str = "english_lm",
                  methods: Sequence[str] = ("sync_2b", "codistill", "diloco_h500"),
                  links: Sequence[str] = (NO_LINK, "1gbit_20ms", "100mbit_20ms"),
                  steps: int = 300, seed: int = 0, run_missing: bool = True) -> dict:
  """Every (method, link) run, links interleaved method by method, and the projections (with
  ``run_missing`` False: of the runs recorded so far, running none; ``missing`` lists the rest).

  Args:
    ctx: the run's context (the suite's recorded results and data are found beside it).
    suite: the recorded suite whose arms are the methods and whose curves give the steps.
    methods: the suite's arms to run: 1 group (sync, across a MultiWorkerMirrored link) or 2.
    links: 'none' or '<rate>mbit_<ms>ms' / '<rate>gbit_<ms>ms' (bandwidth, one-way latency).
    steps: training steps per run (at least two evaluations' worth).
    seed: the runs' seed.
  """
  parsed = [Link.parse(name) for name in links]
  for reason in (netfaults.unavailable(), faultfs.unavailable()):
    if reason and run_missing and any(link.bytes_per_s for link in parsed):
      raise RuntimeError(f"a slow link cannot be made here: {reason}")
  results_root, work_root = os.path.dirname(ctx.results_dir), os.path.dirname(ctx.work_dir)
  concrete, paths, data = _suite(suite, results_root, work_root, prepare_data=run_missing)
  arms = {a.name: a for a in concrete.arms}
  unknown = [m for m in methods if m not in arms]
  if unknown:
    raise ValueError(f"bench.slow_link.methods: {unknown} are not arms of suite {suite!r} "
                     f"({sorted(arms)})")
  settings = {"suite": suite, "steps": steps, "seed": seed}
  runs, missing, start = [], [], time.time()
  for method in methods:
    for link in parsed:
      record = machine.recorded(_run_path(ctx.results_dir, method, link.name), settings)
      if record is None and not run_missing:
        missing.append(f"{method}_{link.name}")
        continue
      if record is None:
        load, above = ctx.settle(f"{method} over {link.name}")
        record = {**run_method(arms[method], concrete, link,
                               os.path.join(ctx.work_dir, f"{method}_{link.name}"), data, steps,
                               seed),
                  "settings": settings, "link_described": link.describe(),
                  "load_1m_before": load, "started_above_nproc_load": above,
                  "load_1m_at_end": machine.load_1m(),
                  "cpu_model": machine.cpu_model(),
                  "tensorflow": machine.tensorflow_version(),
                  "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        machine.write_json(_run_path(ctx.results_dir, method, link.name), record, indent=1)
        shutil.rmtree(os.path.join(ctx.work_dir, f"{method}_{link.name}"), ignore_errors=True)
      runs.append(record)
      ctx.progress(json.dumps(record))
  curves = recorded_curves(concrete, paths, list(methods) + list(concrete.sync_arms))
  return {"cpus": machine.cores(), "started_utc": time.strftime(
              "%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
          "suite": suite, "settings": settings, "runs": runs,
          "projections": projections(runs, curves, concrete.sync_arms),
          "missing": missing, "complete": not missing}


def _run_path(results_dir: str, method: str, link: str) -> str:
  return os.path.join(results_dir, "runs", f"{method}_{link}.json")


TABLE_HEADER = ("method", "link", "s/step (slower group)", "link bytes/step",
                "recorded steps to target", "projected h to target", "recorded steps to common",
                "projected h to common", "load before / at end")


def _cell(value: Optional[float], fmt: str = "") -> str:
  return "never" if value is None else format(value, fmt)


def _tables(summary: dict) -> List[str]:
  """report.md's body: one row per (method, link), and what the targets are."""
  projected = {(r["method"], r["link"]): r for r in summary["projections"]["rows"]}
  rows = []
  for run in summary["runs"]:
    p = projected[(run["method"], run["link"])]
    rows.append([run["method"], run["link_described"], f"{run['seconds_per_step']:.3f}",
                 f"{run['link_bytes_per_step']:,.0f}", _cell(p["steps_to_target"]),
                 _cell(p["hours_to_target"], ".2f"), _cell(p["steps_to_common"]),
                 _cell(p["hours_to_common"], ".2f"),
                 f"{run['load_1m_before']:.2f} / {run['load_1m_at_end']:.2f}"])
  proj = summary["projections"]
  return [standalone.markdown_table(TABLE_HEADER, rows), "",
          f"Target: the best sync arm's best loss ({_cell(proj['target_loss'], '.4f')}, arms "
          f"{proj['target_arms']}); common: the highest best loss among the methods' recorded "
          f"curves ({_cell(proj['common_loss'], '.4f')}), which every recorded method reaches. "
          "Steps come from the suite's recorded seed-mean curves; hours = steps x the seconds "
          "per step measured across the link in this benchmark ('never': the recorded curve "
          "does not reach the loss, or the method has no recorded runs yet)."]


BENCHMARK = registry.Benchmark(
    "slow_link", measure_links, tables=_tables,
    recorded=lambda ctx: measure_links(ctx, run_missing=False),
    title="Wall-clock across a slow link: sync all-reduce vs codistillation vs parameter "
          "averaging")
