"""Process faults on real local clusters, repeated: kill -9 of a worker, a ps task, a chief, and
a whole group of parameter-server training, and of the chief or the worker of a synchronous
group, at seeded random steps; for each trial: did the job finish, did the killed group
resume correctly, how many steps it lost, and how long it took to recover.

Every trial runs ``tf-codistill-launch`` as users do (one process per task, TF_CONFIG, ports on
127.0.0.1) on generated Criteo-format files:

- ``worker``, ``ps``, ``chief``: one parameter-server group (chief, 2 workers, 1 ps), baseline
  config; the launcher restarts a dead worker alone (the coordinator reschedules its steps
  meanwhile), and restarts the whole group from its last checkpoint after a dead ps or chief;
- ``group``: 2-way codistillation, each group a parameter-server cluster (chief, 1 worker, 1 ps);
  every task of group 1 is killed at once; it restarts from its checkpoint while group 0 goes on;
- ``sync_chief``, ``sync_worker``: one MultiWorkerMirrored group (chief, 1 worker), baseline
  config; the launcher restarts the group from its last checkpoint (an all-reduce cannot go on
  without a replica).

Every trial uses the launcher's default fault policy (no ``--max_restarts``).

The kill step is drawn from [25%, 70%] of the training steps by ``random.Random(seed)``; the
killed group's chief writes ``heartbeat.json`` (step, step it started from, pid) every 0.1 s,
which is how the kill point and the recovery are seen:

- steps lost: the heartbeat step just before the kill minus the step the restarted chief
  started from (0 when nothing restarts: a dead parameter-server worker);
- restart_s: kill -> the launcher has started a new process for every killed task (for a
  parameter-server worker: the new worker serves in the cluster again);
- progress_s: kill -> the killed group's step is past the step at the kill again;
- recovery_s: the later of the two (back at full strength and past the kill point).

  python -m benchmarks.run fault_trials
  python -m benchmarks.run fault_trials --gin_bindings='bench.fault_trials.trials = 3' \
      --gin_bindings="bench.fault_trials.kinds = ['ps', 'group']"

writes benchmarks/results/fault_trials/summary.json (every trial and a summary per kind) and
report.md; each trial is recorded as it ends (``trials/<kind>_<seed>.json``) and kept by a later
run with the same settings, so a stopped run resumes trial by trial. report.md's table
(``markdown_table``) is what ``benchmarks.run`` puts into docs/reliability.md after each run
(reliability_doc.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import signal
import time
from typing import Dict, List, Optional, Sequence

import gin

from benchmarks import machine
from benchmarks import registry
from benchmarks import standalone
from benchmarks import trials as trials_lib
from tf_codistill import layout
from tf_codistill.launch import launcher

KINDS = ("worker", "ps", "chief", "group", "sync_chief", "sync_worker")

# Small sizes (the soak's too): a trial trains in tens of seconds per process on a 2-core machine.
SMALL_JOB = (
    "NUM_BUCKETS = 1000",
    "models.ctr_model.embedding_dim = 4",
    "models.ctr_model.hidden_units = (32,)",
    "tfc.Data.batch_size = 120",
    "tfc.Data.shuffle_buffer = 1000",
    "trainer.train.eval_steps = 5",
    "trainer.train.verbose = 0",
    "trainer.train.intra_op_threads = 1",
    "trainer.train.inter_op_threads = 1",
)
BINDINGS = SMALL_JOB + (
    "tfc.Exchange.publish_every_steps = 40",
    "tfc.Distillation.burn_in_steps = 40",
    "tfc.Exchange.poll_interval_s = 0.2",
    "trainer.train.heartbeat_every_s = 0.1",
)


def ensure_data(data_dir: str) -> str:
  """Generated Criteo-format training (4 files, 40k rows) and eval files under ``data_dir``."""
  return standalone.ensure_ctr_data(data_dir, 40_000, eval_rows=4_000, vocab_size=2000)


def trial_command(kind: str, model_dir: str, data_dir: str, train_steps: int,
                  steps_per_epoch: int) -> List[str]:
  """The tf-codistill-launch command line of one trial of ``kind``."""
  gin = "codistill_2way.gin" if kind == "group" else "baseline.gin"
  if kind == "group":
    shape = ["--strategy=parameter_server", "--num_groups=2", "--workers_per_group=1",
             "--ps_per_group=1"]
  elif kind.startswith("sync_"):
    shape = ["--strategy=multi_worker_mirrored", "--num_groups=1", "--workers_per_group=1"]
  else:
    shape = ["--strategy=parameter_server", "--num_groups=1", "--workers_per_group=2",
             "--ps_per_group=1"]
  bindings = list(BINDINGS) + standalone.ctr_data_bindings(data_dir) + [
      f"trainer.train.train_steps = {train_steps}",
      f"trainer.train.steps_per_epoch = {steps_per_epoch}",
      # Sync (and single-process) groups checkpoint with BackupAndRestore at this interval.
      f"tfc.Checkpoints.every_steps = {steps_per_epoch}"]
  return standalone.launch_args(model_dir, gin, shape, bindings)


def heartbeat(group_dir: str) -> Optional[dict]:
  """The group chief's last heartbeat, or None while there is none (or it is being replaced)."""
  return machine.read_json_or(layout.RunDir(group_dir).heartbeat)


