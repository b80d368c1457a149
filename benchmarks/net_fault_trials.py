"""Network and exchange faults on real local clusters, repeated: a task cut off from the others
for a while (then healed), a task whose link loses packets or adds latency for a whole run, an
exchange directory that misbehaves for a while, a peer group that goes silent; for each trial:
did the job finish, how many restarts it used, how many steps the (first) group made while the
fault lasted, how long it took to step again after the heal, and whether anything hung.

Every trial runs ``tf-codistill-launch`` as users do (one process per task, TF_CONFIG, ports on
127.0.0.1, inside the launch's private network namespace) on generated Criteo-format files, at
fault_trials' small sizes, with the launcher's default fault policy and a stall watchdog of
``stall_timeout_s`` (the bound a hang turns into a restart within). Network faults are made in
that namespace by ``netfaults`` (nftables drops, a delaying relay), nothing outside it touched;
exchange faults by a FUSE mount of the trial's own (``faultfs``).

- ``cut_<task>_<s>s``: one parameter-server group (chief, 2 workers, 1 ps); at a seeded step in
  [25%, 60%] of training the task (a worker drawn by the seed, the ps or the chief) is cut off
  for ``s`` seconds, then healed;
- ``sync_cut_worker_<s>s``: the same for the worker of a MultiWorkerMirrored group (chief, 1
  worker);
- ``loss_worker``, ``sync_loss_worker``: 5% of a worker's packets (both ways) dropped from its
  start to the end;
- ``latency_worker``, ``sync_latency_worker``: 200 ms added each way to every connection of a
  worker and to it, from its start to the end;
- ``exchange_<mode>_30s`` (and ``exchange_stalled_300s``): 2-way codistillation of
  parameter-server groups (chief, 1 worker, 1 ps each) whose exchange directory is mounted
  through ``faultfs`` and turns slow (2 s an operation), read-only, full, vanished or stalled at
  a seeded step, then back;
- ``peer_silent_30s``: the same job, its second group stopped (SIGSTOP) for 30 s: the first
  group's teachers get no new version meanwhile.

A trial that does not end within its bound (the fault, plus twice the watchdog, plus the run) is
a hang: the launch is stopped and the trial recorded as hung.

  python -m benchmarks.run net_fault_trials
  python -m benchmarks.run net_fault_trials --gin_bindings='bench.net_fault_trials.trials = 2' \
      --gin_bindings="bench.net_fault_trials.cases = ['cut_worker_5s']"

Each trial starts once the load the trial before it left has decayed (up to ``--settle_s``;
above the cores it is refused, or with ``--allow_load`` marked), is recorded as it ends
(``<results_dir>/trials/<case>_<seed>.json``, with the machine's load before and after it), and
a later run with the same settings keeps it: the trials (hours in all, the 5-minute cuts most)
go on across invocations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import signal
import time
from typing import Callable, Dict, List, Optional, Sequence

import gin

from benchmarks import fault_trials
from benchmarks import registry
from benchmarks import standalone
from benchmarks import trials as trials_lib
from tf_codistill import layout
from tf_codistill.launch import launcher
from tf_codistill.testing import faultfs
from tf_codistill.testing import netfaults

EXCHANGE_FAULTS = {"slow": "slow (every operation 2 s late)", "read_only": "read-only",
                   "full": "full (ENOSPC)", "vanished": "vanished (empty)",
                   "stalled": "stalled (every operation blocks)"}
TWO_GROUPS = "2-way codistillation, each group: chief, 1 worker, 1 ps"


@dataclasses.dataclass(frozen=True)
class Case:
  """One kind of fault: where (a task of a group, the exchange directory of a 2-way job, or that
  job's second group), what, and how long."""
  strategy: str  # 'parameter_server' or 'multi_worker_mirrored'
  task: str  # 'worker', 'ps', 'chief'; 'exchange'; 'peer'
  fault: str  # 'cut', 'loss', 'latency'; a faultfs mode for the exchange; 'silent' for a peer
  seconds: Optional[float] = None  # how long; None: the whole run
  percent: int = 5  # loss
  delay_s: float = 0.2  # latency, each way

  @property
  def groups(self) -> int:
    return 2 if self.task in ("exchange", "peer") else 1

  def describe(self) -> str:
    if self.task == "exchange":
      return (f"exchange directory {EXCHANGE_FAULTS[self.fault]} for {self.seconds:g} s, then "
              f"back ({TWO_GROUPS})")
    if self.task == "peer":
      return (f"the peer group stopped for {self.seconds:g} s (publishes nothing), then goes on "
              f"({TWO_GROUPS})")
    shape = ("1 group: chief, 2 workers, 1 ps" if self.strategy == "parameter_server"
             else "chief, 1 worker; MultiWorkerMirrored")
    what = {"cut": f"{self.task} cut off for {self.seconds:g} s, then healed",
            "loss": f"{self.percent}% packet loss at a {self.task} for the whole run",
            "latency": f"{self.delay_s * 1000:g} ms added each way at a {self.task} for the "
                       "whole run"}[self.fault]
    return f"{what} ({shape})"


def _cases() -> Dict[str, Case]:
  cases = {}
  for seconds in (5, 30, 300):
    for task in ("worker", "ps", "chief"):
      cases[f"cut_{task}_{seconds}s"] = Case("parameter_server", task, "cut", seconds)
    cases[f"sync_cut_worker_{seconds}s"] = Case("multi_worker_mirrored", "worker", "cut",
                                                seconds)
  for prefix, strategy in (("", "parameter_server"), ("sync_", "multi_worker_mirrored")):
    cases[f"{prefix}loss_worker"] = Case(strategy, "worker", "loss")
    cases[f"{prefix}latency_worker"] = Case(strategy, "worker", "latency")
  for mode in EXCHANGE_FAULTS:
    cases[f"exchange_{mode}_30s"] = Case("parameter_server", "exchange", mode, 30)
  cases["exchange_stalled_300s"] = Case("parameter_server", "exchange", "stalled", 300)
  cases["peer_silent_30s"] = Case("parameter_server", "peer", "silent", 30)
  return cases


CASES = _cases()
_ORDER = {name: k for k, name in enumerate(CASES)}


def trial_command(case: Case, model_dir: str, data_dir: str, train_steps: int,
                  steps_per_epoch: int, stall_timeout_s: float,
                  exchange_dir: Optional[str] = None) -> List[str]:
  """The tf-codistill-launch command line of one trial (fault_trials' job for the shape)."""
  kind = ("group" if case.groups == 2 else
          "worker" if case.strategy == "parameter_server" else "sync_worker")
  return fault_trials.trial_command(kind, model_dir, data_dir, train_steps, steps_per_epoch) + [
      f"--stall_timeout_s={stall_timeout_s:g}",
      *([f"--exchange_dir={exchange_dir}"] if exchange_dir else [])]


def _victim(launch: standalone.Launch, case: Case, rng: random.Random,
            timeout: float) -> tuple:
  """(the launch's namespace pid, the victim task, its pid) once both are known."""
  task = (0, case.task,
          rng.randrange(2) if (case.task, case.strategy) == ("worker", "parameter_server") else 0)

  def known():
    network = next((e for e in launch.events() if e["event"] == "network"), None)
    pids = launch.pids
    return (network, task, pids[task]) if network and task in pids else None
  network, task, pid = standalone.wait_for(known, timeout, "the launch's victim task")
  if not network.get("isolated"):
    raise netfaults.NetFaultError("the launch is not in a private network namespace")
  return network["namespace_pid"], task, pid


def _step(group_dir: str) -> Optional[int]:
  beat = fault_trials.heartbeat(group_dir)
  return None if beat is None else beat["step"]


def _for_a_while(start: Callable[[], Callable[[], dict]], seconds: float, launch: standalone.Launch,
                 fault_step: int, timeout: float) -> dict:
  """Waits for group 0's ``fault_step``, makes the fault (``start()``, which returns how to end
  it), waits ``seconds`` (less if the launch ends first), ends it; what the group did meanwhile
  and how long it took to step again after the end (None when the launch ended first:
  ``launch_ended_first``)."""
  group_dir = layout.group_dir(launch.model_dir, 0)

  def ended() -> bool:
    return launch.proc.poll() is not None

  standalone.wait_for(lambda: (_step(group_dir) or 0) >= fault_step or ended(), timeout,
                      f"step {fault_step}")
  if ended():
    raise TimeoutError(f"the launch ended (status {launch.proc.returncode}) before step "
                       f"{fault_step}")
  step_at_fault = _step(group_dir)
  end = start()

  def after_heal() -> Optional[str]:
    if (_step(group_dir) or 0) > max(step_at_heal, step_at_fault):
      return "stepped"
    return "ended" if ended() else None

  # A restart (the stall watchdog's) can finish the job while the fault still stands: then
  # neither the fault's end nor a step after the heal is waited for.
  with contextlib.suppress(TimeoutError):
    standalone.wait_for(ended, seconds, "the launch's end", poll=0.5)
  step_at_heal = _step(group_dir)
  extra = end()
  healed_at = time.monotonic()
  try:
    outcome = standalone.wait_for(after_heal, timeout, "a step after the heal")
  except TimeoutError:
    outcome = None
  return {"step_at_fault": step_at_fault, "steps_during_fault": step_at_heal - step_at_fault,
          "recovery_s": (round(time.monotonic() - healed_at, 2) if outcome == "stepped"
                         else None),
          "launch_ended_first": outcome == "ended", **extra}


def _cut(faults: netfaults.NetworkFaults, pid: int) -> Callable[[], dict]:
  fault = faults.cut_off(pid)

  def end() -> dict:
    try:
      dropped: Optional[int] = fault.dropped()
    except netfaults.NetFaultError:  # the launch ended meanwhile (a restart beat the cut)
      dropped = None
    fault.heal()
    return {"packets_dropped": dropped}
  return end


def _exchange(directory: faultfs.FaultyDirectory, mode: str) -> Callable[[], dict]:
  directory.set(mode)
  return lambda: (directory.set("ok"), {})[1]


def _silent_peer(launch: standalone.Launch) -> Callable[[], dict]:
  """Stops (SIGSTOP) every task of group 1; the end lets them go on (SIGCONT)."""
  pids = [pid for (group, _, _), pid in launch.pids.items() if group == 1]
  for pid in pids:
    os.kill(pid, signal.SIGSTOP)

  def end() -> dict:
    for pid in pids:
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    return {"stopped": len(pids)}
  return end


def _wait(launch: standalone.Launch, deadline: float, measure: Callable[[], object],
          every_s: float = 2.0) -> Optional[int]:
  """``launch.wait`` until ``deadline`` (monotonic), calling ``measure`` every ``every_s``
  meanwhile (a NetFaultError from it, once the namespace is gone, is ignored)."""
  while launch.proc.poll() is None and time.monotonic() < deadline:
    with contextlib.suppress(netfaults.NetFaultError):
      measure()
    time.sleep(every_s)
  return launch.wait(max(1.0, deadline - time.monotonic()))


def bound_s(case: Case, stall_timeout_s: float, run_s: float = 600.0) -> float:
  """How long a trial may take before it counts as a hang: the fault, two watchdog periods
  (a stall seen, then a restarted group's stall), and ``run_s`` for the run itself."""
  return (case.seconds or 0) + 2 * stall_timeout_s + run_s


def run_trial(name: str, seed: int, work_dir: str, data_dir: str, train_steps: int = 240,
              steps_per_epoch: int = 40, stall_timeout_s: float = 120.0) -> dict:
  """One trial of case ``name``; returns its record (``ok``: finished, and no hang)."""
  case = CASES[name]
  rng = random.Random(f"{name}-{seed}")
  fault_step = rng.randint(int(0.25 * train_steps), int(0.6 * train_steps))
  model_dir = os.path.join(work_dir, f"{name}_{seed}")
  for path in (model_dir, f"{model_dir}.exchange_backing"):
    shutil.rmtree(path, ignore_errors=True)
  bound = bound_s(case, stall_timeout_s)
  record: dict = {"case": name, "seed": seed, "train_steps": train_steps, "bound_s": bound}
  exchange = (faultfs.FaultyDirectory(f"{model_dir}.exchange_backing", f"{model_dir}.exchange")
              if case.task == "exchange" else None)
  started = time.monotonic()
  launch = standalone.Launch(trial_command(case, model_dir, data_dir, train_steps,
                                           steps_per_epoch, stall_timeout_s,
                                           exchange.path if exchange else None))
  faults = None
  try:
    if exchange is not None:
      record.update(_for_a_while(lambda: _exchange(exchange, case.fault), case.seconds,
                                 launch, fault_step, bound))
    elif case.task == "peer":
      record.update(_for_a_while(lambda: _silent_peer(launch), case.seconds, launch,
                                 fault_step, bound))
    else:
      namespace_pid, task, pid = _victim(launch, case, rng, 120.0)
      record["victim"] = f"group {task[0]} {task[1]}:{task[2]}"
      faults = netfaults.NetworkFaults(namespace_pid)
      faults.wait_inside(pid)
      if case.fault == "cut":
        record.update(_for_a_while(lambda: _cut(faults, pid), case.seconds, launch,
                                   fault_step, bound))
      elif case.fault == "loss":
        whole_run = faults.packet_loss(pid, case.percent)
      else:
        whole_run = faults.latency(pid, case.delay_s)
    if case.fault == "loss":  # its counters go with the launch's namespace: read them meanwhile
      record["packets_dropped"] = 0
      code = _wait(launch, started + bound, lambda: record.update(
          packets_dropped=whole_run.dropped()))
    else:
      code = launch.wait(max(1.0, started + bound - time.monotonic()))
    if case.fault == "latency":
      record["relayed_connections"] = whole_run.connections
  except (TimeoutError, netfaults.NetFaultError) as e:
    launch.stop()
    code, record["error"] = None, str(e)
  except BaseException:
    launch.stop()
    raise
  finally:
    if faults is not None:
      faults.heal_all()
    if exchange is not None:
      exchange.close()
  return _verdict(record, case, launch, code, started, train_steps)


def _verdict(record: dict, case: Case, launch: standalone.Launch, code: Optional[int],
             started: float, train_steps: int) -> dict:
  """The trial's judged fields from the launch's end, its groups' results and its events."""
  results = {g: launch.results(g) for g in range(case.groups)}
  events = launch.events()
  restarts = [e for e in events if e["event"] == "restarted"]
  finished = code == 0 and all(r is not None and train_steps <= r["steps"] <= train_steps + 2
                               for r in results.values())
  record.update(wall_s=round(time.monotonic() - started, 1), exit_code=code,
                final_steps={str(g): (r or {}).get("steps") for g, r in results.items()},
                restarts_used=len(restarts),
                restarted=[f"group {e['group']} {e['task']}:{e['index']} " + (
                    "stalled" if e["status"] == launcher.STALLED_STATUS else f"exit {e['status']}")
                    for e in restarts],
                stalls=sum(e["event"] == "stalled" for e in events),
                hung=code is None and "error" not in record, finished=finished)
  if case.groups == 2:
    for key in ("publishes", "publish_failures", "teacher_loads", "teacher_rejections"):
      record[key] = {str(g): (r or {}).get(key) for g, r in results.items()}
  record["ok"] = bool(finished and not record["hung"])
  if not record["ok"]:
    record["stderr_tail"] = launch.stderr[-3000:]
  return record


def summarize(trials: Sequence[dict]) -> Dict[str, dict]:
  """Per case: trials, finished, recovered without a restart, restarts used, steps made while
  the fault lasted, time to step again after the heal, hangs."""
  summary = {}
  for name in CASES:
    rows = [t for t in trials if t["case"] == name]
    if not rows:
      continue
    recovery = [t["recovery_s"] for t in rows if t.get("recovery_s") is not None]
    summary[name] = {
        "trials": len(rows), "finished": sum(bool(t.get("finished")) for t in rows),
        "without_restart": sum(bool(t.get("finished")) and t.get("restarts_used") == 0
                               for t in rows),
        "restarts_used": [t.get("restarts_used") for t in rows],
        "steps_during_fault": [t.get("steps_during_fault") for t in rows],
        "recovery_s": trials_lib.spread(recovery),
        "hangs": sum(bool(t.get("hung")) for t in rows),
        **({key: [t.get(key) for t in rows] for key in ("publish_failures", "teacher_loads")}
           if CASES[name].groups == 2 else {}),
    }
  return summary


TABLE_HEADER = ("case", "trials", "finished", "finished without a restart", "restarts used",
                "steps while faulted", "time to step after the heal, s (median, min-max)",
                "hangs")


def markdown_table(summary_json: dict) -> str:
  """The docs/reliability.md table of network faults from a summary.json."""
  return standalone.markdown_table(TABLE_HEADER, [
      [CASES[name].describe(), row["trials"], row["finished"], row["without_restart"],
       row["restarts_used"], row["steps_during_fault"],
       trials_lib.spread_cell(row["recovery_s"], ".1f"), row["hangs"]]
      # In CASES' order (a summary.json read back has its keys sorted).
      for name, row in sorted(summary_json["summary"].items(), key=lambda item: _ORDER[item[0]])])


@gin.configurable("net_fault_trials", module="bench", denylist=["ctx", "run_missing"])
def measure_trials(ctx: registry.Context, trials: int = 5, cases: Sequence[str] = tuple(CASES),
                   train_steps: int = 240, steps_per_epoch: int = 40,
                   stall_timeout_s: float = 120.0, run_missing: bool = True) -> dict:
  """Every trial (cases interleaved, seed by seed) and a summary per case (with ``run_missing``
  False: of the trials recorded so far, running none; ``missing`` lists the others).

  Args:
    ctx: the run's context (data and the trials' model directories go under its work_dir).
    trials: trials per case (seeds 0..trials-1).
    cases: which faults, of CASES.
    train_steps: training steps per trial.
    steps_per_epoch: steps per epoch (= checkpoint interval).
    stall_timeout_s: the launcher's stall watchdog (``--stall_timeout_s``) in every trial.
  """
  unknown = sorted(set(cases) - set(CASES))
  if unknown:
    raise ValueError(f"bench.net_fault_trials.cases: {unknown} are not among {sorted(CASES)}")
  reason = netfaults.unavailable()
  if reason and run_missing:
    raise RuntimeError(f"network faults cannot be made here: {reason}")
  data = os.path.join(ctx.work_dir, "data")
  settings = {"train_steps": train_steps, "steps_per_epoch": steps_per_epoch,
              "stall_timeout_s": stall_timeout_s}
  result = trials_lib.run_interleaved(
      ctx, list(cases), trials, settings,
      lambda name, seed: run_trial(name, seed, ctx.work_dir, fault_trials.ensure_data(data),
                                   train_steps, steps_per_epoch, stall_timeout_s),
      lambda name, seed: [os.path.join(ctx.work_dir, f"{name}_{seed}{suffix}")
                          for suffix in ("", ".exchange", ".exchange_backing")], run_missing)
  result.update(stall_timeout_s=stall_timeout_s, summary=summarize(result["trials"]))
  if run_missing:
    ctx.progress(markdown_table(result))
  return result


def _tables(summary: dict) -> List[str]:
  """report.md's body: the table, and each trial that hung or did not finish."""
  return markdown_table(summary).splitlines() + trials_lib.failed_lines(
      summary, "hung or did not finish", "case", ("finished", "hung", "exit_code", "restarts_used"))


BENCHMARK = registry.Benchmark(
    "net_fault_trials", measure_trials, tables=_tables,
    recorded=lambda ctx: measure_trials(ctx, run_missing=False),
    failure=trials_lib.failure("hung or did not finish"),
    title="Network fault trials: partitions, packet loss and latency on local clusters")
