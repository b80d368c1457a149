"""Runs a benchmark suite: its arms through the launcher, per-run curves, summary.json with goals.

A suite is a gin file (``benchmarks/suites/<name>.gin``) binding ``bench.Suite``: a list of
``bench.Arm``s, each a gin config of the trainer (files + bindings) run for a number of seeds
through ``launcher.launch``, exactly as a user would. Besides trained arms there are arms computed
from other arms' runs: ``ensemble`` (average of the predictions of ``ensemble_size`` seeds of
``source_arm``) and ``offline_distill`` (a student that distills from ``source_arm``'s trained
model, published once into the exchange as a frozen peer: classic two-phase distillation).

Each run leaves, under ``results_dir/<suite>/runs/<arm>/``, one JSON-lines curve per group
(``seed_<s>_group_<g>.jsonl``: step, wall time, train and validation loss, AUC, examples/sec,
teacher staleness) and its ``results.json`` (``seed_<s>_group_<g>.json``). An arm whose files
are all there is reused unless ``force``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import glob
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from benchmarks import machine
from benchmarks import protocol
from tf_codistill import layout
from tf_codistill import metrics
from tf_codistill.exchange import directory as exchange
from tf_codistill.launch import demo
from tf_codistill.launch import gin_config as config
from tf_codistill.launch import launcher

T = TypeVar("T")
ARM_KINDS = ("train", "ensemble", "offline_distill")
DATA_KINDS = ("criteo_like", "adult", "kjv", "fashion_mnist", "debian_english", "debian_kernel")
# The Debian corpora (data_pipelines.debian_text): how each is built. GCIDE holds 3 lines of
# cp1252 among 1.2M (their pages are skipped and counted); a quarter of the kernel's C files
# (by a hash of their paths) is more text than any arm reads.
CORPUS_MANIFEST = "corpus_manifest.json"  # in a corpus suite's results: the corpus its runs read
CORPORA = {"debian_english": ("english", {"bad_lines": "skip"}),
           "debian_kernel": ("kernel", {"bad_lines": "skip", "sample_fraction": 0.25})}
LOSS_KEY = "val_logloss"  # the default Suite.loss_key (CTR)
TARGET_RULES = ("final", "best_sync")
TUNING_DIR = "tuning"  # results_dir/runs/tuning/<config digest>/lr_<value>/: tuning runs
OPS = {"<=": lambda a, b: a <= b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b,
       ">": lambda a, b: a > b}


@gin.configurable(module="bench")
@dataclasses.dataclass(frozen=True)
class Arm:
  """One configuration of a suite.

  Attributes:
    name: identifier (directory and table name).
    gin_files: trainer gin files, relative to the repo's ``gin/`` directory or absolute.
    gin_bindings: extra bindings, after the suite's ``common_bindings``.
    num_groups: codistillation groups in one run (1: no peers).
    seeds: independent runs (``trainer.train.seed`` = 0..seeds-1).
    strategy, workers_per_group, ps_per_group: each group's cluster (launcher.GroupShape).
    kind: ``train``, ``ensemble`` or ``offline_distill``.
    source_arm: the trained arm an ``ensemble``/``offline_distill`` arm is built from.
    ensemble_size: models per ensemble (disjoint seeds of ``source_arm``).
    label: one line for the report.
    tune_learning_rate: pick ``trainer.train.learning_rate`` from the suite's
      ``learning_rates`` first (one run per value at ``Suite.tuning_seed``; the lowest best
      validation loss wins), then run ``seeds`` seeds at it.
    seed_offset: the first seed (tuning runs use the suite's ``tuning_seed``).
    learning_rate_from: run at the learning rate tuning chose for that (earlier) arm, untuned
      (a diagnostic arm that must match its baseline, e.g. codistillation with alpha = 0).
  """
  name: str
  gin_files: Sequence[str] = ("criteo/baseline.gin",)
  gin_bindings: Sequence[str] = ()
  num_groups: int = 1
  seeds: int = 1
  strategy: str = "one_device"
  workers_per_group: int = 0
  ps_per_group: int = 0
  kind: str = "train"
  source_arm: Optional[str] = None
  ensemble_size: int = 2
  label: str = ""
  tune_learning_rate: bool = False
  seed_offset: int = 0
  learning_rate_from: Optional[str] = None

  @property
  def seed_list(self) -> range:
    return range(self.seed_offset, self.seed_offset + self.seeds)

  def __post_init__(self):
    if self.kind not in ARM_KINDS:
      raise ValueError(f"arm {self.name!r}: kind={self.kind!r} is not one of {ARM_KINDS}")
    if self.kind != "train" and not self.source_arm:
      raise ValueError(f"arm {self.name!r}: kind={self.kind!r} needs source_arm")
    if self.seeds < 1:
      raise ValueError(f"arm {self.name!r}: seeds={self.seeds} must be >= 1")


@gin.configurable(module="bench")
@dataclasses.dataclass(frozen=True)
class Suite:
  """A benchmark suite: arms, shared bindings, data, target loss and goal figures.

  Attributes:
    name: the suite's name (results go to ``results_dir/<name>``).
    arms: the arms, run in order (a source arm must come before the arms built from it).
    description: what claim the suite reproduces, for the report.
    common_bindings: bindings every trained arm gets (sizes, steps, eval cadence).
    data: ``criteo_like`` (generated Criteo-format TSV), ``adult`` (the UCI Adult census data),
      ``kjv`` (the King James Bible for language modeling, ``vocab_size`` tokens) or
      ``fashion_mnist`` (Fashion-MNIST as ImageNet-style TFRecords), ``debian_english`` or
      ``debian_kernel`` (the Debian corpora of data_pipelines.debian_text, ``vocab_size``
      subword tokens; built under the data directory, see ``CORPORA``).
    loss_key: the results/curve key that is "validation loss" (targets, plots, goals), e.g.
      ``val_logloss`` (CTR) or ``val_loss`` (cross-entropy per example or token).
    output: ``sigmoid`` or ``softmax``: how ensembles average and churn compares predictions.
    train_rows, eval_rows: sizes of the generated data.
    target_loss: validation log loss that "steps to target" counts to; or
    target_from_arm: the target is that arm's final validation loss (mean over seeds and groups)
      plus ``target_margin``.
    goals: name -> goal function (``steps_ratio``, ``churn_reduction``, ``loss_minus_best``).
    goal_thresholds: name -> (op, number) or (op, number, bound), op one of <=, <, >=, >: what
      the report calls met (with a bound, the goal's 90% interval must lie beyond it too).
    threads_per_group: intra-op threads of each group's process (each group gets its share of
      the machine's cores, as it would get its own machines).
    simulated: a note when an arm simulates a cluster (e.g. a larger batch on one process).
    learning_rates: the learning-rate grid every ``tune_learning_rate`` arm is tuned over (the
      same grid for baselines and codistillation).
    tuning_seed: the seed of tuning runs (apart from the reported seeds 0..seeds-1).
    extend_grid: how many times a tuned arm's grid grows by the double of its largest rate when
      that rate wins (the optimum at the grid's edge; the same rule for every tuned arm).
    tune_ahead: each round of a tuned arm's grid also runs the rate the grid would grow by
      (while ``extend_grid`` allows), at once on a CPU that is free, so that a grown grid does
      not wait for the round before it. The choice is the same (a rate the grid never grew to
      is recorded but not in the grid); it costs a run when the largest rate loses.
    scaling_arm, scaling_batches: a synchronous arm run (tuned) at each global batch; the batch
      where doubling stops cutting steps to a common target by ``scaling_min_cut`` is B*, and
      every arm's bindings get ``{B*}`` and ``{2B*}`` replaced by it and its double.
    target_rule: ``final`` (``target_loss``/``target_from_arm``) or ``best_sync``: the lowest
      minimum of the seed-mean validation curves of ``sync_arms`` (protocol.target).
    prediction_history: runs keep eval predictions at every evaluation, so churn can be
      compared at matched validation loss (churn.json ``curves``).
    b_star: B* given rather than found (a suite without a scaling phase that takes another
      suite's): ``{B*}`` and ``{2B*}`` in the arms' bindings become it and its double.
    debs_dir: a folder holding a Debian corpus's ``.deb`` files (default: ``apt-get download``
      them while the corpus is built). Where the suite's results hold ``corpus_manifest.json``
      (runs are recorded), the corpus is built from exactly the package versions it records.
    eval_pattern: a Debian corpus's validation shards (a glob in its ``tokens/``), e.g. one of
      them, so that evaluation costs a fixed, small share of the step budget.
    pin_runs: every group gets a CPU of its own (machine.CpuPool), and runs that need fewer
      CPUs than the machine has (tuning runs, seeds of a single-group arm) go on at once, each
      on its own CPUs. Only for suites whose figures count steps, not seconds.
    tensorflow: the TensorFlow version every run must use (a suite whose recorded runs were taken
      on one version keeps it when the default install moves on); run_suite refuses another.
  """
  name: str
  arms: Sequence[Arm]
  description: str = ""
  common_bindings: Sequence[str] = ()
  data: str = "criteo_like"
  train_rows: int = 1_000_000
  eval_rows: int = 20_000
  vocab_size: int = 8000
  loss_key: str = LOSS_KEY
  output: str = "sigmoid"
  target_loss: Optional[float] = None
  target_from_arm: Optional[str] = None
  target_margin: float = 0.0
  goals: Mapping[str, Callable[..., Tuple[Optional[float], List[float]]]] = \
      dataclasses.field(default_factory=dict)
  goal_thresholds: Mapping[str, Sequence] = dataclasses.field(default_factory=dict)
  threads_per_group: int = 1
  simulated: str = ""
  learning_rates: Sequence[float] = ()
  tuning_seed: int = 100
  scaling_arm: Optional[Arm] = None
  scaling_batches: Sequence[int] = ()
  scaling_min_cut: float = 0.15
  target_rule: str = "final"
  sync_arms: Sequence[str] = ()
  prediction_history: bool = False
  pin_runs: bool = False
  eval_pattern: str = "eval-*"
  b_star: Optional[int] = None
  extend_grid: int = 0
  tune_ahead: bool = False
  debs_dir: Optional[str] = None
  tensorflow: Optional[str] = None

  def __post_init__(self):
    if self.data not in DATA_KINDS:
      raise ValueError(f"suite {self.name!r}: data={self.data!r} is not one of {DATA_KINDS}")
    if self.output not in metrics.losses.OUTPUTS:
      raise ValueError(f"suite {self.name!r}: output={self.output!r} is not one of "
                       f"{metrics.losses.OUTPUTS}")
    names = [arm.name for arm in self.arms]
    if len(set(names)) != len(names):
      raise ValueError(f"suite {self.name!r}: arm names repeat: {names}")
    for i, arm in enumerate(self.arms):
      if arm.source_arm and arm.source_arm not in names[:i]:
        raise ValueError(f"suite {self.name!r}: arm {arm.name!r} needs source_arm "
                         f"{arm.source_arm!r} among the arms before it")
    if self.target_from_arm and self.target_from_arm not in names:
      raise ValueError(f"suite {self.name!r}: target_from_arm={self.target_from_arm!r} is not "
                       f"an arm")
    for goal, threshold in self.goal_thresholds.items():
      if goal not in self.goals:
        raise ValueError(f"suite {self.name!r}: goal_thresholds names unknown goal {goal!r}")
      if threshold[0] not in OPS or len(threshold) not in (2, 3):
        raise ValueError(f"suite {self.name!r}: goal_thresholds[{goal!r}]={threshold!r} is not "
                         f"(op, value) or (op, value, interval bound) with op in {list(OPS)}")
    if TUNING_DIR in names:
      raise ValueError(f"suite {self.name!r}: {TUNING_DIR!r} is reserved for tuning runs")
    tuned = [a.name for a in self.arms if a.tune_learning_rate]
    if (tuned or self.scaling_arm) and not self.learning_rates:
      raise ValueError(f"suite {self.name!r}: arms {tuned or ['scaling_arm']} tune the learning "
                       f"rate but learning_rates is empty")
    if self.b_star is not None and self.scaling_arm:
      raise ValueError(f"suite {self.name!r}: b_star is given and found (scaling_arm): bind one")
    if bool(self.scaling_arm) != bool(self.scaling_batches):
      raise ValueError(f"suite {self.name!r}: scaling_arm and scaling_batches go together")
    if self.target_rule not in TARGET_RULES:
      raise ValueError(f"suite {self.name!r}: target_rule={self.target_rule!r} is not one of "
                       f"{TARGET_RULES}")
    if self.target_rule == "best_sync" and not set(self.sync_arms) <= set(names) | {""}:
      raise ValueError(f"suite {self.name!r}: sync_arms {list(self.sync_arms)} are not all arms")
    if self.target_rule == "best_sync" and not self.sync_arms:
      raise ValueError(f"suite {self.name!r}: target_rule='best_sync' needs sync_arms")


# ----------------------------------------------------------------------------------------------
# Goal figures. Each takes the arm summaries and returns (value, per-seed/pair values for spread).


def _stat(values: Sequence[Optional[float]]) -> Optional[Dict[str, float]]:
  values = [v for v in values if v is not None]
  if not values:
    return None
  return {"mean": float(np.mean(values)), "std": float(np.std(values)),
          "min": float(np.min(values)), "max": float(np.max(values)), "n": len(values)}


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


def bytes_sent_per_step(result: Mapping[str, Any]) -> Optional[float]:
  """Bytes a group of a multi-group run sent its peers a step: its published versions' files and
  its averaging changes; None for one group, or a run recorded without the counts."""
  if int(result.get("num_groups") or 1) < 2 or not result.get("steps"):
    return None
  published = result.get("publish_bytes")
  if result.get("codistill") and published is None:
    return None
  rounds = result.get("averaging_rounds") or {}
  return ((published or 0) + rounds.get("bytes_sent", 0)) / result["steps"]


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
  return [protocol.pair_curve(c) for c in churn.get("curves", [])]


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


# ----------------------------------------------------------------------------------------------
# Running.


@dataclasses.dataclass
class RunPaths:
  """Where a suite's work (models, data) and results (committed files) go."""
  work_dir: str
  results_dir: str
  data_dir: str = ""  # shared by suites (generated data is reused); default work_dir/data

  def __post_init__(self):
    self.data_dir = self.data_dir or os.path.join(self.work_dir, "data")

  def run_dir(self, arm: str, seed: int) -> str:
    return os.path.join(self.work_dir, "runs", arm, f"seed_{seed}")

  def curve(self, arm: str, seed: int, group: int) -> str:
    return os.path.join(self.results_dir, "runs", arm, f"seed_{seed}_group_{group}.jsonl")

  def result(self, arm: str, seed: int, group: int) -> str:
    return os.path.join(self.results_dir, "runs", arm, f"seed_{seed}_group_{group}.json")

  def predictions(self, arm: str, seed: int, group: int) -> str:
    return layout.group_run(self.run_dir(arm, seed), group).eval_predictions

  @property
  def corpus_manifest(self) -> str:
    """The manifest of the corpus the recorded runs read (a Debian-corpus suite's)."""
    return os.path.join(self.results_dir, CORPUS_MANIFEST)


def gin_path(path: str) -> str:
  """A suite's gin file: as given when absolute, else under the repository's gin/."""
  return path if os.path.isabs(path) else os.path.join(config.REPO_GIN_DIR, path)


def corpus_manifest(suite: Suite, data_root: str, build: bool = True,
                    pinned_to: Optional[str] = None) -> Optional[dict]:
  """The manifest of a Debian-corpus suite's corpus (built under ``data_root`` unless there and
  ``build``, from the packages the manifest at ``pinned_to`` records, where that file exists);
  None for other data."""
  if suite.data not in CORPORA:
    return None
  from data_pipelines import corpus  # pylint: disable=g-import-not-at-top
  from data_pipelines import debian_text  # pylint: disable=g-import-not-at-top
  name, options = CORPORA[suite.data]
  data_dir = os.path.join(data_root, suite.data)
  if not build:
    return corpus.read_manifest(data_dir)
  recorded = None
  if pinned_to and os.path.exists(pinned_to):
    with open(pinned_to) as f:
      recorded = json.load(f)
  return corpus.build(data_dir, debian_text.CORPORA[name], vocab_size=suite.vocab_size,
                      debs_dir=suite.debs_dir, pinned_to=recorded, **options)


def data_bindings(suite: Suite, data_root: str, pinned_to: Optional[str] = None) -> List[str]:
  """Prepares the suite's data under ``data_root`` (reused when there; a corpus built from the
  packages the manifest at ``pinned_to`` records, where it exists) and binds its files."""
  if suite.data in CORPORA:
    corpus_manifest(suite, data_root, pinned_to=pinned_to)
    tokens = os.path.join(data_root, suite.data, "tokens")
    return [f"trainer.train.train_files = ['{tokens}/train-*']",
            f"trainer.train.eval_files = ['{tokens}/{suite.eval_pattern}']"]
  if suite.data in ("kjv", "fashion_mnist"):
    from data_pipelines import images  # pylint: disable=g-import-not-at-top
    from data_pipelines import text_lm  # pylint: disable=g-import-not-at-top
    data_dir = os.path.join(data_root, suite.data)
    if suite.data == "kjv":
      text_lm.prepare(data_dir, vocab_size=suite.vocab_size)
    else:
      images.convert_fashion_mnist(data_dir)
    return [f"trainer.train.train_files = ['{data_dir}/train-*']",
            f"trainer.train.eval_files = ['{data_dir}/eval-*']"]
  if suite.data == "adult":
    from data_pipelines import adult  # pylint: disable=g-import-not-at-top
    data_dir = os.path.join(data_root, "adult")
    adult.prepare(data_dir)
    return [f"trainer.train.train_files = ['{data_dir}/train-*']",
            f"trainer.train.eval_files = ['{data_dir}/eval-*']"]
  data_dir = os.path.join(data_root, f"criteo_like_{suite.train_rows}_{suite.eval_rows}")
  train, evaluation = demo.sample_data(data_dir, suite.train_rows, suite.eval_rows)
  return [f"trainer.train.train_files = {train!r}", f"trainer.train.eval_files = {evaluation!r}"]


# The Arm settings every configuration holds when recorded. A setting Arm gains later is
# recorded only where an arm sets it (off its default), so adding one leaves every recorded arm,
# and every tuning run's digest, as it was.
RECORDED_ARM_FIELDS = ("name", "gin_files", "gin_bindings", "num_groups", "seeds", "strategy",
                       "workers_per_group", "ps_per_group", "kind", "source_arm", "ensemble_size",
                       "tune_learning_rate", "seed_offset", "learning_rate_from")
# Settings the first recorded configurations predate: their absence there means their default.
_ADDED_AFTER_FIRST_RECORDS = ("tune_learning_rate", "seed_offset", "learning_rate_from")


def _arm_default(name: str) -> Any:
  field = next(f for f in dataclasses.fields(Arm) if f.name == name)
  value = field.default
  return list(value) if isinstance(value, tuple) else value


# Gin settings renamed after runs were recorded under their old names: new name -> old name.
# A recorded configuration is read under today's names, so a rename keeps every recorded run;
# tuning runs stay named by a digest of the old names. The exchange and teacher settings moved
# from trainer.train into tfc.Exchange and tfc.TeacherSpec after the first runs.
RECORDED_BINDING_NAMES: Dict[str, str] = {
    **{f"tfc.Exchange.{name}": f"trainer.train.{name}"
       for name in ("publish_every_steps", "keep_last", "poll_interval_s", "publish_format",
                    "wait_for_first_teachers_s", "teacher_graph", "averaging")},
    "tfc.TeacherSpec.precision": "trainer.train.teacher_precision",
}
# Whole bindings whose value changed with their name: new binding -> recorded binding.
RECORDED_BINDINGS: Dict[str, str] = {
    "trainer.train.exchange = @tfc.Exchange": "trainer.train.codistill = True",
    "trainer.train.exchange = None": "trainer.train.codistill = False",
}


# What an averaging binding recorded without codistillation (it averaged only) is today.
_AVERAGING_ONLY = ["trainer.train.exchange = @tfc.Exchange", "tfc.Exchange.distill = False"]


def _renamed(binding: str, names: Mapping[str, str], whole: Mapping[str, str]) -> str:
  if binding.strip() in whole:
    return whole[binding.strip()]
  name, sep, value = binding.partition("=")
  new = names.get(name.strip())
  return f"{new} ={value}" if sep and new else binding


def _as_recorded(bindings: Sequence[str]) -> List[str]:
  """``bindings`` ("name = value") as the first recorded configurations wrote them."""
  stripped = [b.strip() for b in bindings]
  if all(b in stripped for b in _AVERAGING_ONLY):
    bindings = [b for b in bindings if b.strip() not in _AVERAGING_ONLY]
  return [_renamed(b, RECORDED_BINDING_NAMES, RECORDED_BINDINGS) for b in bindings]


def _as_current(bindings: Sequence[str]) -> List[str]:
  """Recorded ``bindings`` under today's names (unchanged if they already are)."""
  names = {old: new for new, old in RECORDED_BINDING_NAMES.items()}
  whole = {old: new for new, old in RECORDED_BINDINGS.items()}
  current: List[str] = []
  for binding in bindings:
    if (binding.partition("=")[0].strip() == "trainer.train.averaging"
        and "trainer.train.codistill = True" not in [b.strip() for b in bindings]):
      current += _AVERAGING_ONLY
    current.append(_renamed(binding, names, whole))
  return current


def _bindings_as(config: dict, convert: Callable[[Sequence[str]], List[str]]) -> dict:
  """``config`` (an arm_config) with each of its lists of bindings ``convert``ed."""
  return {**config, "arm": {**config["arm"], "gin_bindings": convert(
      config["arm"]["gin_bindings"])}, "common_bindings": convert(config["common_bindings"]),
          "data": convert(config["data"])}


def arm_config(arm: Arm, suite: Suite, data: Sequence[str]) -> dict:
  """Everything that determines an arm's runs: reuse is only safe while this is unchanged."""
  fields = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(arm).items()
            if k != "label" and (k in RECORDED_ARM_FIELDS or v != _arm_default(k))}
  return {"arm": fields, "common_bindings": list(suite.common_bindings), "data": list(data),
          "threads_per_group": suite.threads_per_group}


def same_config(recorded: Optional[dict], config: dict) -> bool:
  """Whether runs recorded under ``recorded`` were made as ``config`` makes them: equal under
  today's binding names, but for Arm settings added after the record, which it holds at their
  defaults."""
  if recorded is None:
    return False

  def known(c: dict) -> dict:
    c = _bindings_as(c, _as_current)
    arm = {k: v for k, v in c["arm"].items()
           if not (k in _ADDED_AFTER_FIRST_RECORDS and v == _arm_default(k))}
    return {**c, "arm": arm}
  return known(recorded) == known(config)


def _config_path(arm: Arm, paths: RunPaths) -> str:
  return os.path.join(paths.results_dir, "runs", arm.name, "config.json")


def _recorded_config(arm: Arm, paths: RunPaths) -> Optional[dict]:
  try:
    with open(_config_path(arm, paths)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _seed_recorded(arm: Arm, paths: RunPaths, seed: int) -> bool:
  """Whether every group's result and curve of ``seed`` is in the results directory."""
  groups = arm.num_groups if arm.kind == "train" else 1
  return all(os.path.exists(paths.result(arm.name, seed, g))
             and os.path.exists(paths.curve(arm.name, seed, g)) for g in range(groups))


def _arm_done(arm: Arm, paths: RunPaths, config: dict) -> bool:
  """Whether every run of the arm is recorded, from the same configuration, with its churn."""
  return (same_config(_recorded_config(arm, paths), config)
          and all(_seed_recorded(arm, paths, s) for s in arm.seed_list)
          and (arm.seeds < 2 or _churn_complete(arm, _read_churn(arm, paths))))


def _seeds_to_run(arm: Arm, paths: RunPaths, config: dict) -> List[int]:
  """The seeds a (re)started arm must still run. Runs recorded under the same configuration are
  kept (a suite stopped mid-arm resumes seed by seed) where churn no longer needs them (their
  pair's churn is recorded) or still can use them (their predictions are in this work dir).
  Anything recorded under another configuration (or none) is stale, removed, and the
  configuration is recorded before the first run."""
  arm_dir = os.path.join(paths.results_dir, "runs", arm.name)
  if not same_config(_recorded_config(arm, paths), config):
    shutil.rmtree(arm_dir, ignore_errors=True)
    os.makedirs(arm_dir)
    machine.write_json(_config_path(arm, paths), config, indent=1)
  return [seed for seed in arm.seed_list
          if not (_seed_recorded(arm, paths, seed)
                  and (arm.seeds < 2 or os.path.exists(paths.predictions(arm.name, seed, 0))
                       or _pair_recorded(arm, paths, seed)))]


def _churn_path(arm: Arm, paths: RunPaths) -> str:
  return os.path.join(paths.results_dir, "runs", arm.name, "churn.json")


def _record_run(arm: Arm, suite: Suite, paths: RunPaths, seed: int, group: int, group_dir: str,
                load: Optional[dict] = None) -> dict:
  """Copies a finished group's results.json and progress curve into the results directory, with
  the machine's load before and after the run (``load``: from machine.settle)."""
  with open(layout.RunDir(group_dir).results) as f:
    results = json.load(f)
  results.pop("history", None)  # the curve below carries it, with steps and wall time
  # Wall times and examples/sec mean little without the machine's load while the run trained.
  results.update(load or {})
  results.update(_data_use(suite, paths, results))
  results["load_avg_1m_at_end"] = machine.load_1m()
  os.makedirs(os.path.dirname(paths.result(arm.name, seed, group)), exist_ok=True)
  keep = ("step", "wall_time_s", "loss", "task_loss", "distill_loss", "alpha", "teacher_staleness",
          "val_loss", "val_logloss", "val_auc", "val_xent", "val_accuracy", "val_perplexity",
          "examples_per_sec")
  with open(layout.RunDir(group_dir).progress) as f:
    records = [json.loads(line) for line in f if line.strip()]
  with open(paths.curve(arm.name, seed, group), "w") as f:
    for record in records:
      f.write(json.dumps({k: record[k] for k in keep if k in record}, sort_keys=True) + "\n")
  machine.write_json(paths.result(arm.name, seed, group), results, indent=1)
  return results


def _data_use(suite: Suite, paths: RunPaths, results: Mapping[str, object]) -> dict:
  """For a corpus suite: the tokens the group read (``train_targets``) against the training
  tokens of the shards it reads (``share_tokens``); ``repeated_tokens``, what it read twice."""
  manifest = corpus_manifest(suite, paths.data_dir, build=False)
  if manifest is None or results.get("train_targets") is None:
    return {}
  from data_pipelines import corpus  # pylint: disable=g-import-not-at-top
  groups = int(results.get("num_groups") or 1)
  share = (corpus.share_tokens(manifest, int(results["group"]), groups)
           if results.get("data_split") == "disjoint" and groups > 1
           else corpus.share_tokens(manifest))
  return {"share_tokens": share, "repeated_tokens": max(0, int(results["train_targets"]) - share),
          "corpus_fingerprint": corpus.fingerprint(manifest)}


def check_same_corpus(suite: Suite, paths: RunPaths) -> None:
  """Refuses to go on with a corpus other than the one the suite's recorded runs read (Debian
  updates a package, the build takes the new version): their figures would not be comparable."""
  manifest = corpus_manifest(suite, paths.data_dir, build=False)
  if manifest is None:
    return
  from data_pipelines import corpus  # pylint: disable=g-import-not-at-top
  now = corpus.fingerprint(manifest)
  for path in glob.glob(os.path.join(paths.results_dir, "runs", "**", "seed_*_group_*.json"),
                        recursive=True):
    with open(path) as f:
      recorded = json.load(f).get("corpus_fingerprint")
    if recorded not in (None, now):
      versions = ", ".join(f"{p['package']} {p['version']}" for p in manifest["packages"])
      raise ValueError(
          f"{path} was trained on corpus {recorded}, but {paths.data_dir}/{suite.data} is "
          f"{now} ({versions}): a package changed since. Remove {paths.data_dir}/{suite.data} "
          f"to rebuild it from the packages {CORPUS_MANIFEST} beside the runs records, or start "
          f"the suite over (--force)")


def _launch(arm: Arm, suite: Suite, paths: RunPaths, seed: int, data: Sequence[str], *,
            exchange_dir: Optional[str] = None, extra: Sequence[str] = (),
            num_groups: Optional[int] = None, groups: Optional[Sequence[int]] = None,
            pin: bool = False) -> Dict[int, str]:
  """Trains one seed of ``arm`` (its groups, or ``groups`` of ``num_groups``); ``pin``: each group
  on its own share of the CPUs this thread may use (machine.CpuPool.take)."""
  model_dir = paths.run_dir(arm.name, seed)
  shutil.rmtree(model_dir, ignore_errors=True)
  threads = ([f"trainer.train.intra_op_threads = {suite.threads_per_group}",
              f"trainer.train.inter_op_threads = {suite.threads_per_group}"]
             if suite.threads_per_group else [])
  bindings = (list(suite.common_bindings) + list(arm.gin_bindings) + list(data) + list(extra)
              + [f"trainer.train.seed = {seed}", "trainer.train.save_eval_predictions = True",
                 f"trainer.train.prediction_history = {suite.prediction_history}",
                 "trainer.train.verbose = 0"] + threads)
  shape = launcher.GroupShape(arm.strategy, arm.workers_per_group, arm.ps_per_group)
  return launcher.launch(model_dir, num_groups or arm.num_groups, exchange_dir=exchange_dir,
                         gin_files=[gin_path(p) for p in arm.gin_files], gin_bindings=bindings,
                         shape=shape, groups=groups, pin_groups=pin,
                         # A run restarted from a checkpoint is not the run its curve claims.
                         max_restarts=0)


# ----------------------------------------------------------------------------------------------
# The protocol: learning-rate tuning and synchronous scaling (B*), resolved before an arm runs.

RunFn = Callable[[Sequence[Arm]], object]  # runs (or reuses) arms' seeds, in order or at once


def _with(arm: Arm, bindings: Sequence[str], **changes) -> Arm:
  return dataclasses.replace(arm, gin_bindings=list(arm.gin_bindings) + list(bindings), **changes)


def _tuning_arms(arm: Arm, suite: Suite, data: Sequence[str],
                 rates: Optional[Sequence[float]] = None) -> Dict[float, Arm]:
  """One single-seed arm per learning rate of the grid (``rates``, default the suite's), named by
  a digest of everything else that defines the arm, so equal configurations (a scaling batch and
  an arm at B*) share them."""
  config = arm_config(dataclasses.replace(arm, name="", seeds=1, tune_learning_rate=False,
                                          seed_offset=0), suite, data)
  digest = hashlib.sha256(json.dumps(_bindings_as(config, _as_recorded),
                                    sort_keys=True).encode()).hexdigest()[:12]
  return {lr: _with(arm, [f"trainer.train.learning_rate = {lr!r}"],
                    name=f"{TUNING_DIR}/{digest}/lr_{lr:g}", seeds=1, tune_learning_rate=False,
                    seed_offset=suite.tuning_seed, label=f"tuning {arm.name} at lr {lr:g}")
          for lr in (suite.learning_rates if rates is None else rates)}


def _next_rate(suite: Suite, rates: Sequence[float], chosen: float) -> Optional[float]:
  """The rate the grid grows by when its largest won (``Suite.extend_grid`` times at most)."""
  if chosen != max(rates) or len(rates) - len(suite.learning_rates) >= suite.extend_grid:
    return None
  return 2 * max(rates)


def recorded_curves(arm: Arm, paths: RunPaths, key: str) -> Dict[int, protocol.Curve]:
  """{seed: the seed's validation curve (mean over its groups)} from the recorded runs."""
  groups = arm.num_groups if arm.kind == "train" else 1
  return protocol.grouped({
      (s, g): protocol.curve_points(read_curve(paths.curve(arm.name, s, g)), key)
      for s in arm.seed_list for g in range(groups)})


def _grid_losses(arm: Arm, suite: Suite, paths: RunPaths, data: Sequence[str],
                 rates: Sequence[float]) -> Dict[float, dict]:
  """{rate: best validation loss, runs and curve} of the recorded tuning runs of ``rates``."""
  losses = {}
  for lr, tuning_arm in _tuning_arms(arm, suite, data, rates).items():
    if not os.path.exists(paths.curve(tuning_arm.name, suite.tuning_seed, 0)):
      raise FileNotFoundError(f"arm {arm.name!r}: tuning run {tuning_arm.name} is not recorded "
                              f"in {paths.results_dir}: run the suite")
    curve = recorded_curves(tuning_arm, paths, suite.loss_key)[suite.tuning_seed]
    losses[lr] = {"best_val_loss": protocol.best_loss(curve), "runs": tuning_arm.name,
                  "curve": curve}
  return losses


def tune(arm: Arm, suite: Suite, paths: RunPaths, data: Sequence[str],
         run: Optional[RunFn] = None) -> Tuple[Arm, dict]:
  """The arm at the grid's learning rate whose tuning run reached the lowest best validation
  loss, and the record of the choice; while the grid's largest rate wins, the grid grows by its
  double (``Suite.extend_grid`` times at most; ``Suite.tune_ahead`` runs that double beside each
  round). ``run`` runs tuning runs that are missing;
  without it they must be recorded already (a report from committed runs)."""
  rates = list(suite.learning_rates)
  while True:
    if run is not None:
      ahead = _next_rate(suite, rates, max(rates)) if suite.tune_ahead else None
      run(list(_tuning_arms(arm, suite, data, rates + ([ahead] if ahead else [])).values()))
    losses = _grid_losses(arm, suite, paths, data, rates)
    chosen = min(losses, key=lambda lr: losses[lr]["best_val_loss"])
    grown = _next_rate(suite, rates, chosen)
    if grown is None:
      break
    rates.append(grown)
  return (_with(arm, [f"trainer.train.learning_rate = {chosen!r}"]),
          {"learning_rate": chosen,
           "grid": {f"{lr:g}": v["best_val_loss"] for lr, v in losses.items()},
           "tuning_runs": {f"{lr:g}": v["runs"] for lr, v in losses.items()},
           "chosen_curve": losses[chosen]["curve"]})


def scaling(suite: Suite, paths: RunPaths, data: Sequence[str],
            run: Optional[RunFn] = None) -> Optional[dict]:
  """The synchronous scaling phase: the scaling arm tuned at each batch, then B* (protocol.b_star)
  from the chosen learning rates' tuning curves."""
  if not suite.scaling_arm:
    return None
  batches, curves = {}, {}
  arms = {batch: _with(suite.scaling_arm, [f"trainer.train.batch_size = {batch}"],
                       name=f"{suite.scaling_arm.name}_b{batch}")
          for batch in suite.scaling_batches}
  if run is not None:  # pinned, each batch's grid grows on its own, its runs taking free CPUs
    _at_once(lambda arm: tune(arm, suite, paths, data, run), list(arms.values()),
             len(arms) if suite.pin_runs else 1)
  for batch, arm in arms.items():
    _, choice = tune(arm, suite, paths, data)
    curves[batch] = [choice.pop("chosen_curve")]
    batches[str(batch)] = choice
  found = protocol.b_star(curves, suite.scaling_min_cut)
  return {"batches": batches, **found}


def resolve(arm: Arm, suite: Suite, paths: RunPaths, data: Sequence[str], b_star: Optional[int],
            run: Optional[RunFn] = None) -> Tuple[Arm, Optional[dict]]:
  """The arm as it runs: ``{B*}``/``{2B*}`` replaced, the learning rate tuned."""
  if b_star is not None:
    arm = dataclasses.replace(arm, gin_bindings=[
        b.replace("{2B*}", str(2 * b_star)).replace("{B*}", str(b_star)) for b in arm.gin_bindings])
  elif any("B*}" in b for b in arm.gin_bindings):
    raise ValueError(f"arm {arm.name!r} binds {{B*}} but the suite has no scaling phase")
  if not arm.tune_learning_rate or arm.kind == "ensemble":
    return arm, None
  tuned, choice = tune(arm, suite, paths, data, run)
  choice.pop("chosen_curve")
  return tuned, choice


def _cpus_needed(arm: Arm) -> int:
  """CPUs one seed of ``arm`` takes when runs are pinned: one per process of each group it
  trains (one for a single-process group, one per task of a group's cluster)."""
  shape = launcher.GroupShape(arm.strategy, arm.workers_per_group, arm.ps_per_group)
  processes = len(shape.tasks()) if shape.is_cluster else 1
  return {"train": arm.num_groups * processes, "offline_distill": 1}.get(arm.kind, 0)


def _at_once(fn: Callable[[T], object], items: Sequence[T], workers: int) -> None:
  """``fn`` on every item, ``workers`` at a time (1: in order). An error (or Ctrl-C) starts no
  further item; those in flight finish, then it is raised."""
  if workers <= 1 or len(items) <= 1:
    for item in items:
      fn(item)
    return
  pool = concurrent.futures.ThreadPoolExecutor(workers)
  try:
    for future in [pool.submit(fn, item) for item in items]:
      future.result()
  finally:  # on an error or Ctrl-C: no new runs; those in flight end by themselves
    pool.shutdown(wait=True, cancel_futures=True)


def run_arm(arm: Arm, suite: Suite, paths: RunPaths, data: Sequence[str], force: bool = False,
            progress: Callable[[str], None] = print, allow_load: bool = False,
            cpus: Optional[machine.CpuPool] = None) -> bool:
  """Runs every seed of ``arm`` (or reuses the recorded runs) and records them, with churn.

  Before each training run the machine must be quiet (machine.settle: the 1-minute load at most
  the number of cores, or ``allow_load``, and then the run is marked). With ``cpus`` every group
  runs pinned to a CPU of its own, and seeds go on at once while CPUs are free. Returns whether
  it ran (False: reused).
  """
  config = arm_config(arm, suite, data)
  if not force and _arm_done(arm, paths, config):
    progress(f"[{suite.name}] {arm.name}: reusing {arm.seeds} recorded run(s) (--force reruns)")
    return False
  if force:
    shutil.rmtree(os.path.join(paths.results_dir, "runs", arm.name), ignore_errors=True)
  seeds = _seeds_to_run(arm, paths, config)
  if len(seeds) < arm.seeds:
    progress(f"[{suite.name}] {arm.name}: reusing {arm.seeds - len(seeds)} recorded run(s), "
             f"running seeds {seeds}")
  needed = _cpus_needed(arm)
  workers = cpus.size // needed if cpus and needed else 1
  recording = threading.Lock()

  def run_seed(seed: int) -> None:
    _run_seed(arm, suite, paths, data, seed, allow_load, progress, cpus)
    with recording:  # each pair's churn as soon as both runs are there
      _churn(arm, paths, suite)

  _at_once(run_seed, seeds, workers)
  churn = _churn(arm, paths, suite)
  if churn:
    progress(f"[{suite.name}] {arm.name}: churn mean |pa-pb| {churn['mean_abs_diff']['mean']:.5f} "
             f"over {len(churn['pairs'])} pairs of seeds")
  return True


def _run_seed(arm: Arm, suite: Suite, paths: RunPaths, data: Sequence[str], seed: int,
              allow_load: bool, progress: Callable[[str], None],
              cpus: Optional[machine.CpuPool]) -> None:
  """Trains (or computes) one seed of ``arm`` and records it, on CPUs of its own from ``cpus``."""
  start = time.time()
  if arm.kind == "ensemble":
    results = [_ensemble(arm, suite, paths, seed, data, cpus)]
  else:
    if cpus is not None and cpus.in_use():
      # A sibling run of this suite, pinned to the other CPUs, is the load now (its tf.data and
      # runtime threads count too, so the load can exceed the cores it is pinned to): the machine
      # was judged quiet when the suite started and is judged again whenever a run starts alone.
      load, above = machine.load_1m(), False
    else:
      load, above = machine.settle(allow_load, what=f"{suite.name}/{arm.name} seed {seed}",
                                   log=progress)
    load = {"load_avg_1m_before": load, "started_above_nproc_load": above,
            "cpu_model": machine.cpu_model(),
            "beside_sibling_run": cpus is not None and cpus.in_use()}
    with cpus.take(_cpus_needed(arm)) if cpus else contextlib.nullcontext():
      if arm.kind == "train":
        dirs = _launch(arm, suite, paths, seed, data, pin=cpus is not None)
        results = [_record_run(arm, suite, paths, seed, g, dirs[g], load) for g in sorted(dirs)]
      else:
        results = [_offline_distill(arm, suite, paths, seed, data, load, pin=cpus is not None)]
  summary = ", ".join(f"group {r.get('group', 0)} {suite.loss_key} {r[suite.loss_key]:.4f}"
                      for r in results)
  progress(f"[{suite.name}] {arm.name} seed {seed} ({seed - arm.seed_offset + 1}/{arm.seeds}): "
           f"{summary} ({time.time() - start:.0f}s)")


def _offline_distill(arm: Arm, suite: Suite, paths: RunPaths, seed: int,
                     data: Sequence[str], load: Optional[dict] = None, pin: bool = False) -> dict:
  """Two-phase distillation: group 0 of a 2-group job trains; group 1 is the source arm's trained
  model of the same seed (a tuning seed: the source's first seed), published once into the
  exchange as a frozen teacher. A teacher not in the work dir (a fresh machine) is trained again
  from its recorded configuration, on the CPU this run holds (``teacher_run``: its curve's
  difference from the recorded run's)."""
  source = _recorded_arm(arm, paths)
  teacher_seed = seed if seed in source.seed_list else source.seed_offset
  teacher_export = layout.group_run(paths.run_dir(source.name, teacher_seed), 0).export
  trained_now = not tf.io.gfile.exists(teacher_export)
  if trained_now:
    _launch(source, suite, paths, teacher_seed, data, pin=pin)
  load = {**(load or {}), "teacher_run": {
      **_curve_difference(source, suite, paths, teacher_seed), "trained_now": trained_now}}
  exchange_dir = paths.run_dir(arm.name, seed) + "_exchange"
  shutil.rmtree(exchange_dir, ignore_errors=True)
  with open(paths.result(arm.source_arm, teacher_seed, 0)) as f:
    teacher_steps = json.load(f)["steps"]
  exchange.publish_saved_model(teacher_export, exchange_dir, group=1, step=teacher_steps)
  dirs = _launch(arm, suite, paths, seed, data, exchange_dir=exchange_dir,
                 extra=["trainer.train.exchange = @tfc.Exchange"], num_groups=2, groups=[0],
                 pin=pin)
  return _record_run(arm, suite, paths, seed, 0, dirs[0], load)


def _ensemble(arm: Arm, suite: Suite, paths: RunPaths, seed: int, data: Sequence[str],
              cpus: Optional[machine.CpuPool]) -> dict:
  """Scores the ensemble of ``ensemble_size`` consecutive seeds of the source arm (the mean of
  their group-0 models' probabilities) and each member, in one pass over the whole evaluation
  set (tf-codistill-evaluate), so that the ensemble's gain counts the same examples."""
  members = list(range(seed * arm.ensemble_size, (seed + 1) * arm.ensemble_size))
  source = _recorded_arm(arm, paths)
  missing = [m for m in members
             if not os.path.exists(layout.group_run(paths.run_dir(source.name, m), 0).export)]
  _at_once(lambda m: _regenerate(source, suite, paths, m, data, cpus), missing,
           cpus.size if cpus else 1)
  regenerated = [{**_curve_difference(source, suite, paths, m), "trained_now": m in missing}
                 for m in members]
  out_dir = paths.run_dir(arm.name, seed)
  os.makedirs(out_dir, exist_ok=True)
  scored = os.path.join(out_dir, "scores.json")
  bindings = list(suite.common_bindings) + list(source.gin_bindings) + list(data)
  command = ([sys.executable, "-m", "tf_codistill.bin.evaluate", f"--json_out={scored}",
              f"--predictions_out={paths.predictions(arm.name, seed, 0)}"]
             + [f"--gin_file={gin_path(f)}" for f in source.gin_files]
             + [f"--gin_bindings={b}" for b in bindings]
             + [f"--saved_model={layout.group_run(paths.run_dir(source.name, m), 0).export}"
                for m in members])
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"arm {arm.name!r} seed {seed}: tf-codistill-evaluate failed: "
                       f"{done.stderr[-2000:]}")
  with open(scored) as f:
    scores = json.load(f)
  key = "val_xent" if suite.output == "softmax" else "val_logloss"
  member_results = []
  for member in members:
    with open(paths.result(source.name, member, 0)) as f:
      member_results.append(json.load(f))
  member_losses = [m[key] for m in scores["members"]]
  result = {"group": 0, "members": members, **scores["ensemble"],
            suite.loss_key: scores["ensemble"][key], "member_losses": member_losses,
            "ensemble_gain": float(np.mean(member_losses)) - scores["ensemble"][key],
            "examples": scores["examples"], "member_runs": regenerated,
            "steps": member_results[0]["steps"],
            "wall_time_s": sum(r["wall_time_s"] for r in member_results),
            "examples_per_sec": None}
  machine.write_json(paths.result(arm.name, seed, 0), result, indent=1)
  with open(paths.curve(arm.name, seed, 0), "w") as f:
    f.write(json.dumps({"step": result["steps"], "wall_time_s": result["wall_time_s"],
                        **scores["ensemble"], suite.loss_key: result[suite.loss_key]}) + "\n")
  return result


def _recorded_arm(arm: Arm, paths: RunPaths) -> Arm:
  """The source arm of ``arm`` as its runs were recorded (tuned rate and B* substituted)."""
  recorded = _recorded_config(dataclasses.replace(arm, name=arm.source_arm), paths)
  if recorded is None:
    raise FileNotFoundError(f"arm {arm.name!r}: arm {arm.source_arm!r} has no recorded runs in "
                            f"{paths.results_dir}: run it first")
  return Arm(**{**recorded["arm"],
                 "gin_bindings": _as_current(recorded["arm"]["gin_bindings"])})


def _regenerate(source: Arm, suite: Suite, paths: RunPaths, seed: int, data: Sequence[str],
                cpus: Optional[machine.CpuPool]) -> None:
  """Trains a recorded seed of ``source`` again for its models (a work dir of another machine or
  session held them), leaving its record as it is."""
  with cpus.take(_cpus_needed(source)) if cpus else contextlib.nullcontext():
    _launch(source, suite, paths, seed, data, pin=cpus is not None)


def _curve_difference(source: Arm, suite: Suite, paths: RunPaths, seed: int) -> dict:
  """How far the validation curve of the run in the work dir (the model an ensemble uses) is
  from the recorded run's: 0 for the recorded run itself, or where training is deterministic."""
  recorded = dict(protocol.curve_points(read_curve(paths.curve(source.name, seed, 0)),
                                        suite.loss_key))
  progress = layout.group_run(paths.run_dir(source.name, seed), 0).progress
  here = dict(protocol.curve_points(read_curve(progress), suite.loss_key))
  steps = sorted(set(recorded) & set(here))
  return {"seed": seed, "steps_compared": len(steps),
          "max_abs_loss_diff": max((abs(recorded[s] - here[s]) for s in steps), default=None)}


def _independent_pairs(arm: Arm) -> List[Tuple[int, int]]:
  """The disjoint pairs of the arm's seeds (0-1, 2-3, ...): independent retrains."""
  seeds = list(arm.seed_list)
  return [(seeds[i], seeds[i + 1]) for i in range(0, len(seeds) - 1, 2)]


def _read_churn(arm: Arm, paths: RunPaths) -> dict:
  try:
    with open(_churn_path(arm, paths)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def _recorded_pairs(churn: Mapping[str, Any]) -> set:
  """The disjoint pairs ``churn`` holds with all they need (their curve, where runs keep a
  prediction history; a record written before pair curves holds them all in ``curves``)."""
  with_curve = {tuple(c["seeds"]) for c in churn.get("pair_curves", [])}
  return {tuple(p["seeds"]) for p in churn.get("independent", [])
          if not churn.get("expects_curves", False) or "curves" in churn
          or tuple(p["seeds"]) in with_curve}


def _churn_complete(arm: Arm, churn: Mapping[str, Any]) -> bool:
  """Whether ``churn`` holds every disjoint pair of the arm. An ensemble's churn is what its
  recorded seeds gave: never worth training its members again."""
  return arm.kind == "ensemble" or (bool(churn) and set(_independent_pairs(arm))
                                    <= _recorded_pairs(churn))


def _pair_recorded(arm: Arm, paths: RunPaths, seed: int) -> bool:
  """Whether churn no longer needs ``seed``'s predictions: its disjoint pair is recorded (with
  its curve, where kept), or it has none."""
  pair = next((p for p in _independent_pairs(arm) if seed in p), None)
  return (pair is None or arm.kind == "ensemble"
          or pair in _recorded_pairs(_read_churn(arm, paths)))


def _churn(arm: Arm, paths: RunPaths, suite: Suite) -> Optional[dict]:
  """Churn between independently retrained models of the arm (group 0 of each seed), recorded
  pair by pair while both runs' predictions are in the work dir, so that an arm whose seeds run
  in several sessions (on machines that keep no work dir) keeps what each measured: ``pairs``
  (every pair whose predictions were there together), the disjoint pairs (seeds 0-1, 2-3, ...:
  ``independent``) and, where runs kept their prediction history, each disjoint pair's churn
  at every evaluation with the pair's mean validation loss there (``pair_curves``; ``curves``,
  in pair order, once every pair has one). Returns the record once every disjoint pair is in
  it; None before."""
  if arm.seeds < 2:
    return None
  old = _read_churn(arm, paths)
  pairs = {tuple(p["seeds"]): p for p in old.get("pairs", [])}
  curves = {tuple(c["seeds"]): c["points"] for c in old.get("pair_curves", [])}
  present = [seed for seed in arm.seed_list if _seed_recorded(arm, paths, seed)
             and os.path.exists(paths.predictions(arm.name, seed, 0))]
  new = [pair for pair in itertools.combinations(present, 2) if pair not in pairs]
  preds = {}
  for seed in sorted({seed for pair in new for seed in pair}):
    with np.load(paths.predictions(arm.name, seed, 0)) as npz:
      preds[seed] = npz["probs"]
  for a, b in new:
    pairs[(a, b)] = {"seeds": [a, b], **metrics.churn(preds[a], preds[b], suite.output)}
  history = suite.prediction_history and arm.kind != "ensemble"  # ensembles keep final ones
  for pair in _independent_pairs(arm):
    if pair not in curves and set(pair) <= set(present) and history:
      points = _churn_curve(arm, paths, suite, pair)
      if points:
        curves[pair] = points
  ordered = [pairs[k] for k in sorted(pairs)]
  churn = {"pairs": ordered, "independent": [pairs[p] for p in _independent_pairs(arm)
                                             if p in pairs],
           "examples": int(next(iter(preds.values())).shape[0]) if preds else old.get("examples"),
           "expects_curves": bool(history),
           "pair_curves": [{"seeds": list(k), "points": v} for k, v in sorted(curves.items())],
           **{key: _stat([p[key] for p in ordered])
              for key in ("mean_abs_diff", "total_variation", "disagreement")}}
  if history and all(p in curves for p in _independent_pairs(arm)):
    churn["curves"] = [curves[p] for p in _independent_pairs(arm)]
  if ordered:
    machine.write_json(_churn_path(arm, paths), churn, indent=1)
  return churn if ordered and _churn_complete(arm, churn) else None


def _churn_curve(arm: Arm, paths: RunPaths, suite: Suite, seeds: Sequence[int]) -> List[dict]:
  """One pair's churn at each evaluation both runs kept predictions of (eval_predictions/)."""
  dirs = [layout.RunDir(os.path.dirname(paths.predictions(arm.name, s, 0))).prediction_history
          for s in seeds]
  if not all(os.path.isdir(d) for d in dirs):
    return []
  losses = [dict(protocol.curve_points(read_curve(paths.curve(arm.name, s, 0)), suite.loss_key))
            for s in seeds]
  points = []
  for name in sorted(set(os.listdir(dirs[0])) & set(os.listdir(dirs[1]))):
    step = int(name[len("step_"):-len(".npz")])
    if not all(step in seed_losses for seed_losses in losses):
      continue
    probs = []
    for d in dirs:
      with np.load(os.path.join(d, name)) as npz:
        probs.append(npz["probs"])
    points.append({"step": step,
                   "loss": float(np.mean([seed_losses[step] for seed_losses in losses])),
                   **metrics.churn(probs[0], probs[1], suite.output)})
  return sorted(points, key=lambda p: p["step"])


# ----------------------------------------------------------------------------------------------
# Summary.


def read_curve(path: str) -> List[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def first_reaching(curve: Sequence[dict], target: float, key: str = LOSS_KEY
                   ) -> Tuple[Optional[int], Optional[float]]:
  """(step, wall time) of the first evaluation at or below ``target``; (None, None) if none."""
  for record in curve:
    if key in record and record[key] <= target:
      return int(record["step"]), float(record["wall_time_s"])
  return None, None


def _runs(arm: Arm, paths: RunPaths) -> List[dict]:
  runs = []
  groups = arm.num_groups if arm.kind == "train" else 1
  for seed, group in itertools.product(arm.seed_list, range(groups)):
    with open(paths.result(arm.name, seed, group)) as f:
      result = json.load(f)
    runs.append({"seed": seed, "group": group, "result": result,
                 "curve": read_curve(paths.curve(arm.name, seed, group)),
                 "curve_file": os.path.relpath(paths.curve(arm.name, seed, group),
                                               paths.results_dir)})
  return runs


def _target(suite: Suite, paths: RunPaths, raw: Mapping[str, List[dict]]) -> Optional[float]:
  """The target loss steps are counted to, by the suite's target_rule."""
  if suite.target_rule == "best_sync":
    by_name = {a.name: a for a in suite.arms}
    return protocol.best_arm({n: list(recorded_curves(by_name[n], paths, suite.loss_key).values())
                              for n in suite.sync_arms})[1]
  if suite.target_from_arm:
    return float(np.mean([r["result"][suite.loss_key] for r in raw[suite.target_from_arm]])) \
        + suite.target_margin
  return suite.target_loss


def summarize(suite: Suite, paths: RunPaths, protocol_record: Optional[dict] = None) -> dict:
  """summary.json: per arm its config, per-run figures, aggregates; the target; the goals (with
  ``<goal>_interval`` where the goal gives one); the protocol's scaling and tuning record."""
  raw = {arm.name: _runs(arm, paths) for arm in suite.arms}
  target = _target(suite, paths, raw)
  arms = {}
  for arm in suite.arms:
    runs = []
    for run in raw[arm.name]:
      steps, wall = (first_reaching(run["curve"], target, suite.loss_key) if target is not None
                     else (None, None))
      result = run["result"]
      runs.append({"seed": run["seed"], "group": run["group"],
                   "final_val_loss": result[suite.loss_key], "final_val_auc": result.get("val_auc"),
                   "final_val_accuracy": result.get("val_accuracy"),
                   "final_val_perplexity": result.get("val_perplexity"),
                   "steps": result["steps"], "wall_time_s": result["wall_time_s"],
                   "examples_per_sec": result.get("examples_per_sec"),
                   "load_avg_1m_before": result.get("load_avg_1m_before"),
                   "load_avg_1m_at_end": result.get("load_avg_1m_at_end"),
                   "started_above_nproc_load": result.get("started_above_nproc_load"),
                   "cpu_model": result.get("cpu_model"),
                   "best_val_loss": protocol.best_loss(
                       protocol.curve_points(run["curve"], suite.loss_key)),
                   "steps_to_target": steps, "wall_time_to_target_s": wall,
                   "train_targets": result.get("train_targets"),
                   "share_tokens": result.get("share_tokens"),
                   "repeated_tokens": result.get("repeated_tokens"),
                   "bytes_sent_per_step": bytes_sent_per_step(result),
                   "trainable_parameter_bytes": result.get("trainable_parameter_bytes"),
                   "member_losses": result.get("member_losses"),
                   "ensemble_gain": result.get("ensemble_gain"),
                   "curve": run["curve_file"]})
    churn_path = os.path.join(paths.results_dir, "runs", arm.name, "churn.json")
    churn = None
    if os.path.exists(churn_path):
      with open(churn_path) as f:
        churn = json.load(f)
    arms[arm.name] = {
        "config": {k: v if not isinstance(v, tuple) else list(v)
                   for k, v in dataclasses.asdict(arm).items()},
        "seeds": arm.seeds,
        "runs": runs,
        "final_val_loss": _stat([r["final_val_loss"] for r in runs]),
        "final_val_auc": _stat([r["final_val_auc"] for r in runs]),
        "final_val_accuracy": _stat([r["final_val_accuracy"] for r in runs]),
        "final_val_perplexity": _stat([r["final_val_perplexity"] for r in runs]),
        "steps_to_target": _stat([r["steps_to_target"] for r in runs]),
        "reached_target": sum(r["steps_to_target"] is not None for r in runs),
        "wall_time_to_target_s": _stat([r["wall_time_to_target_s"] for r in runs]),
        "wall_time_s": _stat([r["wall_time_s"] for r in runs]),
        "examples_per_sec": _stat([r["examples_per_sec"] for r in runs]),
        "load_avg_1m_before": _stat([r["load_avg_1m_before"] for r in runs]),
        "load_avg_1m_at_end": _stat([r["load_avg_1m_at_end"] for r in runs]),
        "started_above_nproc_load": sum(bool(r["started_above_nproc_load"]) for r in runs),
        "best_val_loss": _stat([r["best_val_loss"] for r in runs]),
        "bytes_sent_per_step": _stat([r["bytes_sent_per_step"] for r in runs]),
        "ensemble_gain": _stat([r["ensemble_gain"] for r in runs]),
        "repeated_tokens": (None if any(r["repeated_tokens"] is None for r in runs)
                            else sum(r["repeated_tokens"] for r in runs)),
        "seed_curves": {str(seed): curve for seed, curve in
                        recorded_curves(arm, paths, suite.loss_key).items()},
        "group_curves": {f"{r['seed']}_{r['group']}": protocol.curve_points(r["curve"],
                                                                           suite.loss_key)
                         for r in raw[arm.name]},
        "group_staleness": {f"{r['seed']}_{r['group']}": protocol.curve_points(
            [c for c in r["curve"] if (c.get("alpha") or 0) > 0], "teacher_staleness")
                            for r in raw[arm.name]},
        "churn": churn,
    }
  goals, spreads = {}, {}
  for name, goal in suite.goals.items():
    value, per, *interval = goal(arms)
    goals[name] = value
    spreads[name] = _stat(per)
    if interval:
      goals[f"{name}_interval"] = interval[0]
  return {"suite": suite.name, "description": suite.description, "data": suite.data,
          "loss_key": suite.loss_key, "output": suite.output,
          "common_bindings": list(suite.common_bindings), "simulated": suite.simulated,
          "target_loss": target, "target_from_arm": suite.target_from_arm,
          "target_rule": suite.target_rule, "sync_arms": list(suite.sync_arms),
          "protocol": protocol_record, "arms": arms, "goals": goals, "goal_spreads": spreads,
          "goal_verdicts": verdicts(goals, suite.goal_thresholds),
          "churn_at_matched_loss": protocol.churn_at_matched_loss(
              {n: (a.get("churn") or {}).get("curves", []) for n, a in arms.items()})}


def verdicts(goals: Mapping[str, Optional[float]], thresholds: Mapping[str, Sequence]
             ) -> Dict[str, dict]:
  """Per goal with a threshold ``(op, value)`` or ``(op, value, bound)``: met when the value
  passes and, with a bound, its whole ``<goal>_interval`` lies beyond the bound (below it for
  ``<``/``<=``, above for ``>``/``>=``). A goal whose value (or needed interval) is missing, a
  target never reached, churn not measured, is missed, never left blank."""
  out = {}
  for name, (op, threshold, *bound) in thresholds.items():
    value, interval = goals.get(name), goals.get(f"{name}_interval")
    met = value is not None and OPS[op](value, threshold)
    if bound:
      below = op.startswith("<")
      end = (interval or [None, None])[1 if below else 0]
      met = met and end is not None and (end < bound[0] if below else end > bound[0])
    out[name] = {"threshold": [op, threshold, *bound], "met": bool(met),
                 "missing": value is None or (bool(bound) and not interval)}
  return out


def prepare(suite: Suite, paths: RunPaths, data: Sequence[str],
            run: Optional[RunFn] = None, only: Optional[Sequence[str]] = None
            ) -> Tuple[Suite, dict]:
  """The suite as it runs (B* substituted, learning rates tuned) and the record of how: with
  ``run``, each arm's tuning runs and then the arm itself are run in order (only the arms named
  in ``only``, when given: the others must be recorded as far as those need them); without it,
  every run must be recorded already."""
  scaled = scaling(suite, paths, data, run)
  if scaled is None and suite.b_star is not None:
    scaled = {"b_star": suite.b_star, "given": True}
  arms, tuning = [], {}
  for arm in suite.arms:
    arm_run = run if only is None or arm.name in only else None
    if arm.learning_rate_from:
      if arm.learning_rate_from not in tuning:
        raise ValueError(f"arm {arm.name!r}: learning_rate_from={arm.learning_rate_from!r} is not "
                         f"a tuned arm listed before it")
      rate = tuning[arm.learning_rate_from]["learning_rate"]
      arm = _with(arm, [f"trainer.train.learning_rate = {rate!r}"])
    concrete, choice = resolve(arm, suite, paths, data, scaled and scaled["b_star"], arm_run)
    if choice:
      tuning[arm.name] = choice
    if arm_run is not None:
      arm_run([concrete])
    arms.append(concrete)
  record = {"scaling": scaled, "tuning": tuning, "learning_rates": list(suite.learning_rates),
            "tuning_seed": suite.tuning_seed} if (scaled or tuning) else None
  return dataclasses.replace(suite, arms=arms), record


def check_tensorflow(suite: Suite) -> None:
  """ValueError unless this environment has the TensorFlow version ``suite.tensorflow`` pins."""
  have = machine.tensorflow_version()
  if suite.tensorflow and have != suite.tensorflow:
    raise ValueError(
        f"suite {suite.name!r} runs on TensorFlow {suite.tensorflow} (its recorded runs were "
        f"taken on it), this environment has {have}: run it from a venv with "
        f"tensorflow=={suite.tensorflow} (make test-io builds .venv-tf217)")


def check_arm_names(suite: Suite, names: Sequence[str]) -> None:
  """ValueError naming the unknown ones unless every name is one of the suite's arms."""
  unknown = [n for n in names if n not in {a.name for a in suite.arms}]
  if unknown:
    raise ValueError(f"suite {suite.name!r} has no arm(s) {unknown}; its arms: "
                     f"{[a.name for a in suite.arms]}")


def run_suite(suite: Suite, paths: RunPaths, force: bool = False,
              progress: Callable[[str], None] = print, allow_load: bool = False,
              only: Optional[Sequence[str]] = None) -> Optional[dict]:
  """Runs (or reuses) every arm, then writes summary.json and returns it. With ``only`` (arm
  names) runs just those arms (a suite too long for one session goes on arm by arm) and
  writes no summary: it is written by an invocation that finds every arm recorded."""
  check_tensorflow(suite)
  if only is not None:
    check_arm_names(suite, only)
  os.makedirs(paths.results_dir, exist_ok=True)
  # A suite's corpus is the one its recorded runs read: rebuilt from the recorded packages.
  data = data_bindings(suite, paths.data_dir, paths.corpus_manifest)
  manifest = corpus_manifest(suite, paths.data_dir, build=False)
  if manifest is not None:  # which packages, versions and .debs the runs read
    machine.write_json(paths.corpus_manifest, manifest, indent=1)
  if not force:
    check_same_corpus(suite, paths)
  start = time.time()
  ran = set()

  cpus = machine.CpuPool() if suite.pin_runs else None

  def run_one(arm: Arm) -> None:
    # An arm built from a source arm that was just rerun is rerun too.
    if run_arm(arm, suite, paths, data, force=force or arm.source_arm in ran, progress=progress,
               allow_load=allow_load, cpus=cpus):
      ran.add(arm.name)

  def run(arms: Sequence[Arm]) -> None:
    _at_once(run_one, arms, cpus.size if cpus and max(map(_cpus_needed, arms)) == 1 else 1)

  concrete, record = prepare(suite, paths, data, run, only)
  if only is not None:
    return None
  summary = summarize(concrete, paths, record)
  summary["this_invocation"] = {"wall_time_s": time.time() - start, "arms_run": sorted(ran),
                                "allow_load": allow_load}
  return _write_summary(summary, paths)


def summarize_recorded(suite: Suite, paths: RunPaths) -> dict:
  """summary.json again from the recorded runs alone (trains nothing; every run must be there)."""
  # Data bindings only name tuning runs (their digest); other suites need no data prepared.
  tuned = suite.scaling_arm or any(a.tune_learning_rate for a in suite.arms)
  concrete, record = prepare(suite, paths, data_bindings(suite, paths.data_dir,
                                                          paths.corpus_manifest) if tuned else [])
  summary = summarize(concrete, paths, record)
  summary["this_invocation"] = {"report_only": True}
  return _write_summary(summary, paths)


def _write_summary(summary: dict, paths: RunPaths) -> dict:
  path = os.path.join(paths.results_dir, "summary.json")
  machine.write_json(path, summary, indent=1)
  logging.info("wrote %s", path)
  return summary