def _serving_count(model_dir: str, task: tuple) -> int:
  """How many times the task's log says it started serving (it is appended to on restarts)."""
  group, task_type, index = task
  try:
    with open(layout.group_run(model_dir, group).task_log(task_type, index),
              errors="replace") as f:
      return f.read().count(f"serving {task_type}:{index} of")
  except OSError:
    return 0


@dataclasses.dataclass
class _Kill:
  """What a trial killed, and where its group stood then."""
  victims: List[tuple]
  old_pids: Dict[tuple, int]
  chief_pid: int
  step: int
  at: float  # time.monotonic()


def _kill(launch: standalone.Launch, kind: str, rng: random.Random, group_dir: str,
          kill_step: int, timeout: float) -> _Kill:
  """Waits for the victim group's step ``kill_step``, then SIGKILLs the trial's victims."""
  victim_group = 1 if kind == "group" else 0
  beat = standalone.wait_for(
      lambda: (lambda b: b if b and b["step"] >= kill_step else None)(heartbeat(group_dir)),
      timeout, f"step {kill_step} of group {victim_group}")
  if kind == "group":
    victims = [key for key in launch.pids if key[0] == victim_group]
  else:
    victims = [(0, kind.replace("sync_", ""), rng.randrange(2) if kind == "worker" else 0)]
  kill = _Kill(victims, {key: launch.pids[key] for key in victims}, beat["pid"], beat["step"],
               time.monotonic())
  for key in victims:
    with contextlib.suppress(ProcessLookupError):
      os.kill(kill.old_pids[key], signal.SIGKILL)
  return kill


def _recovery(launch: standalone.Launch, kind: str, kill: _Kill, model_dir: str, group_dir: str,
              deadline: float) -> dict:
  """Watches the recovery: every killed task relaunched (restart_s), and the group's step past
  the kill point again (progress_s); the step the group resumed from."""
  restart_s = progress_s = start_step = None
  while time.monotonic() < deadline and (restart_s is None or progress_s is None):
    now = time.monotonic()
    if restart_s is None and all(launch.pids.get(k) != kill.old_pids[k] for k in kill.victims):
      if kind != "worker":
        restart_s = max(launch.started[k] for k in kill.victims) - kill.at
      elif _serving_count(model_dir, kill.victims[0]) >= 2:  # the new worker serves again
        restart_s = now - kill.at
    beat = heartbeat(group_dir)
    if beat and beat["pid"] != kill.chief_pid and start_step is None:
      start_step = beat["start_step"]
    if progress_s is None and beat and beat["step"] > kill.step and (
        kind == "worker" or beat["pid"] != kill.chief_pid):
      progress_s = now - kill.at
    if launch.proc.poll() is not None:
      break
    time.sleep(0.05)
  return {"restart_s": restart_s, "progress_s": progress_s, "start_step": start_step,
          "ended_first": restart_s is None and launch.proc.poll() is not None}


