"""The goal figures of benchmark suites: functions of the arms' summaries, bound in suites' gin.

Each takes ``arms`` ({arm name: its summary, as runner.summarize writes it}) and returns (value,
the per-seed or per-pair values it came from) or, where it has one, (value, per-seed values, a
90% bootstrap interval); a value of None means the arms do not say (yet).
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence, Tuple

import gin
import numpy as np

from benchmarks import protocol


@gin.configurable(module="bench", denylist=["arms"])
def steps_ratio(arms: Mapping[str, dict], numerator: str = gin.REQUIRED,
                denominators: Sequence[str] = gin.REQUIRED) -> Tuple[Optional[float], List[float]]:
  """Steps to target of ``numerator`` / the fewest steps to target among ``denominators``."""
  best = [arms[d]["steps_to_target"]["mean"] for d in denominators if arms[d]["steps_to_target"]]
  num = arms[numerator]["steps_to_target"]
  if not best or not num:
    return None, []
  per_run = [r["steps_to_target"] / min(best) for r in arms[numerator]["runs"]
             if r["steps_to_target"] is not None]
  return num["mean"] / min(best), per_run


@gin.configurable(module="bench", denylist=["arms"])
def churn_reduction(arms: Mapping[str, dict], arm: str = gin.REQUIRED,
                    baseline: str = gin.REQUIRED) -> Tuple[Optional[float], List[float]]:
  """1 - mean churn of ``arm`` / mean churn of ``baseline`` (mean |p_a - p_b| over pairs)."""
  a, b = arms[arm].get("churn"), arms[baseline].get("churn")
  if not a or not b:
    return None, []
  base = b["mean_abs_diff"]["mean"]
  return 1 - a["mean_abs_diff"]["mean"] / base, [1 - p["mean_abs_diff"] / base for p in a["pairs"]]


@gin.configurable(module="bench", denylist=["arms"])
def loss_minus_best(arms: Mapping[str, dict], arm: str = gin.REQUIRED,
                    others: Sequence[str] = gin.REQUIRED) -> Tuple[Optional[float], List[float]]:
  """Final validation loss of ``arm`` minus the best (lowest) final loss among ``others``."""
  best = min(arms[o]["final_val_loss"]["mean"] for o in others)
  return (arms[arm]["final_val_loss"]["mean"] - best,
          [r["final_val_loss"] - best for r in arms[arm]["runs"]])


@gin.configurable(module="bench", denylist=["arms"])
def metric_ratio(arms: Mapping[str, dict], metric: str = gin.REQUIRED,
                 numerator: str = gin.REQUIRED,
                 denominator: str = gin.REQUIRED) -> Tuple[Optional[float], List[float]]:
  """Mean ``metric`` (a per-run figure, e.g. examples_per_sec) of ``numerator`` /
  ``denominator``."""
  num, den = arms[numerator][metric], arms[denominator][metric]
  if not num or not den or not den["mean"]:
    return None, []
  return num["mean"] / den["mean"], [r[metric] / den["mean"] for r in arms[numerator]["runs"]
                                     if r[metric] is not None]


@gin.configurable(module="bench")
def repeated_tokens(arms: Mapping[str, dict]) -> tuple:
  """Tokens any trained arm's groups read twice (a corpus suite's data never repeats): the sum
  over arms, and per arm; None while an arm's runs do not say (recorded before the count)."""
  per = {name: arm.get("repeated_tokens") for name, arm in arms.items()
         if arm.get("config", {}).get("kind") != "ensemble"}
  if any(v is None for v in per.values()):
    return None, []
  return sum(per.values()), list(per.values())


@gin.configurable(module="bench", denylist=["arms"])
def allreduce_bytes_ratio(arms: Mapping[str, dict], arm: str = gin.REQUIRED,
                          workers: int = 2) -> tuple:
  """How many times fewer bytes a step ``arm``'s groups send each other (measured: published
  versions and averaging changes) than a worker of a synchronous group of ``workers`` sends in a
  ring all-reduce of the gradient, 2 (n-1)/n times the float32 trainable parameter bytes a step
  (counted from the model: this machine measures no gRPC traffic). Mean over runs, per run."""
  per = []
  for run in arms[arm]["runs"]:
    sent, params = run.get("bytes_sent_per_step"), run.get("trainable_parameter_bytes")
    if sent and params:
      per.append(2 * (workers - 1) / workers * params / sent)
  return (float(np.mean(per)) if per else None), per


@gin.configurable(module="bench", denylist=["arms"])
def best_method_steps_ratio(arms: Mapping[str, dict], candidates: Sequence[str] = gin.REQUIRED,
                            sync_arms: Sequence[str] = gin.REQUIRED,
                            min_bytes_ratio: float = 100.0) -> tuple:
  """The fewest steps to the best sync arm's best loss, as a ratio to that arm's
  (``best_sync_steps_ratio``), among the ``candidates`` that send at least ``min_bytes_ratio``
  times fewer bytes a step than all-reduce; per candidate that qualifies and reached it."""
  ratios = {}
  for name in candidates:
    if (allreduce_bytes_ratio(arms, name)[0] or 0) >= min_bytes_ratio:
      value = best_sync_steps_ratio(arms, name, sync_arms)[0]
      if value is not None:
        ratios[name] = value
  return (min(ratios.values()) if ratios else None), sorted(ratios.values())


