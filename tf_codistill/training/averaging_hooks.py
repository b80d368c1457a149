"""Parameter averaging inside ``model.fit``: the round a group takes every H steps.

``AveragingRound`` is a StepHook run between two steps (a batch callback: one device, Mirrored,
MultiWorkerMirrored). At the start of ``fit`` every process takes the shared parameters
(``seed_group``'s at a fresh start, the newest shared state after a restart, then every decided
round since, replayed from the stored changes). Every ``every_steps`` steps the chief publishes its
change, every process waits for the round's decision, reads the members' stored changes, averages
them and takes the outer step in numpy (``optim.outer``), checks the result is finite, and only
then assigns it to the student's trainable variables: nothing is half-applied. The inner
optimizer's state is never touched. The round applied and the step its period began are in the
model's checkpoint (``CodistillModel.averaging_position``): a group resumed from a checkpoint with
no round decided since keeps its checkpoint's parameters and goes on in that round's period, as if
it had not stopped; one that missed rounds takes the newest. Under MultiWorkerMirrored every worker
computes the same numbers from the same files and assigns its own copy; the one collective agrees
on the round they catch up to (``agree``), so a decision that lands between two workers' reads
cannot leave them a round apart. Under ParameterServerStrategy ``ScheduledRounds`` runs the same
rounds from the coordinator, with no step in flight. Round r falls on step r * H in every group,
after a restart or a catch-up too (a group that took rounds decided without it takes its next one
where its peers do, at once if that step is past), so groups meet on the same round at the same
step and every group's last round is the same one.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from tf_codistill import errors
from tf_codistill import step_hooks
from tf_codistill.exchange import averaging
from tf_codistill.exchange.averaging import AveragingError
from tf_codistill.optim import outer


class AveragingRound(step_hooks.StepHook):
  """One group's parameter-averaging rounds (``averaging.ParameterAveraging``)."""

  reads_logs = False

  def __init__(self, config: averaging.ParameterAveraging, exchange_dir: str, group: int,
               num_groups: int, chief: bool,
               summary_writer: Optional[tf.summary.SummaryWriter] = None,
               before_read: Optional[Callable[[], None]] = None,
               agree: Optional[Callable[[int], int]] = None):
    """``agree``: the smallest of the rounds the group's training processes pass it (a
    collective each of them calls at the same point: ``min_across_workers``); None: this process
    is the group's only one."""
    self.config = config
    self.exchange_dir = exchange_dir
    self.group = group
    self.num_groups = num_groups
    self.chief = chief
    self.summary_writer = summary_writer
    self.before_read = before_read
    self.agree = agree or (lambda round_: round_)
    self.optimizer = config.optimizer()
    self.round = 0
    self.round_start_step = 0
    self.anchor: List[np.ndarray] = []
    self.momentum: Optional[List[np.ndarray]] = None
    self.variables: List[tf.Variable] = []
    self.position: Optional[tf.Variable] = None  # the model's (round applied, period start)
    # Held while the variables are assigned: a publisher's snapshot on another thread (parameter
    # servers) takes it too, so it never holds half a round.
    self.lock = threading.Lock()
    self.log: List[Dict[str, Any]] = []  # one entry per round applied
    # Read to reach a round outside the rounds taken part in: the shared start, and rounds
    # replayed from their changes or skipped to through a shared state.
    self.bytes_read_catching_up = 0

  # -- the shared start ----------------------------------------------------------------------

  def on_begin(self, model, step):
    self.variables = list(model.student.trainable_variables)
    self.position = getattr(model, "averaging_position", None)
    state = averaging.read_shared_state(self.exchange_dir)
    if state is None:
      if self.chief and self.group == self.config.seed_group:
        theta = self._read(model)
        averaging.write_shared_state(self.exchange_dir, averaging.SharedState(
            0, theta, None, outer.digest(theta)), self.config.keep_rounds)
      state = self._wait_for_start()
    self.round = -1  # below every shared state: _reach starts from the newest it may take
    target = self.agree(self._decided_through(state.round))  # rounds decided meanwhile
    restored, period_start = ((-1, 0) if self.position is None
                              else (int(v) for v in self.position.numpy()))
    if 0 <= restored == target:
      # Resumed from a checkpoint and no round decided since: its parameters are its round's
      # plus the steps trained since, which the next change must hold (a round due at the
      # checkpoint's step, which the checkpoint was written before, is taken now).
      self._reach(restored)
      self.round_start_step = period_start
      logging.info("averaging: group %d resumes in round %d's period (from step %d) at step %d "
                   "with its checkpoint's parameters", self.group, self.round, period_start, step)
      if step - period_start >= self.config.every_steps:
        self.run_round(model, step)
      return
    self._reach(target)
    self._assign(self.anchor)
    self._begin_period()
    logging.info("averaging: group %d starts at round %d (step %d, parameters %s)", self.group,
                 self.round, step, outer.digest(self.anchor))

  def _begin_period(self) -> None:
    """The period after round r (now applied) began at step r * H, where every group took it,
    also when this group took it later (late or catching up); both go into the model's
    checkpointed ``averaging_position``, which a resumed run starts from."""
    self.round_start_step = self.round * self.config.every_steps
    if self.position is not None:
      self.position.assign(tf.constant([self.round, self.round_start_step], tf.int64))

  def _wait_for_start(self) -> averaging.SharedState:
    deadline = time.monotonic() + self.config.peer_timeout_s
    while time.monotonic() < deadline:
      state = averaging.read_shared_state(self.exchange_dir)
      if state is not None:
        return state
      time.sleep(self.config.poll_interval_s)
    raise AveragingError(f"averaging: group {self.group} found no shared start from group "
                         f"{self.config.seed_group} in {averaging.shared_dir(self.exchange_dir)} "
                         f"after {self.config.peer_timeout_s:.0f} s")

  def _adopt(self, state: averaging.SharedState) -> None:
    shapes = [tuple(v.shape) for v in self.variables]
    if [a.shape for a in state.parameters] != shapes:
      raise AveragingError(f"averaging: the shared parameters of round {state.round} have shapes "
                           f"{[a.shape for a in state.parameters]}, group {self.group}'s model "
                           f"{shapes}")
    self.round, self.anchor, self.momentum = state.round, state.parameters, state.momentum
    self.bytes_read_catching_up += sum(a.nbytes for a in [*state.parameters,
                                                           *(state.momentum or [])])

  def _decided_through(self, round_: int) -> int:
    """The last round of the unbroken run of decisions after ``round_``."""
    while averaging.read_decision(self.exchange_dir, round_ + 1, self.num_groups) is not None:
      round_ += 1
    return round_

  def _reach(self, target: int) -> None:
    """Brings the host state to round ``target`` exactly (decided, so every process of the group
    can read it): the decided rounds replayed from their stored changes, from the newest shared
    state at most ``target`` where they are gone. Either way the bits are the same."""
    while self.round < target:
      decision = averaging.read_decision(self.exchange_dir, self.round + 1, self.num_groups)
      try:
        if decision is None or self.round < 0:
          raise averaging.RejectedChange(f"round {self.round + 1} is not replayable here")
        changes = self._members(decision)
        self._apply(decision, changes)
        self.bytes_read_catching_up += sum(nbytes for _, nbytes in changes.values())
        logging.info("averaging: group %d caught up with round %d", self.group, self.round)
      except averaging.RejectedChange as why:
        state = averaging.read_shared_state(self.exchange_dir, newest_at_most=target)
        if state is None or state.round <= self.round:
          raise AveragingError(f"averaging: group {self.group} cannot reach round {target} "
                               f"({why}) and no shared state of a round up to it is newer: "
                               "raise tfc.ParameterAveraging.keep_rounds") from None
        if self.round >= 0:
          logging.warning("averaging: group %d skips to the shared state of round %d (%s)",
                          self.group, state.round, why)
        self._adopt(state)

  # -- a round --------------------------------------------------------------------------------

  def on_step(self, model, step, logs):
    if step - self.round_start_step >= self.config.every_steps:
      self.run_round(model, step)

  def run_round(self, model, step: int) -> None:
    """Publishes this group's change, waits for the decision, applies it."""
    start = time.monotonic()
    round_ = self.round + 1
    local = self._read(model)
    change = [np.subtract(a, x, dtype=np.float32) for a, x in zip(self.anchor, local)]
    if not outer.all_finite(change):
      # A published change is never replaced: NaN/Inf must stop here, like a non-finite loss.
      raise errors.NonFiniteLossError(
          f"averaging: group {self.group}'s parameters are not finite at step {step}: its change "
          f"for round {round_} is not published", step)
    sent = 0
    if self.chief:
      sent = averaging.write_change(self.exchange_dir, self.group, round_, change,
                                    self.config.encoding, outer.digest(self.anchor),
                                    self.config.keep_rounds)
    try:
      decision, changes = self._decide(round_, start)
    except averaging.RejectedChange:  # decided long ago; its changes are collected
      self._reach(round_)
      self._reach(self.agree(self._decided_through(self.round)))
      self._assign(self.anchor)
      self._begin_period()
      return
    waited = time.monotonic() - start
    received = sum(nbytes for g, (_, nbytes) in changes.items() if g != self.group)
    digest = self._apply(decision, changes)
    self._assign(self.anchor)
    self._begin_period()
    entry = {"round": round_, "step": step, "members": list(decision.members),
             "excluded": {str(g): why for g, why in decision.excluded.items()},
             "late": self.group not in decision.members, "wait_s": waited,
             "seconds": time.monotonic() - start, "bytes_sent": sent,
             "bytes_received": received, "digest": digest}
    self.log.append(entry)
    self._report(entry, step)
    if self.chief and decision.decided_by == self.group:
      averaging.write_shared_state(self.exchange_dir, averaging.SharedState(
          round_, self.anchor, self.momentum, digest), self.config.keep_rounds)
    # Rounds decided without this group while it was behind (late by whole rounds).
    behind = self.round
    self._reach(self.agree(self._decided_through(self.round)))
    if self.round > behind:
      self._assign(self.anchor)
      self._begin_period()

  def _decide(self, round_: int, start: float
              ) -> Tuple[averaging.Decision, Dict[int, Tuple[List[np.ndarray], int]]]:
    """The round's decision (made here if this chief may make it) and the members' changes."""
    config = self.config
    deciders = ((self.config.seed_group,) if config.on_missing == "fail"
                else tuple(range(self.num_groups)))
    may_decide = self.chief and self.group in deciders
    limit = config.peer_timeout_s + (0 if may_decide else max(60.0, config.peer_timeout_s))
    valid: Dict[int, Tuple[List[np.ndarray], int]] = {}
    rejected: Dict[int, str] = {}
    while True:
      decision = averaging.read_decision(self.exchange_dir, round_, self.num_groups)
      if decision is not None:
        return decision, self._members(decision, valid)
      elapsed = time.monotonic() - start
      if may_decide:
        self._scan(round_, valid, rejected)
        # Too few valid changes after the timeout: no decision (a failed one would fail every
        # restart too); the round fails here below, and a restart retries it.
        if len(valid) == self.num_groups or (config.on_missing == "continue"
                                             and elapsed >= config.peer_timeout_s
                                             and len(valid) >= config.min_groups):
          self._create(round_, sorted(valid), rejected)
          continue
      if elapsed >= limit:
        raise AveragingError(self._timeout_message(round_, elapsed, rejected))
      time.sleep(config.poll_interval_s)

  def _scan(self, round_: int, valid: Dict[int, Tuple[List[np.ndarray], int]],
            rejected: Dict[int, str]) -> None:
    for group in range(self.num_groups):
      if group in valid or group in rejected or not averaging.has_change(
          self.exchange_dir, group, round_):
        continue
      try:
        valid[group] = self._read_change(group, round_)
      except averaging.RejectedChange as e:
        rejected[group] = str(e)
        logging.warning("averaging: %s", e)

  def _create(self, round_: int, members: List[int], rejected: Dict[int, str]) -> None:
    excluded = {g: rejected.get(g, f"no change within {self.config.peer_timeout_s:.0f} s")
                for g in range(self.num_groups) if g not in members}
    decision = averaging.Decision(round_, tuple(members), excluded, self.group)
    averaging.create_decision(self.exchange_dir, decision,
                              exclusive=self.config.on_missing == "continue")

  def _timeout_message(self, round_: int, elapsed: float, rejected: Dict[int, str]) -> str:
    missing = [g for g in range(self.num_groups)
               if not averaging.has_change(self.exchange_dir, g, round_)]
    return (f"averaging: round {round_} of group {self.group} was not decided after "
            f"{elapsed:.0f} s (ParameterAveraging.on_missing={self.config.on_missing!r}, "
            f"min_groups={self.config.min_groups}); no change from groups {missing}"
            + "".join(f"; {why}" for why in rejected.values()))

  def _members(self, decision: averaging.Decision,
               read: Optional[Dict[int, Tuple[List[np.ndarray], int]]] = None
               ) -> Dict[int, Tuple[List[np.ndarray], int]]:
    """The decision's members' changes (those already read are reused)."""
    if decision.failed:
      raise AveragingError(f"averaging: round {decision.round} failed: {len(decision.members)} "
                           f"group(s) {list(decision.members)} < ParameterAveraging.min_groups="
                           f"{self.config.min_groups} ({decision.excluded})")
    read = read or {}
    return {g: read[g] if g in read else self._read_change(g, decision.round)
            for g in decision.members}

  def _read_change(self, group: int, round_: int) -> Tuple[List[np.ndarray], int]:
    return averaging.read_change(self.exchange_dir, group, round_,
                                 [tuple(a.shape) for a in self.anchor],
                                 outer.digest(self.anchor))

  def _apply(self, decision: averaging.Decision,
             changes: Dict[int, Tuple[List[np.ndarray], int]]) -> str:
    """The outer step of ``decision`` from the members' changes, into the host state; returns
    the new parameters' digest. Raises AveragingError before any change if it is not finite."""
    mean = outer.average_in_order([changes[g][0] for g in decision.members])
    theta, momentum = self.optimizer.step(self.anchor, mean, self.momentum)
    if not outer.all_finite(theta):
      raise AveragingError(f"averaging: round {decision.round} gives non-finite parameters")
    self.anchor, self.momentum, self.round = theta, momentum, decision.round
    return outer.digest(theta)

  # -- the variables --------------------------------------------------------------------------

  def _read(self, model) -> List[np.ndarray]:
    if self.before_read is not None:
      self.before_read()
    return [np.asarray(v.numpy(), np.float32) for v in self.variables]

  def _assign(self, values: List[np.ndarray]) -> None:
    with self.lock:
      for variable, value in zip(self.variables, values):
        variable.assign(value.astype(variable.dtype.as_numpy_dtype))

  def _report(self, entry: Dict[str, Any], step: int) -> None:
    logging.info("averaging: round %d at step %d: members %s%s, waited %.3fs, sent %d B, "
                 "received %d B, parameters %s", entry["round"], step, entry["members"],
                 f" (excluded {entry['excluded']})" if entry["excluded"] else "",
                 entry["wait_s"], entry["bytes_sent"], entry["bytes_received"], entry["digest"])
    if entry["late"]:
      logging.warning("averaging: group %d was late for round %d: its change was not averaged",
                      self.group, entry["round"])
    if self.summary_writer is not None:
      with self.summary_writer.as_default(step=step):
        for key in ("wait_s", "bytes_sent", "bytes_received"):
          tf.summary.scalar(f"averaging/{key}", entry[key])
        tf.summary.scalar("averaging/members", len(entry["members"]))
        tf.summary.scalar("averaging/missing", self.num_groups - len(entry["members"]))

  def statistics(self) -> Dict[str, Any]:
    """Rounds, their members, waits and bytes (results.json's ``averaging``)."""
    log = self.log
    return {"rounds": len(log), "last_round": self.round,
            "late_rounds": sum(e["late"] for e in log),
            "rounds_short_of_groups": sum(len(e["members"]) < self.num_groups for e in log),
            "bytes_sent": int(sum(e["bytes_sent"] for e in log)),
            "bytes_received": int(sum(e["bytes_received"] for e in log)),
            "bytes_read_catching_up": int(self.bytes_read_catching_up),
            "wait_s_median": float(np.median([e["wait_s"] for e in log])) if log else None,
            "digests": [e["digest"] for e in log]}