def _verdict(kind: str, kill: _Kill, recovery: dict, launch: standalone.Launch, code: int,
             finished: Dict[int, Optional[dict]], train_steps: int, steps_per_epoch: int) -> dict:
  """The trial's judged fields: steps lost, whether it resumed correctly and finished."""
  start_step, restart_s, progress_s = (recovery["start_step"], recovery["restart_s"],
                                       recovery["progress_s"])
  if kind == "worker":
    steps_lost = 0
    # ClusterCoordinator retries the step the dead worker ran; one may count (and apply) twice.
    resumed_ok = True
  else:
    steps_lost = None if start_step is None else kill.step - start_step
    # Resumed from a checkpoint at most one interval (plus the steps in flight) behind the kill,
    # never from scratch once a checkpoint existed, never from the future.
    resumed_ok = (start_step is not None and 0 <= kill.step - start_step
                  and (kill.step < steps_per_epoch or start_step > 0)
                  and kill.step - start_step <= steps_per_epoch + 20)
  restarts = [e for e in launch.events() if e["event"] == "restarted"]
  restarted = any(e.get("status") == -9 for e in restarts)
  finished_ok = (code == 0 and all(r is not None and train_steps <= r["steps"] <= train_steps + 2
                                   for r in finished.values()))
  fields = dict(
      steps_lost=steps_lost, resumed_from_step=start_step, restart_s=_round(restart_s),
      progress_s=_round(progress_s),
      recovery_s=_round(None if restart_s is None or progress_s is None
                        else max(restart_s, progress_s)),
      launcher_restarted=restarted, restarts_used=len(restarts),
      restart_events=[{k: e.get(k) for k in ("group", "task", "index", "status", "scope")}
                      for e in restarts],
      ended_before_replacement_served=bool(kind == "worker" and restarted
                                           and recovery["ended_first"]),
      finished=finished_ok,
      resumed_correctly=resumed_ok)
  return {**fields, "ok": recovered(fields)}


RECOVERY_TIMEOUT_S = 600.0  # how long a trial watches for its recovery after the kill


def recovered(trial: dict) -> bool:
  """Whether a trial recovered: it finished, resumed correctly, the launcher relaunched what was
  killed, the group stepped past the kill again and the relaunched tasks served. A parameter-
  server worker's job may finish on the surviving worker before its replacement serves (a
  restart takes 6-7 s here); that trial recovered too, with no restart time to measure."""
  return bool(trial.get("finished") and trial.get("resumed_correctly")
              and trial.get("launcher_restarted") and trial.get("progress_s") is not None
              and (trial.get("restart_s") is not None
                   or trial.get("ended_before_replacement_served")))


def judged(trial: dict) -> dict:
  """A trial as ``recovered`` judges it. Only a worker trial recorded as not ok before
  ``ended_before_replacement_served`` existed changes: it gets the field from its record (no
  restart time, yet the job ended before the recovery watch's deadline, ``RECOVERY_TIMEOUT_S``
  after the kill, so the job ended first)."""
  if (trial.get("ok") or trial.get("kind") != "worker" or "error" in trial
      or "ended_before_replacement_served" in trial):
    return trial
  ended_first = bool(trial.get("launcher_restarted") and trial.get("restart_s") is None
                     and trial["wall_s"] - trial["killed_after_s"] < RECOVERY_TIMEOUT_S)
  trial = {**trial, "ended_before_replacement_served": ended_first}
  return {**trial, "ok": recovered(trial)}