def _seed_curves(arms: Mapping[str, dict], name: str) -> List[protocol.Curve]:
  return [[(int(step), float(loss)) for step, loss in curve]
          for curve in arms[name]["seed_curves"].values()]


def _mean_best(curves: Sequence[protocol.Curve]) -> float:
  return float(np.mean([protocol.best_loss(c) for c in curves]))


@gin.configurable(module="bench", denylist=["arms"])
def best_sync_steps_ratio(arms: Mapping[str, dict], arm: str = gin.REQUIRED,
                          sync_arms: Sequence[str] = gin.REQUIRED) -> tuple:
  """Steps of ``arm``'s seed-mean curve to the best sync arm's best loss / that sync arm's steps
  (protocol.steps_ratio; None: never reached), per seed, and a 90% bootstrap interval over seeds
  (an upper end of None: some resamples never reach the target)."""
  curves = _seed_curves(arms, arm)
  syncs = {n: _seed_curves(arms, n) for n in sync_arms}
  names = list(syncs)
  best, target = protocol.best_arm(syncs)
  sync_steps = protocol.steps_to(protocol.mean_curve(syncs[best]), target)
  per = [s / sync_steps for s in (protocol.steps_to(c, target) for c in curves) if s is not None]
  interval = protocol.bootstrap(
      lambda a, *ss: protocol.steps_ratio(a, dict(zip(names, ss))), curves,
      *[syncs[n] for n in names])
  return protocol.steps_ratio(curves, syncs), per, interval


@gin.configurable(module="bench", denylist=["arms"])
def group_curve_difference(arms: Mapping[str, dict], arm: str = gin.REQUIRED,
                           baseline: str = gin.REQUIRED, group: int = 0) -> tuple:
  """The largest |validation loss difference| over the evaluations of ``arm``'s ``group`` and
  ``baseline``'s group 0 of the same seed (a check: codistillation with alpha = 0 must train as
  its baseline does); per seed. None when no seed is in both."""
  mine, theirs = arms[arm]["group_curves"], arms[baseline]["group_curves"]
  per = []
  for key, curve in mine.items():
    seed, g = key.split("_")
    if int(g) != group or f"{seed}_0" not in theirs:
      continue
    a, b = dict(map(tuple, curve)), dict(map(tuple, theirs[f"{seed}_0"]))
    per.append(max(abs(a[s] - b[s]) for s in set(a) & set(b)))
  return (max(per) if per else None), per


@gin.configurable(module="bench", denylist=["arms"])
def teacher_minus_student_loss(arms: Mapping[str, dict], arm: str = gin.REQUIRED) -> tuple:
  """How good the teachers a codistilling group learns from are, compared with the group itself:
  at every evaluation where distillation is on, the peer's validation loss at the step of the
  version in use (its curve at ``step - teacher_staleness``, linearly interpolated) minus the
  student's own; the mean over those points, per run. Positive: students distill toward worse
  (staler, less trained) models than themselves."""
  curves, stale = arms[arm]["group_curves"], arms[arm].get("group_staleness") or {}
  per = []
  for key, staleness in stale.items():
    seed, group = key.split("_")
    peers = [k for k in curves if k.startswith(f"{seed}_") and k != key]
    if not staleness or len(peers) != 1:
      continue
    own, peer = dict(map(tuple, curves[key])), np.array(curves[peers[0]], dtype=float)
    gaps = [float(np.interp(step - lag, peer[:, 0], peer[:, 1])) - own[step]
            for step, lag in staleness if step in own and lag >= 0]
    if gaps:
      per.append(float(np.mean(gaps)))
  return (float(np.mean(per)) if per else None), per


@gin.configurable(module="bench", denylist=["arms"])
def best_loss_minus_best(arms: Mapping[str, dict], arm: str = gin.REQUIRED,
                         others: Sequence[str] = gin.REQUIRED) -> tuple:
  """``arm``'s best validation loss (minimum over evaluations, mean over seeds) minus the lowest
  such figure among ``others``; per seed; a 90% bootstrap interval over seeds."""
  curves = _seed_curves(arms, arm)
  rest = [_seed_curves(arms, o) for o in others]
  best = min(_mean_best(o) for o in rest)
  interval = protocol.bootstrap(lambda a, *os_: _mean_best(a) - min(_mean_best(o) for o in os_),
                                curves, *rest)
  return _mean_best(curves) - best, [protocol.best_loss(c) - best for c in curves], interval