def min_across_workers(strategy: tf.distribute.Strategy) -> Optional[Callable[[int], int]]:
  """``AveragingRound``'s ``agree`` for ``strategy``: under MultiWorkerMirrored with several
  replicas, the smallest of the values the workers pass (a collective: every worker calls it at
  the same point, as batch callbacks run); None where one process applies the rounds."""
  if (not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
      or strategy.num_replicas_in_sync < 2):
    return None

  @tf.function
  def smallest(value):
    per_replica = strategy.run(lambda: tf.reshape(value, [1]))
    return tf.reduce_min(strategy.gather(per_replica, axis=0))
  # float32 holds every round number below 2**24 exactly.
  return lambda value: int(smallest(tf.constant(value, tf.float32)).numpy())


class ScheduledRounds(keras.callbacks.Callback):
  """``AveragingRound``'s rounds under ParameterServerStrategy, from the coordinator's ``fit``
  thread (a batch callback that reads no logs, which tf_keras allows there): every
  ``every_steps`` scheduled steps it waits for every step in flight
  (``ClusterCoordinator.join``), so the round reads exact values and the workers stand still
  while it assigns the new ones to the variables on the ps tasks. A thread polling the step would
  let ``fit`` schedule steps during the round. (Under other strategies a step is done when its
  batch callback runs: nothing to wait for.)"""

  def __init__(self, rounds: AveragingRound):
    super().__init__()
    self._supports_tf_logs = True
    self.rounds = rounds
    self._epoch = 0
    self._start_step = 0  # the step fit began at (a resumed run's checkpoint)
    self._offset: Optional[int] = None

  def on_train_begin(self, logs=None):
    self._start_step = step_hooks.current_step(self.model)
    self.rounds.on_begin(self.model, self._start_step)
    self._offset = None

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch = epoch
    if self._offset is None:
      # A run resumed from a checkpoint taken mid-epoch starts that epoch over, steps ahead.
      self._offset = max(0, self._start_step - epoch * int(self.params["steps"]))

  def on_train_batch_end(self, batch, logs=None):
    scheduled = self._epoch * int(self.params["steps"]) + batch + 1 + (self._offset or 0)
    if scheduled - self.rounds.round_start_step < self.rounds.config.every_steps:
      return
    strategy = self.model.distribute_strategy
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
      tf.distribute.experimental.coordinator.ClusterCoordinator(strategy).join()
    self.rounds.run_round(self.model, step_hooks.current_step(self.model))
