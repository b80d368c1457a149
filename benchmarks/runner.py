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

import dataclasses
import itertools
import json
import os
import shutil
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import gin
import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from tf_codistill import config
from tf_codistill import demo
from tf_codistill import exchange
from tf_codistill import launcher
from tf_codistill import metrics

ARM_KINDS = ("train", "ensemble", "offline_distill")
DATA_KINDS = ("criteo_like", "adult")
LOSS_KEY = "val_logloss"


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
    data: ``criteo_like`` (generated Criteo-format TSV) or ``adult`` (the UCI Adult census data).
    train_rows, eval_rows: sizes of the generated data.
    target_loss: validation log loss that "steps to target" counts to; or
    target_from_arm: the target is that arm's final validation loss (mean over seeds and groups)
      plus ``target_margin``.
    goals: name -> goal function (``steps_ratio``, ``churn_reduction``, ``loss_minus_best``).
    goal_thresholds: name -> ("<=" or ">=", number): what the report calls met.
    threads_per_group: intra-op threads of each group's process (each group gets its share of
      the machine's cores, as it would get its own machines).
    simulated: a note when an arm simulates a cluster (e.g. a larger batch on one process).
  """
  name: str
  arms: Sequence[Arm]
  description: str = ""
  common_bindings: Sequence[str] = ()
  data: str = "criteo_like"
  train_rows: int = 1_000_000
  eval_rows: int = 20_000
  target_loss: Optional[float] = None
  target_from_arm: Optional[str] = None
  target_margin: float = 0.0
  goals: Mapping[str, Callable[..., Tuple[Optional[float], List[float]]]] = \
      dataclasses.field(default_factory=dict)
  goal_thresholds: Mapping[str, Tuple[str, float]] = dataclasses.field(default_factory=dict)
  threads_per_group: int = 1
  simulated: str = ""

  def __post_init__(self):
    if self.data not in DATA_KINDS:
      raise ValueError(f"suite {self.name!r}: data={self.data!r} is not one of {DATA_KINDS}")
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
    for goal in self.goal_thresholds:
      if goal not in self.goals:
        raise ValueError(f"suite {self.name!r}: goal_thresholds names unknown goal {goal!r}")


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
  """Mean ``metric`` (a per-run figure, e.g. examples_per_sec) of ``numerator`` / ``denominator``."""
  num, den = arms[numerator][metric], arms[denominator][metric]
  if not num or not den or not den["mean"]:
    return None, []
  return num["mean"] / den["mean"], [r[metric] / den["mean"] for r in arms[numerator]["runs"]
                                     if r[metric] is not None]


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
    return os.path.join(self.run_dir(arm, seed), f"group_{group}", "eval_predictions.npz")


def _gin_path(path: str) -> str:
  return path if os.path.isabs(path) else os.path.join(config.REPO_GIN_DIR, path)


def data_bindings(suite: Suite, data_root: str) -> List[str]:
  """Prepares the suite's data under ``data_root`` (reused when there) and binds its files."""
  if suite.data == "adult":
    from data_pipelines import adult  # pylint: disable=g-import-not-at-top
    data_dir = os.path.join(data_root, "adult")
    adult.prepare(data_dir)
    return [f"trainer.train.train_files = ['{data_dir}/train-*']",
            f"trainer.train.eval_files = ['{data_dir}/eval-*']"]
  data_dir = os.path.join(data_root, f"criteo_like_{suite.train_rows}_{suite.eval_rows}")
  train, evaluation = demo.sample_data(data_dir, suite.train_rows, suite.eval_rows)
  return [f"trainer.train.train_files = {train!r}", f"trainer.train.eval_files = {evaluation!r}"]


def arm_config(arm: Arm, suite: Suite, data: Sequence[str]) -> dict:
  """Everything that determines an arm's runs: reuse is only safe while this is unchanged."""
  return {"arm": {k: list(v) if isinstance(v, tuple) else v
                  for k, v in dataclasses.asdict(arm).items() if k != "label"},
          "common_bindings": list(suite.common_bindings), "data": list(data),
          "threads_per_group": suite.threads_per_group}


def _config_path(arm: Arm, paths: RunPaths) -> str:
  return os.path.join(paths.results_dir, "runs", arm.name, "config.json")