def run_trial(kind: str, seed: int, work_dir: str, data_dir: str, train_steps: int = 240,
              steps_per_epoch: int = 40, timeout: float = RECOVERY_TIMEOUT_S) -> dict:
  """One kill -9 trial of ``kind``; returns its record (``ok`` says whether it recovered)."""
  if kind not in KINDS:
    raise ValueError(f"kind={kind!r} is not one of {KINDS}")
  rng = random.Random(f"{kind}-{seed}")
  kill_step = rng.randint(int(0.25 * train_steps), int(0.7 * train_steps))
  model_dir = os.path.join(work_dir, f"{kind}_{seed}")
  shutil.rmtree(model_dir, ignore_errors=True)
  group_dir = layout.group_dir(model_dir, 1 if kind == "group" else 0)
  peer_dir = layout.group_dir(model_dir, 0)
  record = {"kind": kind, "seed": seed, "train_steps": train_steps,
            "checkpoint_every_steps": steps_per_epoch, "kill_step_target": kill_step}
  started = time.monotonic()
  launch = standalone.Launch(trial_command(kind, model_dir, data_dir, train_steps,
                                           steps_per_epoch))
  try:
    kill = _kill(launch, kind, rng, group_dir, kill_step, timeout)
    record.update(step_at_kill=kill.step,
                  killed=[f"group {g} {t}:{k}" for g, t, k in kill.victims],
                  killed_after_s=round(kill.at - started, 2))
    peer_step_at_kill = (heartbeat(peer_dir) or {}).get("step") if kind == "group" else None
    recovery = _recovery(launch, kind, kill, model_dir, group_dir, kill.at + timeout)
    if kind == "group":
      peer = heartbeat(peer_dir)
      record["peer_steps_while_down"] = (peer["step"] - peer_step_at_kill
                                         if peer and peer_step_at_kill is not None else None)
    code = launch.wait(max(60.0, kill.at + timeout - time.monotonic()))
  except TimeoutError as e:
    launch.stop()
    record.update(ok=False, error=str(e), stderr_tail=launch.stderr[-3000:],
                  wall_s=round(time.monotonic() - started, 1))
    return record
  record.update(wall_s=round(time.monotonic() - started, 1), exit_code=code)
  finished = {g: launch.results(g) for g in ((0, 1) if kind == "group" else (0,))}
  record["final_steps"] = {str(g): (r or {}).get("steps") for g, r in finished.items()}
  record.update(_verdict(kind, kill, recovery, launch, code, finished, train_steps,
                         steps_per_epoch))
  if not record["ok"] or record["restarts_used"] != 1:
    record["stderr_tail"] = launch.stderr[-3000:] + "".join(
        f"\n--- group {e['group']} {e['task']}:{e['index']} (tail) ---\n"
        + launcher.log_tail(layout.group_run(model_dir, e["group"]).task_log(e["task"],
                                                                            e["index"]), 40)
        for e in record["restart_events"])
  return record


def _round(value: Optional[float]) -> Optional[float]:
  return None if value is None else round(value, 2)


def summarize(trials: Sequence[dict]) -> Dict[str, dict]:
  """Per kind: trials, how many finished and resumed correctly, steps lost and recovery times."""
  summary = {}
  for kind in KINDS:
    rows = [t for t in trials if t["kind"] == kind]
    if not rows:
      continue
    lost = [t["steps_lost"] for t in rows if t.get("steps_lost") is not None]
    recovery = [t["recovery_s"] for t in rows if t.get("recovery_s") is not None]
    summary[kind] = {
        "trials": len(rows),
        "finished": sum(bool(t.get("finished")) for t in rows),
        "resumed_correctly": sum(bool(t.get("resumed_correctly")) for t in rows),
        "ok": sum(bool(t.get("ok")) for t in rows),
        "ended_before_replacement_served": sum(
            bool(t.get("ended_before_replacement_served")) for t in rows),
        "steps_lost": trials_lib.spread(lost),
        "recovery_s": trials_lib.spread(recovery),
        "kill_steps": [t.get("step_at_kill") for t in rows],
        # One kill should cost one restart (None: a trial recorded before restarts were counted).
        "restarts_used": [t.get("restarts_used") for t in rows],
    }
  return summary


CASES = {
    "worker": "kill -9 of a parameter-server worker (1 group: chief, 2 workers, 1 ps)",
    "ps": "kill -9 of the ps task (1 group: chief, 2 workers, 1 ps)",
    "chief": "kill -9 of the chief (1 group: chief, 2 workers, 1 ps)",
    "group": ("kill -9 of every task of group 1 of 2-way codistillation "
              "(each: chief, 1 worker, 1 ps)"),
    "sync_chief": ("kill -9 of the chief of a synchronous group "
                   "(chief, 1 worker; MultiWorkerMirrored)"),
    "sync_worker": ("kill -9 of the worker of a synchronous group "
                    "(chief, 1 worker; MultiWorkerMirrored)"),
}


