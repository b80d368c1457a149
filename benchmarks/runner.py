"""Runs a benchmark suite: its arms through the launcher, per-run curves, summary.json with goals.

A suite (suite_spec.py) is a gin file (``benchmarks/suites/<name>.gin``) binding ``bench.Suite``:
a list of ``bench.Arm``s, each a gin config of the trainer (files + bindings) run for a number of
seeds through ``tfc.launch_groups``, exactly as a user would. Besides trained arms there are arms
computed from other arms' runs: ``ensemble`` (average of the predictions of ``ensemble_size``
seeds of ``source_arm``) and ``offline_distill`` (a student that distills from ``source_arm``'s
trained model, published once into the exchange as a frozen peer: classic two-phase
distillation).

Each run leaves, under ``results_dir/<suite>/runs/<arm>/``, one JSON-lines curve per group
(``seed_<s>_group_<g>.jsonl``: step, wall time, train and validation loss, AUC, examples/sec,
teacher staleness) and its ``results.json`` (``seed_<s>_group_<g>.json``). An arm whose files
are all there is reused unless ``force`` while its configuration is the recorded one
(reuse.py). Before the arms, the protocol's learning-rate tuning and synchronous scaling (B*)
run; after them, the summary with the suite's goals (goal_figures.py).
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

import numpy as np
import tensorflow as tf
from absl import logging

import tf_codistill as tfc
from benchmarks import machine
from benchmarks import protocol
from benchmarks import reuse
from benchmarks import suite_spec as spec
from benchmarks import verdicts
from tf_codistill import layout
from tf_codistill.exchange import directory as exchange
from tf_codistill.launch import demo
from tf_codistill.launch import gin_config as config

T = TypeVar("T")
# ----------------------------------------------------------------------------------------------
# Per-run figures (the goal figures are in goal_figures.py).


def _stat(values: Sequence[Optional[float]]) -> Optional[Dict[str, float]]:
  values = [v for v in values if v is not None]
  if not values:
    return None
  return {"mean": float(np.mean(values)), "std": float(np.std(values)),
          "min": float(np.min(values)), "max": float(np.max(values)), "n": len(values)}


def bytes_sent_per_step(result: Mapping[str, Any]) -> Optional[float]:
  """Bytes a group of a multi-group run sent its peers a step: its published versions' files and
  its averaging changes, over the steps of the process that counted them (a run resumed after a
  stop counts from its checkpoint's step); None for one group, a run recorded without the
  counts, or a last part that trained no step. A resumed run's averaging changes are counted
  as its last part's mean change for each round through its last (one change a round): a part
  a few rounds long would otherwise count one round over far fewer steps than a round's."""
  steps = int(result.get("steps") or 0)
  resumed = int(result.get("resumed_from_step") or 0)
  trained = steps - resumed
  if int(result.get("num_groups") or 1) < 2 or trained <= 0:
    return None
  published = result.get("publish_bytes")
  if result.get("codistill") and published is None:
    return None
  rounds = result.get("averaging_rounds") or {}
  if resumed and rounds.get("rounds"):
    averaged = rounds["bytes_sent"] / rounds["rounds"] * rounds["last_round"] / steps
  else:
    averaged = rounds.get("bytes_sent", 0) / trained
  return (published or 0) / trained + averaged


def examples_per_sec(result: Mapping[str, Any], curve: Sequence[Mapping[str, Any]]
                     ) -> Optional[float]:
  """A run's training rate: its record's median, or for a run resumed after a stop (whose
  process measured only its last part) the median of every evaluation's rate in its curve."""
  if not result.get("resumed_from_step"):
    return result.get("examples_per_sec")
  rates = [line["examples_per_sec"] for line in curve if line.get("examples_per_sec")]
  return float(np.median(rates)) if rates else None


# ----------------------------------------------------------------------------------------------
# Running.


def gin_path(path: str) -> str:
  """A suite's gin file: as given when absolute, else under the repository's gin/."""
  return path if os.path.isabs(path) else os.path.join(config.REPO_GIN_DIR, path)


def corpus_manifest(suite: spec.Suite, data_root: str, build: bool = True,
                    pinned_to: Optional[str] = None) -> Optional[dict]:
  """The manifest of a Debian-corpus suite's corpus (built under ``data_root`` unless there and
  ``build``, from the packages the manifest at ``pinned_to`` records, where that file exists);
  None for other data."""
  if suite.data not in spec.CORPORA:
    return None
  from data_pipelines import corpus  # pylint: disable=g-import-not-at-top
  from data_pipelines import debian_text  # pylint: disable=g-import-not-at-top
  name, options = spec.CORPORA[suite.data]
  data_dir = os.path.join(data_root, suite.data)
  if not build:
    return corpus.read_manifest(data_dir)
  recorded = machine.read_json(pinned_to) if pinned_to and os.path.exists(pinned_to) else None
  return corpus.build(data_dir, debian_text.CORPORA[name], vocab_size=suite.vocab_size,
                      debs_dir=suite.debs_dir, pinned_to=recorded, **options)


def data_bindings(suite: spec.Suite, data_root: str, pinned_to: Optional[str] = None,
                  prepare_data: bool = True) -> List[str]:
  """Prepares the suite's data under ``data_root`` (reused when there; a corpus built from the
  packages the manifest at ``pinned_to`` records, where it exists) and binds its files. Without
  ``prepare_data`` only binds them (what reads recorded runs needs no corpus built); generated
  CTR data is made either way (seconds)."""
  if suite.data in spec.CORPORA:
    if prepare_data:
      corpus_manifest(suite, data_root, pinned_to=pinned_to)
    tokens = os.path.join(data_root, suite.data, "tokens")
    return [f"tfc.Data.train_files = ['{tokens}/train-*']",
            f"tfc.Data.eval_files = ['{tokens}/{suite.eval_pattern}']"]
  if suite.data in ("kjv", "fashion_mnist", "adult"):
    data_dir = os.path.join(data_root, suite.data)
    if prepare_data:
      _prepare_files(suite, data_dir)
    return [f"tfc.Data.train_files = ['{data_dir}/train-*']",
            f"tfc.Data.eval_files = ['{data_dir}/eval-*']"]
  data_dir = os.path.join(data_root, f"criteo_like_{suite.train_rows}_{suite.eval_rows}")
  train, evaluation = demo.sample_data(data_dir, suite.train_rows, suite.eval_rows)
  return [f"tfc.Data.train_files = {train!r}", f"tfc.Data.eval_files = {evaluation!r}"]


def _prepare_files(suite: spec.Suite, data_dir: str) -> None:
  """The KJV, Fashion-MNIST or Adult files of ``suite`` under ``data_dir`` (kept when there)."""
  if suite.data == "kjv":
    from data_pipelines import text_lm  # pylint: disable=g-import-not-at-top
    text_lm.prepare(data_dir, vocab_size=suite.vocab_size)
  elif suite.data == "fashion_mnist":
    from data_pipelines import images  # pylint: disable=g-import-not-at-top
    images.convert_fashion_mnist(data_dir)
  else:
    from data_pipelines import adult  # pylint: disable=g-import-not-at-top
    adult.prepare(data_dir)


def _config_path(arm: spec.Arm, paths: spec.RunPaths) -> str:
  return os.path.join(paths.results_dir, "runs", arm.name, "config.json")


def _recorded_config(arm: spec.Arm, paths: spec.RunPaths) -> Optional[dict]:
  return machine.read_json_or(_config_path(arm, paths))


def _seed_recorded(arm: spec.Arm, paths: spec.RunPaths, seed: int) -> bool:
  """Whether every group's result and curve of ``seed`` is in the results directory."""
  groups = arm.num_groups if arm.kind == "train" else 1
  return all(os.path.exists(paths.result(arm.name, seed, g))
             and os.path.exists(paths.curve(arm.name, seed, g)) for g in range(groups))


def _arm_done(arm: spec.Arm, paths: spec.RunPaths, config: dict) -> bool:
  """Whether every run of the arm is recorded, from the same configuration, with its churn."""
  return (reuse.same_config(_recorded_config(arm, paths), config)
          and all(_seed_recorded(arm, paths, s) for s in arm.seed_list)
          and (arm.seeds < 2 or _churn_complete(arm, _read_churn(arm, paths))))


def _seeds_to_run(arm: spec.Arm, paths: spec.RunPaths, config: dict) -> List[int]:
  """The seeds a (re)started arm must still run. Runs recorded under the same configuration are
  kept (a suite stopped mid-arm resumes seed by seed) where churn no longer needs them (their
  pair's churn is recorded) or still can use them (their predictions are in this work dir).
  Anything recorded under another configuration (or none) is stale, removed, and the
  configuration is recorded before the first run."""
  if not reuse.same_config(_recorded_config(arm, paths), config):
    shutil.rmtree(os.path.join(paths.results_dir, "runs", arm.name), ignore_errors=True)
    machine.write_json(_config_path(arm, paths), config, indent=1)
  return [seed for seed in arm.seed_list
          if not (_seed_recorded(arm, paths, seed)
                  and (arm.seeds < 2 or os.path.exists(paths.predictions(arm.name, seed, 0))
                       or _pair_recorded(arm, paths, seed)))]


def _churn_path(arm: spec.Arm, paths: spec.RunPaths) -> str:
  return os.path.join(paths.results_dir, "runs", arm.name, "churn.json")


def _record_run(arm: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, seed: int, group: int,
                group_dir: str, load: Optional[dict] = None) -> dict:
  """Copies a finished group's results.json and progress curve into the results directory, with
  the machine's load before and after the run (``load``: from machine.settle)."""
  results = machine.read_json(layout.RunDir(group_dir).results)
  results.pop("history", None)  # the curve below carries it, with steps and wall time
  # Wall times and examples/sec mean little without the machine's load while the run trained.
  results.update(load or {})
  results.update(_data_use(suite, paths, results))
  results["load_avg_1m_at_end"] = machine.load_1m()
  keep = ("step", "wall_time_s", "loss", "task_loss", "distill_loss", "alpha", "teacher_staleness",
          "val_loss", "val_logloss", "val_auc", "val_xent", "val_accuracy", "val_perplexity",
          "examples_per_sec")
  records = read_curve(layout.RunDir(group_dir).progress)
  machine.write_text(paths.curve(arm.name, seed, group), "".join(
      json.dumps({k: record[k] for k in keep if k in record}, sort_keys=True) + "\n"
      for record in records))
  machine.write_json(paths.result(arm.name, seed, group), results, indent=1)
  return results


def _data_use(suite: spec.Suite, paths: spec.RunPaths, results: Mapping[str, object]) -> dict:
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


def check_same_corpus(suite: spec.Suite, paths: spec.RunPaths) -> None:
  """Refuses to go on with a corpus other than the one the suite's recorded runs read (Debian
  updates a package, the build takes the new version): their figures would not be comparable."""
  manifest = corpus_manifest(suite, paths.data_dir, build=False)
  if manifest is None:
    return
  from data_pipelines import corpus  # pylint: disable=g-import-not-at-top
  now = corpus.fingerprint(manifest)
  for path in glob.glob(os.path.join(paths.results_dir, "runs", "**", "seed_*_group_*.json"),
                        recursive=True):
    recorded = machine.read_json(path).get("corpus_fingerprint")
    if recorded not in (None, now):
      versions = ", ".join(f"{p['package']} {p['version']}" for p in manifest["packages"])
      raise ValueError(
          f"{path} was trained on corpus {recorded}, but {paths.data_dir}/{suite.data} is "
          f"{now} ({versions}): a package changed since. Remove {paths.data_dir}/{suite.data} "
          f"to rebuild it from the packages {spec.CORPUS_MANIFEST} beside the runs records, or "
          f"start the suite over (--force)")


def _launch(arm: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, seed: int, data: Sequence[str],
            *, exchange_dir: Optional[str] = None, extra: Sequence[str] = (),
            num_groups: Optional[int] = None, groups: Optional[Sequence[int]] = None,
            pin: bool = False, resumed: Optional[Mapping[int, int]] = None,
            part: Optional[dict] = None) -> Dict[int, str]:
  """Trains one seed of ``arm`` (its groups, or ``groups`` of ``num_groups``); ``pin``: each group
  on its own share of the CPUs this thread may use (machine.CpuPool.take). A stopped run goes on
  from its checkpoints when ``resumed`` (``stopped_run``) names their steps, and every other run
  starts over; where the suite resumes runs, ``part`` (the machine's load as it starts, the
  run's configuration digest) is recorded as the start of a part."""
  model_dir = paths.run_dir(arm.name, seed)
  if not resumed:
    shutil.rmtree(model_dir, ignore_errors=True)
  if part is not None and suite.resume_every_steps:
    _add_part(model_dir, resumed or {}, part)
  threads = ([f"trainer.train.intra_op_threads = {suite.threads_per_group}",
              f"trainer.train.inter_op_threads = {suite.threads_per_group}"]
             if suite.threads_per_group else [])
  checkpoints = ([f"tfc.Checkpoints.every_steps = {suite.resume_every_steps}"]
                 if suite.resume_every_steps else [])
  bindings = (list(suite.common_bindings) + list(arm.gin_bindings) + list(data) + list(extra)
              + [f"trainer.train.seed = {seed}", "trainer.train.save_eval_predictions = True",
                 f"trainer.train.prediction_history = {suite.prediction_history}",
                 "trainer.train.verbose = 0"] + threads + checkpoints)
  return tfc.launch_groups(model_dir, num_groups or arm.num_groups, exchange_dir=exchange_dir,
                           gin_files=[gin_path(p) for p in arm.gin_files], gin_bindings=bindings,
                           shape=arm.shape, groups=groups, pin_groups=pin,
                           # A fault is not resumed in the same run (a stop between invocations
                           # is, where the suite says so: stopped_run).
                           max_restarts=0)


PARTS_FILE = "bench_parts.json"  # in a seed's run folder: when each part of a resumed run began


def stopped_run(arm: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, seed: int,
                config: str, also: Sequence[str] = ()) -> Dict[int, int]:
  """{group: the step it resumes from} for a stopped run of ``arm``'s ``seed`` that the suite
  resumes (``Suite.resume_every_steps``) and that was started under ``config``
  (``run_config_digest``; or one of the digests ``also`` names); empty when the seed starts
  over. Refuses a run still going on."""
  if not suite.resume_every_steps or arm.kind != "train":
    return {}
  model_dir = paths.run_dir(arm.name, seed)
  steps = {g: tfc.resume_step(layout.group_dir(model_dir, g)) for g in range(arm.num_groups)}
  if not any(steps.values()):
    return {}
  for group in range(arm.num_groups):
    _refuse_if_running(layout.group_run(model_dir, group).heartbeat, f"{arm.name} seed {seed}")
  parts = _read_parts(model_dir)
  recorded = next((p["config"] for p in reversed(parts) if p.get("config")), None)
  if recorded in (config, *also):
    return steps
  logging.warning("%s seed %d: its stopped run (checkpoints at steps %s) was started under %s, "
                  "not this configuration (%s): it starts over", arm.name, seed, steps,
                  f"configuration {recorded}" if recorded else "no recorded configuration",
                  config)
  return {}


def run_config_digest(arm: spec.Arm, suite: spec.Suite, data: Sequence[str],
                      names: str = "recorded") -> str:
  """A digest of what determines a run of ``arm`` (its configuration, B* and tuned rate in its
  bindings): a stopped run resumes only under the same. Its bindings are read under the names
  the first recorded configurations used (``reuse.as_recorded``), so that a gin setting renamed
  while a run is stopped does not start it over; ``names='current'``: under today's names, as
  runs recorded before that rule did."""
  config = reuse.arm_config(arm, suite, data)
  if names == "recorded":
    config = reuse.bindings_as(config, reuse.as_recorded)
  return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def _refuse_if_running(heartbeat: str, what: str, fresh_s: float = 300.0) -> None:
  """Raises if the heartbeat of a run to resume is fresh and its process alive: two processes
  would train the same folder (a runner killed alone leaves its tasks running)."""
  beat = machine.read_json_or(heartbeat)
  if not beat or time.time() - beat.get("time", 0) > fresh_s:
    return
  try:
    os.kill(int(beat["pid"]), 0)
  except (ProcessLookupError, KeyError, ValueError):
    return
  raise RuntimeError(f"{what} is still running: its chief (pid {beat['pid']}) wrote "
                     f"{heartbeat} {time.time() - beat['time']:.0f} s ago; stop it (its process "
                     f"group) before resuming the run")


def _read_parts(model_dir: str) -> List[dict]:
  path = os.path.join(model_dir, PARTS_FILE)
  return machine.read_json(path).get("parts", []) if os.path.exists(path) else []


def _add_part(model_dir: str, resumed: Mapping[int, int], load: Mapping[str, Any]) -> None:
  """Records that a part of the run starts now, from ``resumed``'s steps, at ``load`` (with the
  run's ``config`` digest)."""
  parts = _read_parts(model_dir) if resumed else []
  part = {"from_step": {str(g): s for g, s in sorted(resumed.items())},
          "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "commit": machine.code_commit(),
          **{k: load[k] for k in ("load_avg_1m_before", "started_above_nproc_load",
                                  "beside_sibling_run", "cpu_model", "config") if k in load}}
  machine.write_json(os.path.join(model_dir, PARTS_FILE), {"parts": parts + [part]}, indent=1)


def _parts(model_dir: str) -> dict:
  """For a run resumed after a stop: its parts, and the load as its worst part's."""
  parts = _read_parts(model_dir)
  if len(parts) < 2:
    return {}
  return {"parts": parts,
          "load_avg_1m_before": max(p.get("load_avg_1m_before") or 0.0 for p in parts),
          "started_above_nproc_load": any(p.get("started_above_nproc_load") for p in parts)}


# ----------------------------------------------------------------------------------------------
# The protocol: learning-rate tuning and synchronous scaling (B*), resolved before an arm runs.

RunFn = Callable[[Sequence[spec.Arm]], object]  # runs (or reuses) arms' seeds, in order or at once


def _with(arm: spec.Arm, bindings: Sequence[str], **changes) -> spec.Arm:
  return dataclasses.replace(arm, gin_bindings=list(arm.gin_bindings) + list(bindings), **changes)


def _tuning_arms(arm: spec.Arm, suite: spec.Suite, data: Sequence[str],
                 rates: Optional[Sequence[float]] = None) -> Dict[float, spec.Arm]:
  """One single-seed arm per learning rate of the grid (``rates``, default the suite's), in a
  folder named by the settings that define the arm (``tuning_name``), so equal configurations
  (a scaling batch and an arm at B*) share them."""
  config = reuse.arm_config(dataclasses.replace(arm, name="", seeds=1, tune_learning_rate=False,
                                                seed_offset=0, churn_pairs=()), suite, data)
  folder = reuse.tuning_name(reuse.bindings_as(config, reuse.as_recorded))
  return {lr: _with(arm, [f"trainer.train.learning_rate = {lr!r}"],
                    name=f"{spec.TUNING_DIR}/{folder}/lr_{lr:g}", seeds=1, tune_learning_rate=False,
                    seed_offset=suite.tuning_seed, churn_pairs=(),
                    label=f"tuning {arm.name} at lr {lr:g}")
          for lr in (suite.learning_rates if rates is None else rates)}


def _next_rate(suite: spec.Suite, rates: Sequence[float], chosen: float) -> Optional[float]:
  """The rate the grid grows by when its largest won (``Suite.extend_grid`` times at most)."""
  if chosen != max(rates) or len(rates) - len(suite.learning_rates) >= suite.extend_grid:
    return None
  return 2 * max(rates)


def recorded_curves(arm: spec.Arm, paths: spec.RunPaths, key: str) -> Dict[int, protocol.Curve]:
  """{seed: the seed's validation curve (mean over its groups)} from the recorded runs."""
  groups = arm.num_groups if arm.kind == "train" else 1
  return protocol.grouped({
      (s, g): protocol.curve_points(read_curve(paths.curve(arm.name, s, g)), key)
      for s in arm.seed_list for g in range(groups)})


def _other_data_hint(paths: spec.RunPaths, name: str, data: Sequence[str]) -> str:
  """Where runs of ``name``'s settings are recorded under other data bindings (a suite run with
  another --work_dir reads its files elsewhere, which makes other runs), as an error's hint."""
  folder, run = os.path.split(name)
  prefix = os.path.basename(folder).rpartition("-")[0]
  if not prefix:  # a folder named by its digest alone: nothing tells its settings apart
    return ""
  for other in sorted(glob.glob(os.path.join(paths.results_dir, "runs", os.path.dirname(folder),
                                             f"{prefix}-*", run, "config.json"))):
    recorded = reuse.as_current(machine.read_json_or(other, {}).get("data") or [])
    if recorded and recorded != reuse.as_current(data):
      return (f"; runs of these settings are recorded with the data bindings {recorded} "
              f"(this run's: {list(data)}): pass the --work_dir they were made with")
  return ""


def _grid_losses(arm: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, data: Sequence[str],
                 rates: Sequence[float]) -> Dict[float, dict]:
  """{rate: best validation loss, runs and curve} of the recorded tuning runs of ``rates``."""
  losses = {}
  for lr, tuning_arm in _tuning_arms(arm, suite, data, rates).items():
    if not os.path.exists(paths.curve(tuning_arm.name, suite.tuning_seed, 0)):
      raise FileNotFoundError(f"arm {arm.name!r}: tuning run {tuning_arm.name} is not recorded "
                              f"in {paths.results_dir}: run the suite"
                              f"{_other_data_hint(paths, tuning_arm.name, data)}")
    curve = recorded_curves(tuning_arm, paths, suite.loss_key)[suite.tuning_seed]
    losses[lr] = {"best_val_loss": protocol.best_loss(curve), "runs": tuning_arm.name,
                  "curve": curve}
  return losses


def tune(arm: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, data: Sequence[str],
         run: Optional[RunFn] = None) -> Tuple[spec.Arm, dict]:
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


def scaling(suite: spec.Suite, paths: spec.RunPaths, data: Sequence[str],
            run: Optional[RunFn] = None) -> Optional[dict]:
  """The synchronous scaling phase: the scaling arm tuned at each batch, then B* (protocol.b_star)
  from the chosen learning rates' tuning curves."""
  if not suite.scaling_arm:
    return None
  batches, curves = {}, {}
  arms = {batch: _with(suite.scaling_arm, [f"tfc.Data.batch_size = {batch}"],
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


def resolve(arm: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, data: Sequence[str],
            b_star: Optional[int], run: Optional[RunFn] = None) -> Tuple[spec.Arm, Optional[dict]]:
  """The arm as it runs: ``{B*}``/``{2B*}`` replaced, the learning rate tuned."""
  if b_star is not None:
    arm = dataclasses.replace(arm, gin_bindings=[
        b.replace("{2B*}", str(2 * b_star)).replace("{B*}", str(b_star)) for b in arm.gin_bindings])
  elif any("B*}" in b for b in arm.gin_bindings):
    raise ValueError(f"arm {arm.name!r} binds %B_STAR or %TWO_B_STAR (its batch, {{B*}}) but "
                     f"the suite has no scaling phase and no b_star")
  if not arm.tune_learning_rate or arm.kind == "ensemble":
    return arm, None
  tuned, choice = tune(arm, suite, paths, data, run)
  choice.pop("chosen_curve")
  return tuned, choice


def _cpus_needed(arm: spec.Arm) -> int:
  """CPUs one seed of ``arm`` takes when runs are pinned: one per process of each group it
  trains (one for a single-process group, one per task of a group's cluster)."""
  shape = arm.shape  # a Group, made (and checked) on each access
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


def run_arm(arm: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, data: Sequence[str],
            force: bool = False, progress: Callable[[str], None] = print,
            quiet: machine.Quiet = machine.Quiet(), cpus: Optional[machine.CpuPool] = None) -> bool:
  """Runs every seed of ``arm`` (or reuses the recorded runs) and records them, with churn.

  Before each training run the machine must be quiet (``quiet``: the 1-minute load at most the
  number of cores, or ``quiet.allow_load``, and then the run is marked). With ``cpus`` every group
  runs pinned to a CPU of its own, and seeds go on at once while CPUs are free. Returns whether
  it ran (False: reused).
  """
  config = reuse.arm_config(arm, suite, data)
  if not force and _arm_done(arm, paths, config):
    progress(f"[{suite.name}] {arm.name}: reusing {arm.seeds} recorded run(s) (--force reruns)")
    return False
  if force:  # its records, and its stopped runs (not resumed)
    shutil.rmtree(os.path.join(paths.results_dir, "runs", arm.name), ignore_errors=True)
    shutil.rmtree(os.path.dirname(paths.run_dir(arm.name, 0)), ignore_errors=True)
  seeds = _seeds_to_run(arm, paths, config)
  if len(seeds) < arm.seeds:
    progress(f"[{suite.name}] {arm.name}: reusing {arm.seeds - len(seeds)} recorded run(s), "
             f"running seeds {seeds}")
  needed = _cpus_needed(arm)
  workers = cpus.size // needed if cpus and needed else 1
  recording = threading.Lock()

  def run_seed(seed: int) -> None:
    _run_seed(arm, suite, paths, data, seed, quiet, progress, cpus)
    with recording:  # each pair's churn as soon as both runs are there
      _churn(arm, paths, suite)

  _at_once(run_seed, seeds, workers)
  churn = _churn(arm, paths, suite)
  if churn:
    progress(f"[{suite.name}] {arm.name}: churn mean |pa-pb| {churn['mean_abs_diff']['mean']:.5f} "
             f"over {len(churn['pairs'])} pairs of seeds")
  return True


def _run_seed(arm: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, data: Sequence[str],
              seed: int, quiet: machine.Quiet, progress: Callable[[str], None],
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
      load, above = quiet.settle(what=f"{suite.name}/{arm.name} seed {seed}", log=progress)
    load = {"load_avg_1m_before": load, "started_above_nproc_load": above,
            "cpu_model": machine.cpu_model(),
            "beside_sibling_run": cpus is not None and cpus.in_use()}
    with cpus.take(_cpus_needed(arm)) if cpus else contextlib.nullcontext():
      if arm.kind == "train":
        config = run_config_digest(arm, suite, data)
        resumed = stopped_run(arm, suite, paths, seed, config,
                              also=[run_config_digest(arm, suite, data, names="current")])
        if resumed:
          progress(f"[{suite.name}] {arm.name} seed {seed}: resuming its stopped run from its "
                   f"checkpoints (group: step {resumed})")
        dirs = _launch(arm, suite, paths, seed, data, pin=cpus is not None, resumed=resumed,
                       part={**load, "config": config})
        load = {**load, **_parts(paths.run_dir(arm.name, seed))}
        results = [_record_run(arm, suite, paths, seed, g, dirs[g], load) for g in sorted(dirs)]
      else:
        results = [_offline_distill(arm, suite, paths, seed, data, load, pin=cpus is not None)]
  summary = ", ".join(f"group {r.get('group', 0)} {suite.loss_key} {r[suite.loss_key]:.4f}"
                      for r in results)
  progress(f"[{suite.name}] {arm.name} seed {seed} ({seed - arm.seed_offset + 1}/{arm.seeds}): "
           f"{summary} ({time.time() - start:.0f}s)")


def _offline_distill(arm: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, seed: int,
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
  teacher_steps = machine.read_json(paths.result(arm.source_arm, teacher_seed, 0))["steps"]
  exchange.publish_saved_model(teacher_export, exchange_dir, group=1, step=teacher_steps)
  dirs = _launch(arm, suite, paths, seed, data, exchange_dir=exchange_dir,
                 extra=["trainer.train.exchange = @tfc.Exchange"], num_groups=2, groups=[0],
                 pin=pin)
  return _record_run(arm, suite, paths, seed, 0, dirs[0], load)


def _ensemble(arm: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, seed: int,
              data: Sequence[str], cpus: Optional[machine.CpuPool]) -> dict:
  """Scores the ensemble of ``ensemble_size`` consecutive seeds of the source arm (the mean of
  their group-0 models' probabilities) and each member, in one pass over the whole evaluation
  set (tf-codistill-evaluate), so that the ensemble's gain counts the same examples."""
  members = list(range(seed * arm.ensemble_size, (seed + 1) * arm.ensemble_size))
  source = _recorded_arm(arm, paths)
  exports = {m: layout.group_run(paths.run_dir(source.name, m), 0).export for m in members}
  missing = [m for m in members if not os.path.exists(exports[m])]
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
             + [f"--saved_model={exports[m]}" for m in members])
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"arm {arm.name!r} seed {seed}: tf-codistill-evaluate failed: "
                       f"{done.stderr[-2000:]}")
  scores = machine.read_json(scored)
  key = "val_xent" if suite.output == "softmax" else "val_logloss"
  member_results = [machine.read_json(paths.result(source.name, m, 0)) for m in members]
  member_losses = [m[key] for m in scores["members"]]
  result = {"group": 0, "members": members, **scores["ensemble"],
            suite.loss_key: scores["ensemble"][key], "member_losses": member_losses,
            "ensemble_gain": float(np.mean(member_losses)) - scores["ensemble"][key],
            "examples": scores["examples"], "member_runs": regenerated,
            "steps": member_results[0]["steps"],
            "wall_time_s": sum(r["wall_time_s"] for r in member_results),
            "examples_per_sec": None}
  machine.write_json(paths.result(arm.name, seed, 0), result, indent=1)
  machine.write_text(paths.curve(arm.name, seed, 0), json.dumps(
      {"step": result["steps"], "wall_time_s": result["wall_time_s"], **scores["ensemble"],
       suite.loss_key: result[suite.loss_key]}) + "\n")
  return result


def _recorded_arm(arm: spec.Arm, paths: spec.RunPaths) -> spec.Arm:
  """The source arm of ``arm`` as its runs were recorded (tuned rate and B* substituted)."""
  recorded = _recorded_config(dataclasses.replace(arm, name=arm.source_arm), paths)
  if recorded is None:
    raise FileNotFoundError(f"arm {arm.name!r}: arm {arm.source_arm!r} has no recorded runs in "
                            f"{paths.results_dir}: run it first")
  return spec.Arm(**{**recorded["arm"],
                     "gin_bindings": reuse.as_current(recorded["arm"]["gin_bindings"])})


def _regenerate(source: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, seed: int,
                data: Sequence[str], cpus: Optional[machine.CpuPool]) -> None:
  """Trains a recorded seed of ``source`` again for its models (a work dir of another machine or
  earlier invocation held them), leaving its record as it is."""
  with cpus.take(_cpus_needed(source)) if cpus else contextlib.nullcontext():
    _launch(source, suite, paths, seed, data, pin=cpus is not None)


def _curve_difference(source: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, seed: int) -> dict:
  """How far the validation curve of the run in the work dir (the model an ensemble uses) is
  from the recorded run's: 0 for the recorded run itself, or where training is deterministic."""
  recorded = dict(protocol.curve_points(read_curve(paths.curve(source.name, seed, 0)),
                                        suite.loss_key))
  progress = layout.group_run(paths.run_dir(source.name, seed), 0).progress
  here = dict(protocol.curve_points(read_curve(progress), suite.loss_key))
  steps = sorted(set(recorded) & set(here))
  return {"seed": seed, "steps_compared": len(steps),
          "max_abs_loss_diff": max((abs(recorded[s] - here[s]) for s in steps), default=None)}


def _independent_pairs(arm: spec.Arm) -> List[Tuple[int, int]]:
  """The pairs of seeds whose churn the arm records: its ``churn_pairs``, else the disjoint
  pairs of its seeds (0-1, 2-3, ...): independent retrains."""
  if arm.churn_pairs:
    return [(min(p), max(p)) for p in arm.churn_pairs]
  seeds = list(arm.seed_list)
  return list(zip(seeds[::2], seeds[1::2]))


def _read_churn(arm: spec.Arm, paths: spec.RunPaths) -> dict:
  return machine.read_json_or(_churn_path(arm, paths), {})


def _recorded_pairs(churn: Mapping[str, Any]) -> set:
  """The disjoint pairs ``churn`` holds with all they need (their curve, where runs keep a
  prediction history; a record written before pair curves holds them all in ``curves``)."""
  with_curve = {tuple(c["seeds"]) for c in churn.get("pair_curves", [])}
  return {tuple(p["seeds"]) for p in churn.get("independent", [])
          if not churn.get("expects_curves", False) or "curves" in churn
          or tuple(p["seeds"]) in with_curve}


def _churn_complete(arm: spec.Arm, churn: Mapping[str, Any]) -> bool:
  """Whether ``churn`` holds every churn pair of the arm (``_independent_pairs``). An ensemble's
  churn is what its recorded seeds gave: never worth training its members again."""
  return arm.kind == "ensemble" or (bool(churn) and set(_independent_pairs(arm))
                                    <= _recorded_pairs(churn))


def _pair_recorded(arm: spec.Arm, paths: spec.RunPaths, seed: int) -> bool:
  """Whether churn no longer needs ``seed``'s predictions: its churn pair is recorded (with its
  curve, where kept), or it has none."""
  pair = next((p for p in _independent_pairs(arm) if seed in p), None)
  return (pair is None or arm.kind == "ensemble"
          or pair in _recorded_pairs(_read_churn(arm, paths)))


def _churn(arm: spec.Arm, paths: spec.RunPaths, suite: spec.Suite) -> Optional[dict]:
  """Churn between independently retrained models of the arm (group 0 of each seed), recorded
  pair by pair while both runs' predictions are in the work dir, so that an arm whose seeds run
  in several invocations (on machines that keep no work dir) keeps what each measured: ``pairs``
  (every pair whose predictions were there together), the churn pairs (``_independent_pairs``:
  ``independent``) and, where runs kept their prediction history, each such pair's churn
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
    pairs[(a, b)] = {"seeds": [a, b], **tfc.churn(preds[a], preds[b], suite.output)}
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


def _churn_curve(arm: spec.Arm, paths: spec.RunPaths, suite: spec.Suite,
                 seeds: Sequence[int]) -> List[dict]:
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
                   **tfc.churn(probs[0], probs[1], suite.output)})
  return sorted(points, key=lambda p: p["step"])


# ----------------------------------------------------------------------------------------------
# Summary.


def read_curve(path: str) -> List[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def first_reaching(curve: Sequence[dict], target: float, key: str = spec.LOSS_KEY
                   ) -> Tuple[Optional[int], Optional[float]]:
  """(step, wall time) of the first evaluation at or below ``target``; (None, None) if none."""
  for record in curve:
    if key in record and record[key] <= target:
      return int(record["step"]), float(record["wall_time_s"])
  return None, None


def _runs(arm: spec.Arm, paths: spec.RunPaths) -> List[dict]:
  runs = []
  groups = arm.num_groups if arm.kind == "train" else 1
  for seed, group in itertools.product(arm.seed_list, range(groups)):
    runs.append({"seed": seed, "group": group,
                 "result": machine.read_json(paths.result(arm.name, seed, group)),
                 "curve": read_curve(paths.curve(arm.name, seed, group)),
                 "curve_file": os.path.relpath(paths.curve(arm.name, seed, group),
                                               paths.results_dir)})
  return runs


def _target(suite: spec.Suite, paths: spec.RunPaths,
            raw: Mapping[str, List[dict]]) -> Optional[float]:
  """The target loss steps are counted to, by the suite's target_rule."""
  if suite.target_rule == "best_sync":
    by_name = {a.name: a for a in suite.arms}
    return protocol.best_arm({n: list(recorded_curves(by_name[n], paths, suite.loss_key).values())
                              for n in suite.sync_arms})[1]
  if suite.target_from_arm:
    return float(np.mean([r["result"][suite.loss_key] for r in raw[suite.target_from_arm]])) \
        + suite.target_margin
  return suite.target_loss


# A run's figures the summary copies from its record (None where the record has none).
_RESULT_KEYS = ("load_avg_1m_before", "load_avg_1m_at_end", "started_above_nproc_load",
                "cpu_model", "tensorflow", "train_targets", "share_tokens", "repeated_tokens",
                "trainable_parameter_bytes", "member_losses", "ensemble_gain")
# The per-run figures an arm's summary gives statistics of (``_stat``).
_STAT_KEYS = ("final_val_loss", "final_val_auc", "final_val_accuracy", "final_val_perplexity",
              "steps_to_target", "wall_time_to_target_s", "wall_time_s", "examples_per_sec",
              "load_avg_1m_before", "load_avg_1m_at_end", "best_val_loss", "bytes_sent_per_step",
              "ensemble_gain")


def _run_figures(run: dict, suite: spec.Suite, target: Optional[float]) -> dict:
  """One run's figures in summary.json: its final metrics, steps and wall time to ``target``."""
  result = run["result"]
  steps, wall = (first_reaching(run["curve"], target, suite.loss_key) if target is not None
                 else (None, None))
  return {"seed": run["seed"], "group": run["group"], "final_val_loss": result[suite.loss_key],
          **{f"final_{k}": result.get(k) for k in ("val_auc", "val_accuracy", "val_perplexity")},
          "steps": result["steps"], "wall_time_s": result["wall_time_s"],
          **{k: result.get(k) for k in _RESULT_KEYS},
          # A run resumed after a stop: the parts it ran in (absent for a run in one part).
          **({"parts": result["parts"]} if result.get("parts") else {}),
          "best_val_loss": protocol.best_loss(protocol.curve_points(run["curve"], suite.loss_key)),
          "steps_to_target": steps, "wall_time_to_target_s": wall,
          "examples_per_sec": examples_per_sec(result, run["curve"]),
          "bytes_sent_per_step": bytes_sent_per_step(result), "curve": run["curve_file"]}


def _arm_summary(arm: spec.Arm, suite: spec.Suite, paths: spec.RunPaths, raw: List[dict],
                 target: Optional[float]) -> dict:
  """An arm in summary.json: its config, per-run figures and their statistics, curves, churn."""
  runs = [_run_figures(run, suite, target) for run in raw]
  churn_path = _churn_path(arm, paths)
  return {
      "config": {k: v if not isinstance(v, tuple) else list(v)
                 for k, v in dataclasses.asdict(arm).items() if k != "scope"},
      "seeds": arm.seeds,
      "runs": runs,
      **{key: _stat([r[key] for r in runs]) for key in _STAT_KEYS},
      "reached_target": sum(r["steps_to_target"] is not None for r in runs),
      "started_above_nproc_load": sum(bool(r["started_above_nproc_load"]) for r in runs),
      "repeated_tokens": (None if any(r["repeated_tokens"] is None for r in runs)
                          else sum(r["repeated_tokens"] for r in runs)),
      "seed_curves": {str(seed): curve for seed, curve in
                      recorded_curves(arm, paths, suite.loss_key).items()},
      "group_curves": {f"{r['seed']}_{r['group']}": protocol.curve_points(r["curve"],
                                                                         suite.loss_key)
                       for r in raw},
      "group_staleness": {f"{r['seed']}_{r['group']}": protocol.curve_points(
          [c for c in r["curve"] if (c.get("alpha") or 0) > 0], "teacher_staleness")
                          for r in raw},
      "churn": machine.read_json(churn_path) if os.path.exists(churn_path) else None,
  }


def summarize(suite: spec.Suite, paths: spec.RunPaths,
              protocol_record: Optional[dict] = None) -> dict:
  """summary.json: per arm its config, per-run figures, aggregates; the target; the goals (with
  ``<goal>_interval`` where the goal gives one); the protocol's scaling and tuning record."""
  raw = {arm.name: _runs(arm, paths) for arm in suite.arms}
  target = _target(suite, paths, raw)
  arms = {arm.name: _arm_summary(arm, suite, paths, raw[arm.name], target) for arm in suite.arms}
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
          "goal_verdicts": verdicts.judge(goals, suite.goal_thresholds),
          "churn_at_matched_loss": protocol.churn_at_matched_loss(
              {n: (a.get("churn") or {}).get("curves", []) for n, a in arms.items()})}


def prepare(suite: spec.Suite, paths: spec.RunPaths, data: Sequence[str],
            run: Optional[RunFn] = None, only: Optional[Sequence[str]] = None
            ) -> Tuple[spec.Suite, dict]:
  """The suite as it runs (B* substituted, learning rates tuned) and the record of how: with
  ``run``, each arm's tuning runs and then the arm itself are run (only the arms named in
  ``only``, when given: the others must be recorded as far as those need them), arms that need
  nothing run before them handed to ``run`` together (it runs them at once where it can);
  without it, every run must be recorded already."""
  scaled = scaling(suite, paths, data, run)
  if scaled is None and suite.b_star is not None:
    scaled = {"b_star": suite.b_star, "given": True}
  arms, tuning, pending = [], {}, []

  def run_pending() -> None:
    if pending and run is not None:
      run(list(pending))
    pending.clear()

  for arm in suite.arms:
    arm_run = run if only is None or arm.name in only else None
    if arm.source_arm in {a.name for a in pending}:
      run_pending()  # the arm it is built from runs first
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
      pending.append(concrete)
    arms.append(concrete)
  run_pending()
  record = {"scaling": scaled, "tuning": tuning, "learning_rates": list(suite.learning_rates),
            "tuning_seed": suite.tuning_seed} if (scaled or tuning) else None
  return dataclasses.replace(suite, arms=arms), record


def check_tensorflow(suite: spec.Suite) -> None:
  """ValueError unless this environment has the TensorFlow version ``suite.tensorflow`` pins."""
  have = machine.tensorflow_version()
  if suite.tensorflow and have != suite.tensorflow:
    raise ValueError(
        f"suite {suite.name!r} runs on TensorFlow {suite.tensorflow} (its recorded runs were "
        f"taken on it), this environment has {have}: run it from a venv with "
        f"tensorflow=={suite.tensorflow} (make test-io builds .venv-tf217)")


def check_arm_names(suite: spec.Suite, names: Sequence[str]) -> None:
  """ValueError naming the unknown ones unless every name is one of the suite's arms."""
  unknown = [n for n in names if n not in {a.name for a in suite.arms}]
  if unknown:
    raise ValueError(f"suite {suite.name!r} has no arm(s) {unknown}; its arms: "
                     f"{[a.name for a in suite.arms]}")


def run_suite(suite: spec.Suite, paths: spec.RunPaths, force: bool = False,
              progress: Callable[[str], None] = print, quiet: machine.Quiet = machine.Quiet(),
              only: Optional[Sequence[str]] = None) -> Optional[dict]:
  """Runs (or reuses) every arm, then writes summary.json and returns it. With ``only`` (arm
  names) runs just those arms (a suite too long for one invocation goes on arm by arm) and
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

  def run_one(arm: spec.Arm) -> None:
    # An arm built from a source arm that was just rerun is rerun too.
    if run_arm(arm, suite, paths, data, force=force or arm.source_arm in ran, progress=progress,
               quiet=quiet, cpus=cpus):
      ran.add(arm.name)

  def run(arms: Sequence[spec.Arm]) -> None:
    _at_once(run_one, arms, cpus.size if cpus and max(map(_cpus_needed, arms)) == 1 else 1)

  concrete, record = prepare(suite, paths, data, run, only)
  if only is not None:
    return None
  return _write_summary(summarize(concrete, paths, record), paths, {
      "wall_time_s": time.time() - start, "arms_run": sorted(ran), "allow_load": quiet.allow_load})


def summarize_recorded(suite: spec.Suite, paths: spec.RunPaths) -> dict:
  """summary.json again from the recorded runs alone (trains nothing; every run must be there)."""
  # Data bindings only name tuning runs (their digest); other suites need no data prepared.
  tuned = suite.scaling_arm or any(a.tune_learning_rate for a in suite.arms)
  concrete, record = prepare(suite, paths, data_bindings(
      suite, paths.data_dir, paths.corpus_manifest, prepare_data=False) if tuned else [])
  return _write_summary(summarize(concrete, paths, record), paths, {"report_only": True})


def _write_summary(summary: dict, paths: spec.RunPaths, invocation: dict) -> dict:
  """Writes ``summary`` with what this invocation did (``this_invocation``) as summary.json."""
  summary["this_invocation"] = invocation
  path = os.path.join(paths.results_dir, "summary.json")
  machine.write_json(path, summary, indent=1)
  logging.info("wrote %s", path)
  return summary