def _arm_done(arm: Arm, paths: RunPaths, config: dict) -> bool:
  """Whether every run of the arm is recorded, from the same configuration."""
  groups = arm.num_groups if arm.kind == "train" else 1
  try:
    with open(_config_path(arm, paths)) as f:
      if json.load(f) != config:
        return False
  except (OSError, ValueError):
    return False
  return all(os.path.exists(paths.result(arm.name, s, g)) and os.path.exists(paths.curve(arm.name, s, g))
             for s in range(arm.seeds) for g in range(groups))


def _record_run(arm: Arm, paths: RunPaths, seed: int, group: int, group_dir: str) -> dict:
  """Copies a finished group's results.json and progress curve into the results directory."""
  with open(os.path.join(group_dir, "results.json")) as f:
    results = json.load(f)
  results.pop("history", None)  # the curve below carries it, with steps and wall time
  # Wall times and examples/sec mean little without the machine's load while the run trained.
  results["load_avg_1m_at_end"] = os.getloadavg()[0]
  os.makedirs(os.path.dirname(paths.result(arm.name, seed, group)), exist_ok=True)
  keep = ("step", "wall_time_s", "loss", "task_loss", "distill_loss", "alpha", "teacher_staleness",
          "val_loss", "val_logloss", "val_auc", "examples_per_sec")
  with open(os.path.join(group_dir, "progress.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  with open(paths.curve(arm.name, seed, group), "w") as f:
    for record in records:
      f.write(json.dumps({k: record[k] for k in keep if k in record}, sort_keys=True) + "\n")
  with open(paths.result(arm.name, seed, group), "w") as f:
    json.dump(results, f, indent=1, sort_keys=True)
  return results


def _launch(arm: Arm, suite: Suite, paths: RunPaths, seed: int, data: Sequence[str], *,
            exchange_dir: Optional[str] = None, extra: Sequence[str] = (),
            num_groups: Optional[int] = None, groups: Optional[Sequence[int]] = None
            ) -> Dict[int, str]:
  model_dir = paths.run_dir(arm.name, seed)
  shutil.rmtree(model_dir, ignore_errors=True)
  threads = ([f"trainer.train.intra_op_threads = {suite.threads_per_group}",
              f"trainer.train.inter_op_threads = {suite.threads_per_group}"]
             if suite.threads_per_group else [])
  bindings = (list(suite.common_bindings) + list(arm.gin_bindings) + list(data) + list(extra)
              + [f"trainer.train.seed = {seed}", "trainer.train.save_eval_predictions = True",
                 "trainer.train.verbose = 0"] + threads)
  shape = launcher.GroupShape(arm.strategy, arm.workers_per_group, arm.ps_per_group)
  return launcher.launch(model_dir, num_groups or arm.num_groups, exchange_dir=exchange_dir,
                         gin_files=[_gin_path(p) for p in arm.gin_files], gin_bindings=bindings,
                         shape=shape, groups=groups)


def run_arm(arm: Arm, suite: Suite, paths: RunPaths, data: Sequence[str], force: bool = False,
            progress: Callable[[str], None] = print) -> bool:
  """Runs every seed of ``arm`` (or reuses the recorded runs) and records them, with churn.

  Returns whether it ran (False: reused).
  """
  config = arm_config(arm, suite, data)
  if not force and _arm_done(arm, paths, config):
    progress(f"[{suite.name}] {arm.name}: reusing {arm.seeds} recorded run(s) (--force reruns)")
    return False
  # Whatever was recorded for this arm before is stale from here on.
  shutil.rmtree(os.path.join(paths.results_dir, "runs", arm.name), ignore_errors=True)
  for seed in range(arm.seeds):
    start = time.time()
    if arm.kind == "train":
      dirs = _launch(arm, suite, paths, seed, data)
      results = [_record_run(arm, paths, seed, g, dirs[g]) for g in sorted(dirs)]
    elif arm.kind == "offline_distill":
      results = [_offline_distill(arm, suite, paths, seed, data)]
    else:
      results = [_ensemble(arm, paths, seed)]
    summary = ", ".join(f"group {r.get('group', 0)} {LOSS_KEY} {r[LOSS_KEY]:.4f}" for r in results)
    progress(f"[{suite.name}] {arm.name} seed {seed + 1}/{arm.seeds}: {summary} "
             f"({time.time() - start:.0f}s)")
  with open(_config_path(arm, paths), "w") as f:
    json.dump(config, f, indent=1, sort_keys=True)
  churn = _churn(arm, paths)
  if churn:
    progress(f"[{suite.name}] {arm.name}: churn mean |pa-pb| {churn['mean_abs_diff']['mean']:.5f} "
             f"over {len(churn['pairs'])} pairs of seeds")
  return True


def _offline_distill(arm: Arm, suite: Suite, paths: RunPaths, seed: int,
                     data: Sequence[str]) -> dict:
  """Two-phase distillation: group 0 of a 2-group job trains; group 1 is the source arm's trained
  model of the same seed, published once into the exchange as a frozen teacher."""
  teacher_export = os.path.join(paths.run_dir(arm.source_arm, seed), "group_0", "export")
  if not tf.io.gfile.exists(teacher_export):
    raise FileNotFoundError(f"arm {arm.name!r}: teacher {teacher_export} is missing: rerun arm "
                            f"{arm.source_arm!r} with --force (its models live in the work dir)")
  exchange_dir = paths.run_dir(arm.name, seed) + "_exchange"
  shutil.rmtree(exchange_dir, ignore_errors=True)
  with open(paths.result(arm.source_arm, seed, 0)) as f:
    teacher_steps = json.load(f)["steps"]
  exchange.publish_saved_model(teacher_export, exchange_dir, group=1, step=teacher_steps)
  dirs = _launch(arm, suite, paths, seed, data, exchange_dir=exchange_dir,
                 extra=["trainer.train.codistill = True"], num_groups=2, groups=[0])
  return _record_run(arm, paths, seed, 0, dirs[0])


def _ensemble(arm: Arm, paths: RunPaths, seed: int) -> dict:
  """Averages the predictions of ``ensemble_size`` consecutive seeds of the source arm (group 0)."""
  members = list(range(seed * arm.ensemble_size, (seed + 1) * arm.ensemble_size))
  probs, labels, member_results = [], None, []
  for member in members:
    path = paths.predictions(arm.source_arm, member, 0)
    if not os.path.exists(path):
      raise FileNotFoundError(f"arm {arm.name!r}: {path} is missing: arm {arm.source_arm!r} needs "
                              f">= {members[-1] + 1} seeds run in this work dir")
    with np.load(path) as npz:
      probs.append(npz["probs"])
      labels = npz["labels"]
    with open(paths.result(arm.source_arm, member, 0)) as f:
      member_results.append(json.load(f))
  mean = np.mean(probs, axis=0)
  out = paths.predictions(arm.name, seed, 0)
  os.makedirs(os.path.dirname(out), exist_ok=True)
  np.savez(out, probs=mean.astype(np.float32), labels=labels)
  auc = keras.metrics.AUC()
  auc.update_state(labels, mean)
  result = {"group": 0, "members": members, LOSS_KEY: metrics.log_loss(mean, labels),
            "val_auc": float(auc.result().numpy()), "steps": member_results[0]["steps"],
            "wall_time_s": sum(r["wall_time_s"] for r in member_results),
            "examples_per_sec": None}
  os.makedirs(os.path.dirname(paths.result(arm.name, seed, 0)), exist_ok=True)
  with open(paths.result(arm.name, seed, 0), "w") as f:
    json.dump(result, f, indent=1, sort_keys=True)
  with open(paths.curve(arm.name, seed, 0), "w") as f:
    f.write(json.dumps({"step": result["steps"], "wall_time_s": result["wall_time_s"],
                        LOSS_KEY: result[LOSS_KEY], "val_auc": result["val_auc"]}) + "\n")
  return result


def _churn(arm: Arm, paths: RunPaths) -> Optional[dict]:
  """Churn between independently retrained models of the arm (group 0 of each seed), recorded."""
  if arm.seeds < 2:
    return None
  preds = []
  for seed in range(arm.seeds):
    with np.load(paths.predictions(arm.name, seed, 0)) as npz:
      preds.append(npz["probs"])
  pairs = [{"seeds": [p["a"], p["b"]], "mean_abs_diff": p["mean_abs_diff"],
            "disagreement": p["disagreement"]} for p in metrics.pairwise_churn(preds)]
  churn = {"pairs": pairs, "examples": int(preds[0].shape[0]),
           "mean_abs_diff": _stat([p["mean_abs_diff"] for p in pairs]),
           "disagreement": _stat([p["disagreement"] for p in pairs])}
  with open(os.path.join(paths.results_dir, "runs", arm.name, "churn.json"), "w") as f:
    json.dump(churn, f, indent=1, sort_keys=True)
  return churn


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
  for seed, group in itertools.product(range(arm.seeds), range(groups)):
    with open(paths.result(arm.name, seed, group)) as f:
      result = json.load(f)
    runs.append({"seed": seed, "group": group, "result": result,
                 "curve": read_curve(paths.curve(arm.name, seed, group)),
                 "curve_file": os.path.relpath(paths.curve(arm.name, seed, group),
                                               paths.results_dir)})
  return runs


def summarize(suite: Suite, paths: RunPaths) -> dict:
  """summary.json: per arm its config, per-run figures, aggregates; the target; the goals."""
  raw = {arm.name: _runs(arm, paths) for arm in suite.arms}
  target = suite.target_loss
  if suite.target_from_arm:
    target = float(np.mean([r["result"][LOSS_KEY] for r in raw[suite.target_from_arm]])) \
        + suite.target_margin
  arms = {}
  for arm in suite.arms:
    runs = []
    for run in raw[arm.name]:
      steps, wall = first_reaching(run["curve"], target) if target is not None else (None, None)
      result = run["result"]
      runs.append({"seed": run["seed"], "group": run["group"],
                   "final_val_loss": result[LOSS_KEY], "final_val_auc": result.get("val_auc"),
                   "steps": result["steps"], "wall_time_s": result["wall_time_s"],
                   "examples_per_sec": result.get("examples_per_sec"),
                   "load_avg_1m_at_end": result.get("load_avg_1m_at_end"),
                   "steps_to_target": steps, "wall_time_to_target_s": wall,
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
        "steps_to_target": _stat([r["steps_to_target"] for r in runs]),
        "reached_target": sum(r["steps_to_target"] is not None for r in runs),
        "wall_time_to_target_s": _stat([r["wall_time_to_target_s"] for r in runs]),
        "wall_time_s": _stat([r["wall_time_s"] for r in runs]),
        "examples_per_sec": _stat([r["examples_per_sec"] for r in runs]),
        "load_avg_1m_at_end": _stat([r["load_avg_1m_at_end"] for r in runs]),
        "churn": churn,
    }
  goals, spreads, verdicts = {}, {}, {}
  for name, goal in suite.goals.items():
    value, per = goal(arms)
    goals[name] = value
    spreads[name] = _stat(per)
    if name in suite.goal_thresholds and value is not None:
      op, threshold = suite.goal_thresholds[name]
      verdicts[name] = {"threshold": [op, threshold],
                        "met": bool(value <= threshold if op == "<=" else value >= threshold)}
  return {"suite": suite.name, "description": suite.description, "data": suite.data,
          "common_bindings": list(suite.common_bindings), "simulated": suite.simulated,
          "target_loss": target, "target_from_arm": suite.target_from_arm,
          "arms": arms, "goals": goals, "goal_spreads": spreads, "goal_verdicts": verdicts}


def run_suite(suite: Suite, paths: RunPaths, force: bool = False,
              progress: Callable[[str], None] = print) -> dict:
  """Runs (or reuses) every arm, then writes summary.json and returns it."""
  os.makedirs(paths.results_dir, exist_ok=True)
  data = data_bindings(suite, paths.data_dir)
  start = time.time()
  ran = set()
  for arm in suite.arms:
    # An arm built from a source arm that was just rerun is rerun too.
    if run_arm(arm, suite, paths, data, force=force or arm.source_arm in ran, progress=progress):
      ran.add(arm.name)
  summary = summarize(suite, paths)
  summary["this_invocation"] = {"wall_time_s": time.time() - start, "arms_run": sorted(ran)}
  with open(os.path.join(paths.results_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1, sort_keys=True)
  logging.info("wrote %s", os.path.join(paths.results_dir, "summary.json"))
  return summary
