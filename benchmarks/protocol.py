"""The figures of a pre-registered comparison, computed from recorded validation curves.

Everything here is a pure function of per-seed curves (lists of ``(step, loss)``) and churn
pairs, so the rules can be read, tested and re-applied to committed runs:

- ``best_loss``: a run's minimum validation loss over its evaluations (an overfitting run is
  judged by its best point, not its last).
- ``mean_curve``: the mean over seeds (or a codistillation seed's groups: ``grouped``) at the
  evaluation steps all of them have.
- ``target``: the best sync arm's *best* loss: the minimum of its seed-mean curve (the arm whose
  minimum is lowest among the sync arms), so that arm reaches it exactly once, at its best step.
- ``steps_to``: the first evaluation step at or below a target; None if never.
- ``b_star``: the smallest batch past which doubling it cuts steps-to-target by less than
  ``min_cut`` (15%), to a target every batch reaches (the worst batch's best loss).
- ``bootstrap``: a 90% percentile interval over seeds (or churn pairs) resampled with
  replacement, 2000 times, from a fixed RNG seed.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

Curve = List[Tuple[int, float]]
RESAMPLES = 2000
LEVEL = 0.90


def curve_points(records: Sequence[dict], key: str) -> Curve:
  """(step, loss) of every evaluation record that has ``key``, in step order."""
  return sorted((int(r["step"]), float(r[key])) for r in records if r.get(key) is not None)


def best_loss(curve: Curve) -> Optional[float]:
  return min((loss for _, loss in curve), default=None)


def mean_curve(curves: Sequence[Curve]) -> Curve:
  """Mean loss over curves at the steps every curve has."""
  curves = [dict(c) for c in curves if c]
  if not curves:
    return []
  steps = sorted(set.intersection(*(set(c) for c in curves)))
  return [(s, float(np.mean([c[s] for c in curves]))) for s in steps]


def steps_to(curve: Curve, target: float) -> Optional[int]:
  """The first evaluation step at or below ``target``; None if the curve never gets there."""
  for step, loss in curve:
    if loss <= target:
      return step
  return None


def best_arm(seed_curves: Mapping[str, Sequence[Curve]]) -> Tuple[str, float]:
  """(name, loss) of the arm whose seed-mean curve reaches the lowest minimum."""
  minima = {name: best_loss(mean_curve(curves)) for name, curves in seed_curves.items()}
  minima = {n: m for n, m in minima.items() if m is not None}
  if not minima:
    raise ValueError("no arm has a validation curve")
  name = min(minima, key=minima.get)
  return name, minima[name]


def b_star(batch_curves: Mapping[int, Sequence[Curve]], min_cut: float = 0.15) -> dict:
  """Where synchronous scaling stops: per batch its seed-mean curve's steps to the common target
  (the worst batch's best loss, which every batch reaches), the ratio of each doubling, and
  ``b_star``: the smallest batch whose doubling cuts steps by less than ``min_cut``. If every
  doubling in the grid still cuts more, ``b_star`` is the largest batch whose double was
  measured and ``scaling_stopped`` is False."""
  batches = sorted(batch_curves)
  means = {b: mean_curve(batch_curves[b]) for b in batches}
  target = max(best_loss(means[b]) for b in batches)
  steps = {b: steps_to(means[b], target) for b in batches}
  doubled = [b for b in batches if 2 * b in steps]
  if not doubled:
    raise ValueError(f"scaling batches {batches} hold no batch and its double")
  ratios = {b: steps[2 * b] / steps[b] for b in doubled}
  chosen = next((b for b in doubled if ratios[b] > 1 - min_cut), None)
  return {"target": target, "steps_to_target": steps, "doubling_ratio": ratios,
          "b_star": chosen if chosen is not None else max(doubled),
          "scaling_stopped": chosen is not None, "min_cut": min_cut}


def bootstrap(statistic: Callable[..., Optional[float]], *samples: Sequence,
              resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0
              ) -> Optional[List[Optional[float]]]:
  """A percentile interval of ``statistic(*resampled)``, each sample resampled with replacement
  on its own. A statistic that is None (e.g. a target never reached) counts as +infinity; a
  bound at infinity is returned as None. None when a sample is empty."""
  if any(len(s) == 0 for s in samples):
    return None
  rng = np.random.default_rng(seed)
  values = []
  for _ in range(resamples):
    picked = [[s[i] for i in rng.integers(0, len(s), len(s))] for s in samples]
    value = statistic(*picked)
    values.append(math.inf if value is None else value)
  tail = 100 * (1 - level) / 2
  # "lower"/"higher" pick resampled values (no interpolation between a value and infinity).
  low = np.percentile(values, tail, method="lower")
  high = np.percentile(values, 100 - tail, method="higher")
  return [None if math.isinf(v) else float(v) for v in (low, high)]


def steps_ratio(arm: Sequence[Curve], sync_arms: Mapping[str, Sequence[Curve]]
                ) -> Optional[float]:
  """Steps of ``arm``'s seed-mean curve to the target / the best sync arm's (None: never)."""
  name, target = best_arm(sync_arms)
  sync_steps = steps_to(mean_curve(sync_arms[name]), target)
  steps = steps_to(mean_curve(arm), target)
  return None if steps is None else steps / sync_steps


def pair_points(pair: Sequence[dict], measure: str) -> List[Tuple[float, float]]:
  """(pair's mean validation loss, ``measure``) at each step a churn pair was measured."""
  return [(p["loss"], p[measure]) for p in sorted(pair, key=lambda p: p["step"])]


def churn_at_matched_loss(arm_pairs: Mapping[str, Sequence[Sequence[dict]]],
                          measures: Sequence[str] = ("mean_abs_diff", "disagreement")) -> dict:
  """Every arm's churn at one validation loss: the loss every pair of the arms with the most
  independent pairs reaches (the main comparison; an arm with a single pair does not set it).
  Per arm and measure the mean over pairs and a 90% bootstrap interval over pairs; None for an
  arm some of whose pairs never reach that loss."""
  pairs = {name: p for name, p in arm_pairs.items() if p}
  if not pairs:
    return {}
  most = max(len(p) for p in pairs.values())
  loss = matched_loss([pair_points(p, "mean_abs_diff") for ps in pairs.values()
                       if len(ps) == most for p in ps])

  def mean_at(ps, m):
    values = [churn_at(pair_points(p, m), loss) for p in ps]
    return None if None in values else float(np.mean(values))

  arms = {name: {"pairs": len(ps),
                 **{m: mean_at(ps, m) for m in measures},
                 **{f"{m}_interval": bootstrap(lambda s, m=m: mean_at(s, m), ps)
                    for m in measures}}
          for name, ps in pairs.items()}
  return {"loss": loss, "arms": arms}


def churn_at(pair: Sequence[Tuple[float, float]], loss: float) -> Optional[float]:
  """A pair's churn at the first evaluation whose loss is at or below ``loss``."""
  for pair_loss, churn in pair:
    if pair_loss <= loss:
      return churn
  return None


def matched_loss(pairs: Sequence[Sequence[Tuple[float, float]]]) -> float:
  """The loss every pair reaches: the highest of the pairs' best losses."""
  return max(min(loss for loss, _ in pair) for pair in pairs)


def churn_reduction_at(arm_pairs: Sequence[Sequence[Tuple[float, float]]],
                       base_pairs: Sequence[Sequence[Tuple[float, float]]]
                       ) -> Optional[float]:
  """1 - mean churn of ``arm`` / mean churn of the baseline, both at the loss every pair of
  either reaches (churn at matched validation loss)."""
  loss = matched_loss(list(arm_pairs) + list(base_pairs))
  return ratio_of_means([churn_at(p, loss) for p in arm_pairs],
                        [churn_at(p, loss) for p in base_pairs])


def ratio_of_means(arm: Sequence[float], base: Sequence[float]) -> float:
  """1 - mean(arm) / mean(base): a churn reduction from per-pair churn values."""
  return 1 - float(np.mean(arm)) / float(np.mean(base))


def grouped(curves: Mapping[Tuple[int, int], Curve]) -> Dict[int, Curve]:
  """{(seed, group): curve} -> {seed: seed curve, the mean over its groups}."""
  by_seed = itertools.groupby(sorted(curves.items()), key=lambda item: item[0][0])
  return {seed: mean_curve([curve for _, curve in items]) for seed, items in by_seed}