@gin.configurable(module="bench", denylist=["arms"])
def ensemble_gain_captured(arms: Mapping[str, dict], arm: str = gin.REQUIRED,
                           single: str = gin.REQUIRED, ensemble: str = gin.REQUIRED) -> tuple:
  """How much of the ensemble's gain ``arm`` captured: (``single``'s best validation loss minus
  ``arm``'s) / (``single``'s minus ``ensemble``'s), best losses as in best_loss_minus_best; a 90%
  bootstrap interval over seeds. None when the ensemble gains nothing (nothing to capture)."""

  def captured(mine, base, ens) -> Optional[float]:
    gain = _mean_best(base) - _mean_best(ens)
    return (_mean_best(base) - _mean_best(mine)) / gain if gain > 0 else None

  curves = [_seed_curves(arms, name) for name in (arm, single, ensemble)]
  value = captured(*curves)
  interval = protocol.bootstrap(captured, *curves)
  return value, [] if value is None else [value], interval


@gin.configurable(module="bench", denylist=["arms"])
def ensemble_gain(arms: Mapping[str, dict], arm: str = gin.REQUIRED) -> tuple:
  """What an ``ensemble`` arm's averaging gains: its members' mean validation loss minus the
  ensemble's, both scored on the same examples (mean over seeds); a 90% bootstrap interval over
  seeds. None before the arm ran (or for runs recorded without member losses)."""
  gains = [r.get("ensemble_gain") for r in arms[arm]["runs"]]
  if not gains or any(g is None for g in gains):
    return None, [], None
  return (float(np.mean(gains)), gains,
          protocol.bootstrap(lambda g: float(np.mean(g)), gains))


def _pair_curves(arms: Mapping[str, dict], name: str) -> list:
  churn = arms[name].get("churn") or {}
  return [protocol.pair_points(c, "mean_abs_diff") for c in churn.get("curves", [])]


@gin.configurable(module="bench", denylist=["arms"])
def churn_reduction_matched(arms: Mapping[str, dict], arm: str = gin.REQUIRED,
                            baseline: str = gin.REQUIRED) -> tuple:
  """1 - churn of ``arm`` / churn of ``baseline`` at matched validation loss (the loss every
  independent pair of both reaches; protocol.churn_reduction_at); a 90% bootstrap interval over
  pairs. None without prediction histories."""
  a, b = _pair_curves(arms, arm), _pair_curves(arms, baseline)
  if not a or not b:
    return None, [], None
  loss = protocol.matched_loss(a + b)
  base = float(np.mean([protocol.churn_at(p, loss) for p in b]))
  return (protocol.churn_reduction_at(a, b), [1 - protocol.churn_at(p, loss) / base for p in a],
          protocol.bootstrap(protocol.churn_reduction_at, a, b))


@gin.configurable(module="bench", denylist=["arms"])
def churn_reduction_final(arms: Mapping[str, dict], arm: str = gin.REQUIRED,
                          baseline: str = gin.REQUIRED) -> tuple:
  """1 - churn of ``arm`` / churn of ``baseline`` between the final models of independent pairs
  of seeds; a 90% bootstrap interval over pairs."""
  pairs = [[p["mean_abs_diff"] for p in (arms[n].get("churn") or {}).get("independent", [])]
           for n in (arm, baseline)]
  return _reduction(*pairs)


def _reduction(arm: Sequence[float], base: Sequence[float]) -> tuple:
  """(1 - mean(arm) / mean(base), each arm value's reduction, a 90% bootstrap interval over
  both samples); Nones when either is empty."""
  if not arm or not base:
    return None, [], None
  mean_base = float(np.mean(base))
  return (protocol.ratio_of_means(arm, base), [1 - x / mean_base for x in arm],
          protocol.bootstrap(protocol.ratio_of_means, arm, base))


def _late_churn(arms: Mapping[str, dict], name: str, evaluations: int) -> List[np.ndarray]:
  """Each independent pair's churn at its last ``evaluations`` evaluations."""
  return [np.array([churn for _, churn in pair[-evaluations:]])
          for pair in _pair_curves(arms, name)]


@gin.configurable(module="bench", denylist=["arms"])
def churn_reduction_late(arms: Mapping[str, dict], arm: str = gin.REQUIRED,
                         baseline: str = gin.REQUIRED, evaluations: int = 6) -> tuple:
  """1 - churn of ``arm`` / churn of ``baseline``, each pair's churn averaged over its last
  ``evaluations`` evaluations (steadier than one end point when churn swings from one evaluation
  to the next); a 90% bootstrap interval over pairs."""
  return _reduction(*([float(late.mean()) for late in _late_churn(arms, name, evaluations)]
                      for name in (arm, baseline)))


@gin.configurable(module="bench", denylist=["arms"])
def churn_swing(arms: Mapping[str, dict], arm: str = gin.REQUIRED, evaluations: int = 6) -> tuple:
  """How much ``arm``'s churn moves between consecutive evaluations near the end: per pair, the
  mean |change| over its last ``evaluations`` evaluations relative to their mean churn; the mean
  over pairs."""
  swings = [float(np.mean(np.abs(np.diff(late))) / np.mean(late))
            for late in _late_churn(arms, arm, evaluations)]
  return (float(np.mean(swings)), swings, None) if swings else (None, [], None)
