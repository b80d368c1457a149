"""The step-time harness of the performance benchmarks: per-step times, arms interleaved, paired
ratios with an interval.

Timing whole ``fit`` calls measures ``fit``'s set-up as well as the steps (some calls carry a fixed
stall of about a second). Here a callback stamps the end of every step, so a step's time is the
time between two consecutive step ends inside one ``fit``; each ``fit`` first runs ``skip`` steps
that are not counted. Arms run in rounds, in a rotated order each round, so that drifting machine
load hits them alike; ``alternate_steps`` interleaves finer, one step of each arm in turn, calling
the train function ``fit`` would call. A ratio of two arms is formed within each round (the ratio
of their median, or other statistic's, step times) and summarized over rounds by its median and a
90% bootstrap interval.

Rounds run in one process share what that process was dealt: where each arm's tables lie in
memory, which arm follows which. Two runs of the same benchmark, each with tight intervals, can
disagree by more than their intervals (CTR teacher arms moved by up to 7% between runs). Rounds
taken in several processes are pooled with ``pool_processes``; their ratios then get an interval
that resamples processes first (``cluster_bootstrap_median``), so it covers the spread between
processes as well as between rounds.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tf_codistill.training import step_timing

# arm -> rounds -> step times (seconds)
Times = Dict[str, List[List[float]]]
# Steps a fit (or a round of alternate_steps) runs before its timed ones: the first trace.
SKIP = 3


class StepClock(keras.callbacks.Callback):
  """The time of every training step of a ``fit`` after its first ``skip``: ``intervals`` holds
  (start, end) on time.monotonic(), a step's start being the end of the step before it (the
  first step has none), as ``step_timing.ClosureTimer`` keeps them under parameter servers."""

  def __init__(self, skip: int = SKIP):
    super().__init__()
    self.skip = skip
    self.intervals: List[Tuple[float, float]] = []
    self._ends = 0
    self._last: Optional[float] = None

  def on_train_begin(self, logs=None):
    self.intervals, self._ends, self._last = [], 0, None

  def on_train_batch_end(self, batch, logs=None):
    now = time.monotonic()
    if self._ends >= self.skip and self._last is not None:
      self.intervals.append((self._last, now))
    self._ends += 1
    self._last = now


def step_clock(model: keras.Model, skip: int = SKIP) -> keras.callbacks.Callback:
  """A callback that keeps ``model``'s step intervals after the first ``skip`` steps of a ``fit``
  (``intervals``: (start, end, ...) on time.monotonic()). Under parameter servers they are the
  gaps between finished step functions on any worker (``step_timing.ClosureTimer``): the group's
  step time, whose mean, not median, is the inverse of its throughput when several workers
  interleave."""
  if isinstance(model.distribute_strategy, tf.distribute.experimental.ParameterServerStrategy):
    return step_timing.ClosureTimer(skip_steps=skip)
  return StepClock(skip)


def fit_step_times(model: keras.Model, data, steps: int, skip: int = SKIP,
                   callbacks: Sequence[keras.callbacks.Callback] = ()) -> List[float]:
  """Trains ``model`` for ``skip + steps`` steps in one ``fit``; the last ``steps`` step times
  (``step_clock``'s)."""
  clock = step_clock(model, skip)
  model.fit(data, steps_per_epoch=skip + steps, epochs=1, verbose=0,
            callbacks=[*callbacks, clock])
  return [interval[1] - interval[0] for interval in clock.intervals]


def alternate_steps(models: Mapping[str, keras.Model], data: tf.data.Dataset, steps: int,
                    rounds: int, skip: int = SKIP, seed: int = 0) -> Times:
  """Per-step times of every arm with the arms alternating step by step.

  A step is one call of the arm's own tf_keras train function (the function ``fit`` runs for each
  step) on the arm's own iterator over ``data``. Each round runs ``skip`` uncounted steps of
  every arm, then ``steps`` times one step of each arm in turn, in an order drawn anew each round
  (seeded), so no arm always follows the same one. Steps next to each other in time see the same
  machine, so load that drifts over seconds hits every arm alike (per-round ratios spread far
  less than with many steps of one arm after another). Each step starts with the caches the
  previous arm's step left behind: a fair comparison only for models whose own step does not fit
  in cache either (the CTR model under Adam sweeps about 130 MB every step).
  """
  functions = {name: model.make_train_function() for name, model in models.items()}
  iterators = {name: iter(data) for name in models}
  names = list(models)
  rng = np.random.default_rng(seed)
  times: Times = {name: [] for name in names}
  for _ in range(rounds):
    order = [names[i] for i in rng.permutation(len(names))]
    this_round: Dict[str, List[float]] = {name: [] for name in names}
    for i in range(skip + steps):
      for name in order:
        start = time.perf_counter()
        logs = functions[name](iterators[name])
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, logs)
        if i >= skip:
          this_round[name].append(time.perf_counter() - start)
    for name in names:
      times[name].append(this_round[name])
  return times