TABLE_HEADER = ("case", "trials", "outcome", "restarts used (trials)",
                "steps lost (median, min-max)", "recovery time s (median, min-max)")


def restarts_cell(restarts_used: Sequence[Optional[int]]) -> str:
  """How many trials used each number of restarts ("1 (10)": one kill, one restart, every
  time); trials recorded before restarts were counted say so."""
  counted = [r for r in restarts_used if r is not None]
  cells = [f"{n} ({counted.count(n)})" for n in sorted(set(counted))]
  if len(counted) < len(restarts_used):
    cells.append(f"not counted ({len(restarts_used) - len(counted)})")
  return ", ".join(cells)


def markdown_table(summary_json: dict) -> str:
  """The docs/reliability.md table from a summary.json."""
  return standalone.markdown_table(TABLE_HEADER, [
      [CASES[kind], row["trials"], f"{row['finished']}/{row['trials']} finished, "
       f"{row['resumed_correctly']}/{row['trials']} resumed correctly"
       + (f", {row['ended_before_replacement_served']} finished before the relaunched worker "
          "served" if row.get("ended_before_replacement_served") else ""),
       restarts_cell(row.get("restarts_used") or [None] * row["trials"]),
       trials_lib.spread_cell(row["steps_lost"], "g"),
       trials_lib.spread_cell(row["recovery_s"], ".1f")]
      for kind, row in summary_json["summary"].items()])


@gin.configurable("fault_trials", module="bench", denylist=["ctx"])
def measure_trials(ctx: registry.Context, trials: int = 10, kinds: Sequence[str] = KINDS,
                   train_steps: int = 240, steps_per_epoch: int = 40) -> dict:
  """Every trial (kinds interleaved, seed by seed) and a summary per kind.

  Args:
    ctx: the run's context (data and the trials' model directories go under its work_dir).
    trials: trials per kind (seeds 0..trials-1).
    kinds: which faults, of KINDS ('worker', 'ps', 'chief', 'group', 'sync_chief',
      'sync_worker').
    train_steps: training steps per trial.
    steps_per_epoch: steps per epoch (= checkpoint interval).
  """
  kinds = tuple(kinds)
  if set(kinds) - set(KINDS):
    raise ValueError(f"bench.fault_trials.kinds={list(kinds)!r}: each one of {KINDS}")
  data = ensure_data(os.path.join(ctx.work_dir, "data"))  # made once, reused by later runs
  settings = {"train_steps": train_steps, "steps_per_epoch": steps_per_epoch}
  result = trials_lib.run_interleaved(
      ctx, kinds, trials, settings,
      lambda kind, seed: run_trial(kind, seed, ctx.work_dir, data, train_steps, steps_per_epoch),
      lambda kind, seed: [os.path.join(ctx.work_dir, f"{kind}_{seed}")])
  result["trials"] = [judged(t) for t in result["trials"]]
  result["summary"] = summarize(result["trials"])
  ctx.progress(markdown_table(result))
  return result


def _tables(summary: dict) -> List[str]:
  """report.md's body: the table of docs/reliability.md, the kill steps, the restarts used and
  any failed trial."""
  lines = markdown_table(summary).splitlines() + ["", "Kill steps per kind: " + "; ".join(
      f"{kind} {row['kill_steps']}" for kind, row in summary["summary"].items()) + "."]
  restarts = {kind: row["restarts_used"] for kind, row in summary["summary"].items()
              if any(n is not None for n in row.get("restarts_used", []))}
  if restarts:
    lines += ["", "Restarts the launcher used per trial (one kill should cost one): " + "; ".join(
        f"{kind} {used}" for kind, used in restarts.items()) + "."]
  return lines + trials_lib.failed_lines(summary, "did not recover", "kind", (
      "finished", "resumed_correctly", "launcher_restarted", "exit_code"))


BENCHMARK = registry.Benchmark(
    "fault_trials", measure_trials, tables=_tables, failure=trials_lib.failure("did not recover"),
    title="Fault trials: kill -9 of tasks and groups on local clusters")