def interleave(arms: Mapping[str, Callable[[], List[float]]], rounds: int) -> Times:
  """Runs every arm once per round, the order rotated by one arm each round; each call returns
  that round's step times."""
  names = list(arms)
  times: Times = {name: [] for name in names}
  for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
      times[name].append(list(arms[name]()))
  return times


def bootstrap_median(values: Sequence[float], resamples: int = 2000, seed: int = 0) -> List[float]:
  """90% bootstrap interval of the median of ``values``."""
  rng = np.random.default_rng(seed)
  data = np.asarray(values, np.float64)
  medians = np.median(data[rng.integers(0, len(data), (resamples, len(data)))], axis=1)
  return [float(np.percentile(medians, 5)), float(np.percentile(medians, 95))]


def _by_cluster(values: Sequence[float], clusters: Sequence[int]) -> List[List[float]]:
  """``values`` grouped by their cluster, in the clusters' sorted order."""
  return [[v for v, c in zip(values, clusters) if c == key] for key in sorted(set(clusters))]


def cluster_bootstrap_median(values: Sequence[float], clusters: Sequence[int],
                             resamples: int = 2000, seed: int = 0) -> List[float]:
  """90% bootstrap interval of the median of ``values`` taken in clusters (``clusters[i]`` is
  the cluster of ``values[i]``, e.g. the process it was measured in): each resample draws
  clusters with replacement, then values within each drawn cluster. With few clusters it leans
  wide (with 3, one resample in 9 draws a single cluster three times): read it with the
  clusters' own medians."""
  rng = np.random.default_rng(seed)
  groups = [np.asarray(group, np.float64) for group in _by_cluster(values, clusters)]
  medians = []
  for _ in range(resamples):
    drawn = [groups[i] for i in rng.integers(0, len(groups), len(groups))]
    medians.append(np.median(np.concatenate([g[rng.integers(0, len(g), len(g))] for g in drawn])))
  return [float(np.percentile(medians, 5)), float(np.percentile(medians, 95))]


def pool_processes(runs: Sequence[Times]) -> Tuple[Times, List[int]]:
  """The rounds of runs made in separate processes as one ``Times`` (each round's arms stay
  paired) and the index of the run each round came from."""
  pooled: Times = {name: [] for name in runs[0]}
  clusters: List[int] = []
  for index, run in enumerate(runs):
    if set(run) != set(pooled):
      raise ValueError(f"run {index} has arms {sorted(run)}, run 0 has {sorted(pooled)}")
    counts = {len(run[name]) for name in pooled}
    if len(counts) != 1:
      raise ValueError(f"run {index} has arms with different numbers of rounds: {sorted(counts)}")
    for name in pooled:
      pooled[name].extend(run[name])
    clusters.extend([index] * counts.pop())
  return pooled, clusters


def throughput_ratio(times: Times, arm: str, baseline: str,
                     statistic: Callable[[Sequence[float]], float] = statistics.median,
                     clusters: Optional[Sequence[int]] = None) -> Dict[str, object]:
  """Steps/s of ``arm`` over ``baseline``'s, per round (the inverse ratio of their median, or
  ``statistic``, step times in that round): the median over rounds, its 90% interval, and every
  round's value. With ``clusters`` (the process of each round, ``pool_processes``) the interval
  resamples processes first, and each process's own median is reported too."""
  per_round = [float(statistic(b) / statistic(a)) for a, b in zip(times[arm], times[baseline])]
  result = {"median": float(statistics.median(per_round)), "rounds": per_round}
  if clusters is None:
    result["interval90"] = bootstrap_median(per_round)
    return result
  if len(clusters) != len(per_round):
    raise ValueError(f"{len(clusters)} clusters for {len(per_round)} rounds")
  result["interval90"] = cluster_bootstrap_median(per_round, clusters)
  result["process_medians"] = [float(statistics.median(group))
                               for group in _by_cluster(per_round, clusters)]
  return result


def describe(times: Times) -> Dict[str, Dict[str, float]]:
  """Per arm over all rounds: step time median, p90 and max (ms), steps counted, steps/s."""
  out = {}
  for name, rounds in times.items():
    every = np.asarray([t for r in rounds for t in r], np.float64)
    out[name] = {"median_ms": 1e3 * float(np.median(every)), "mean_ms": 1e3 * float(every.mean()),
                 "p90_ms": 1e3 * float(np.percentile(every, 90)),
                 "max_ms": 1e3 * float(every.max()), "steps": int(every.size),
                 "steps_per_sec": 1.0 / float(np.median(every))}
  return out
