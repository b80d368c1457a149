"""What a benchmark suite is: its arms (``bench.Arm``), its settings and goals
(``bench.Suite``), and where its runs go (``RunPaths``).

A suite is a gin file (``benchmarks/suites/<name>.gin``, read by ``load_suite``). It binds
``bench.*`` for itself, and the library's own settings for its runs: unscoped for every arm's
runs (``trainer.train.train_steps = 1500``), in an arm's gin scope for that arm's alone (the arm
``@codistill/bench.Arm()`` runs with ``codistill/tfc.Distillation.alpha = 1.0``). An arm built in
a nested scope (``@codistill/same/bench.Arm()``) takes the settings of each scope it is nested in,
outermost first, its own replacing theirs (gin's scoping, which also nests the ``bench.Arm``
fields); a scope may configure only the arms nested in it (a template). ``%B_STAR`` and
``%TWO_B_STAR`` stand for the batch the scaling phase finds and its double. A suite that
includes another changes the included arms' settings binding by binding (gin's rule: the last
binding of a setting counts); it cannot remove one. Every binding outside ``bench.*`` reaches the
runs, macros included, so a macro for the suite's own use belongs in ``bench.*`` settings
instead. runner.py runs a suite, reuse.py says which recorded runs still count,
goal_figures.py computes its goals.
"""

from __future__ import annotations

import dataclasses
import io
import os
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import gin
from gin import config_parser

import tf_codistill as tfc

# Imported for its gin configurables: the goal figures a Suite binds.
from benchmarks import goal_figures  # noqa: F401  # pylint: disable=unused-import
from benchmarks import verdicts
from tf_codistill import layout
from tf_codistill import losses
from tf_codistill.launch import gin_config

ARM_KINDS = ("train", "ensemble", "offline_distill")
DATA_KINDS = ("criteo_like", "adult", "kjv", "fashion_mnist", "debian_english", "debian_kernel")
# The Debian corpora (data_pipelines.debian_text): how each is built. GCIDE holds 3 lines of
# cp1252 among 1.2M (their pages are skipped and counted); a quarter of the kernel's C files
# (by a hash of their paths) is more text than any arm reads; its split goes by content, since
# its tools/ tree holds copies of headers under other paths.
CORPUS_MANIFEST = "corpus_manifest.json"  # in a corpus suite's results: the corpus its runs read
CORPORA = {"debian_english": ("english", {"bad_lines": "skip"}),
           "debian_kernel": ("kernel", {"bad_lines": "skip", "sample_fraction": 0.25,
                                        "split_by": "content"})}
LOSS_KEY = "val_logloss"  # the default Suite.loss_key (CTR)
TARGET_RULES = ("final", "best_sync")
TUNING_DIR = "tuning"  # results_dir/runs/tuning/<tuning_name>/lr_<value>/: tuning runs
# What %B_STAR and %TWO_B_STAR become in an arm's bindings: the runner puts B* and 2B* there.
PLACEHOLDERS = {"B_STAR": "{B*}", "TWO_B_STAR": "{2B*}"}


@gin.configurable(module="bench")
@dataclasses.dataclass(frozen=True)
class Arm:
  """One configuration of a suite.

  Attributes:
    name: identifier (directory and table name); default: the gin scope the arm is built in
      (``@sync_b/bench.Arm()`` is ``sync_b``), which a nested scope cannot be.
    gin_files: trainer gin files, relative to the repo's ``gin/`` directory or absolute.
    gin_bindings: the arm's own bindings, after the suite's ``common_bindings``.
    num_groups: codistillation groups in one run (1: no peers).
    seeds: independent runs (``trainer.train.seed`` = 0..seeds-1).
    strategy, workers_per_group, ps_per_group: each group's cluster (tfc.Group).
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
    scope: the gin scope the arm is built in (set from gin); the suite file's bindings in that
      scope are the arm's ``gin_bindings`` (``load_suite``).
    churn_pairs: the pairs of seeds whose churn the arm must record (each pair's runs are
      trained in one work dir, again if one of them was recorded elsewhere); empty: the
      disjoint pairs of ``seed_list`` (0-1, 2-3, ...). How churn is measured, not how runs
      train: not part of the arm's recorded configuration.
  """
  name: str = ""
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
  scope: str = ""
  churn_pairs: Sequence[Sequence[int]] = ()

  @property
  def seed_list(self) -> range:
    return range(self.seed_offset, self.seed_offset + self.seeds)

  @property
  def shape(self) -> tfc.Group:
    """Each group's strategy and tasks, as the launcher starts them."""
    return tfc.Group(self.strategy, self.workers_per_group, self.ps_per_group, "float32")

  def __post_init__(self):
    if not self.scope:
      object.__setattr__(self, "scope", gin.current_scope_str())
      if not self.name and "/" not in self.scope:
        object.__setattr__(self, "name", self.scope)
    if self.kind not in ARM_KINDS:
      raise ValueError(f"arm {self.name!r}: kind={self.kind!r} is not one of {ARM_KINDS}")
    if self.kind != "train" and not self.source_arm:
      raise ValueError(f"arm {self.name!r}: kind={self.kind!r} needs source_arm")
    if self.seeds < 1:
      raise ValueError(f"arm {self.name!r}: seeds={self.seeds} must be >= 1")
    for pair in self.churn_pairs:
      if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(self.seed_list):
        raise ValueError(f"arm {self.name!r}: churn_pairs entry {tuple(pair)} must be two "
                         f"different seeds of {list(self.seed_list)}")
    if len({frozenset(p) for p in self.churn_pairs}) < len(self.churn_pairs):
      raise ValueError(f"arm {self.name!r}: churn_pairs {list(self.churn_pairs)} name a pair twice")


@gin.configurable(module="bench")
@dataclasses.dataclass(frozen=True)
class Suite:
  """A benchmark suite: arms, shared bindings, data, target loss and goal figures.

  Attributes:
    name: the suite's name (results go to ``results_dir/<name>``).
    arms: the arms, run in order (a source arm must come before the arms built from it).
    description: what claim the suite reproduces, for the report.
    common_bindings: bindings every trained arm gets (sizes, steps, eval cadence): the suite
      file's unscoped bindings of the library's settings (``load_suite``).
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
    debs_dir: a folder holding a Debian corpus's ``.deb`` files (default: ``<corpus>.debs``
      beside the corpus, filled by ``apt-get download`` while the corpus is built, and kept).
      Where the suite's results hold ``corpus_manifest.json`` (runs are recorded), the corpus is
      built from exactly the package versions it records.
    eval_pattern: a Debian corpus's validation shards (a glob in its ``tokens/``), e.g. one of
      them, so that evaluation costs a fixed, small share of the step budget.
    pin_runs: every group gets a CPU of its own (machine.CpuPool), and runs that need fewer
      CPUs than the machine has (tuning runs, seeds of a single-group arm) go on at once, each
      on its own CPUs. Only for suites whose figures count steps, not seconds.
    tensorflow: the TensorFlow version every run must use (a suite whose recorded runs were taken
      on one version keeps it when the default install moves on); run_suite refuses another.
    resume_every_steps: runs checkpoint every that many steps (``tfc.Checkpoints.every_steps``,
      not part of an arm's configuration: it changes no step), and a seed whose run was stopped
      (killed, or ended with its time on the machine) goes on from its groups' newest
      checkpoints, its input past the batches it read (``tfc.Checkpoints.resume_input``),
      instead of starting over. Each part's start (step, load) is recorded with the run
      (``parts``). None: every run starts over.
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
  resume_every_steps: Optional[int] = None

  def __post_init__(self):
    if self.data not in DATA_KINDS:
      raise ValueError(f"suite {self.name!r}: data={self.data!r} is not one of {DATA_KINDS}")
    if self.output not in losses.OUTPUTS:
      raise ValueError(f"suite {self.name!r}: output={self.output!r} is not one of "
                       f"{losses.OUTPUTS}")
    for arm in [*self.arms, *([self.scaling_arm] if self.scaling_arm else [])]:
      if not arm.name:
        raise ValueError(f"suite {self.name!r}: the arm built in scope {arm.scope!r} needs a "
                         f"name: bind {arm.scope + '/' if arm.scope else ''}bench.Arm.name")
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
      if threshold[0] not in verdicts.OPS or len(threshold) not in (2, 3):
        raise ValueError(f"suite {self.name!r}: goal_thresholds[{goal!r}]={threshold!r} is not "
                         f"(op, value) or (op, value, interval bound) with op in "
                         f"{list(verdicts.OPS)}")
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


def load_suite(files: Sequence[str], bindings: Sequence[str] = ()) -> Suite:
  """The suite that gin ``files`` and ``bindings`` describe, each arm holding its own settings.

  Raises:
    gin_config.ConfigError: a file or binding gin refuses (an unknown setting, a wrong type).
    ValueError: an invalid suite, or library settings bound in a scope no arm is built in.
  """
  gin_config.parse_gin(files, bindings)
  suite = Suite()
  statements = list(_binding_statements(files, bindings))
  settings = _run_settings(statements)
  common = list(settings.pop("", {}).values())
  for binding in common:
    if any(placeholder in binding for placeholder in PLACEHOLDERS.values()):
      raise ValueError(f"{binding.split(' =')[0]} is bound to %B_STAR or %TWO_B_STAR outside an "
                       "arm's scope: B* is an arm's batch, bind it as <arm scope>/...")

  def own(arm: Optional[Arm]) -> Optional[Arm]:
    if arm is None or not arm.scope:
      return arm
    return dataclasses.replace(arm, gin_bindings=[*arm.gin_bindings,
                                                  *_scope_settings(settings, arm.scope)])
  arms = [own(arm) for arm in suite.arms]
  scaling_arm = own(suite.scaling_arm)
  # An arm the suite does not run (an included suite's) may keep its settings; a scope that
  # configures no arm at all, itself or nested in it, is a typo.
  arm_scopes = {s.scope for s in statements if s.selector == "bench.Arm"}
  arm_scopes |= {a.scope for a in [*arms, scaling_arm] if a}
  used = {prefix for arm_scope in arm_scopes for prefix in _scope_prefixes(arm_scope)}
  orphans = sorted(set(settings) - used)
  if orphans:
    scope = orphans[0]
    raise ValueError(f"{next(iter(settings[scope]))} is bound in scope {scope!r}, but no arm is "
                     f"built in that scope or one nested in it (arms: "
                     f"{', '.join(f'@{a.scope}/bench.Arm()' for a in arms if a.scope)})")
  return dataclasses.replace(suite, arms=arms, scaling_arm=scaling_arm,
                             common_bindings=[*suite.common_bindings, *common])


def _scope_prefixes(scope: str) -> List[str]:
  """The gin scopes whose bindings an arm built in ``scope`` takes, outermost first:
  'codistill/long' -> ['codistill', 'codistill/long']."""
  parts = scope.split("/")
  return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _scope_settings(settings: Mapping[str, Mapping[str, str]], scope: str) -> List[str]:
  """An arm's own library settings: those of each scope it is nested in, outermost first, an
  inner scope's binding of a setting replacing the outer one's in place (gin's rule)."""
  merged: Dict[str, str] = {}
  for prefix in _scope_prefixes(scope):
    merged.update(settings.get(prefix, {}))
  return list(merged.values())


def _run_settings(statements: Sequence[config_parser.BindingStatement]
                  ) -> Dict[str, Dict[str, str]]:
  """The library settings a suite's binding ``statements`` give its runs, as bindings:
  {scope: {setting: "selector.name = value"}} ('' for every arm), in the order first written; a
  later binding of a setting replaces its value in place (gin's rule: the last one counts)."""
  settings: Dict[str, Dict[str, str]] = {}
  for statement in statements:
    if statement.selector.startswith("bench."):
      continue
    key = ".".join(filter(None, (statement.selector, statement.arg_name)))
    settings.setdefault(statement.scope, {})[key] = f"{key} = {statement.value!r}"
  return settings


class _AsWritten:
  """A gin reference kept as text (``@fn``, ``@fn()``, ``%MACRO``), so a value's repr is gin."""

  def __init__(self, text: str):
    self.text = text

  def __repr__(self) -> str:
    return self.text


class _KeepReferences(config_parser.ParserDelegate):

  def configurable_reference(self, scoped_configurable_name, evaluate):
    return _AsWritten(f"@{scoped_configurable_name}{'()' if evaluate else ''}")

  def macro(self, macro_name):
    return _AsWritten(PLACEHOLDERS.get(macro_name, f"%{macro_name}"))


def _binding_statements(files: Sequence[str], bindings: Sequence[str]
                        ) -> Iterator[config_parser.BindingStatement]:
  """The binding statements of ``files`` (their includes where they stand, found where gin
  finds them) then ``bindings``."""
  prefixes = gin_config.search_path(files)

  def read(text: str, name: Optional[str]) -> Iterator[config_parser.BindingStatement]:
    source = io.StringIO(text)
    source.name = name  # type: ignore[misc]  # named in gin's syntax errors
    for statement in config_parser.ConfigParser(source, _KeepReferences()):
      if isinstance(statement, config_parser.IncludeStatement):
        path = next((os.path.join(prefix, statement.filename) for prefix in prefixes
                     if os.path.exists(os.path.join(prefix, statement.filename))), None)
        if path is None:  # gin's own parse, which looks in the same places, refused it first
          raise gin_config.ConfigError(f"{name}: include {statement.filename!r} is in none of "
                                       f"{prefixes}")
        yield from read(_text(path), path)
      elif isinstance(statement, config_parser.BindingStatement):
        yield statement
  for path in files:
    yield from read(_text(path), path)
  for binding in bindings:
    yield from read(binding, None)


def _text(path: str) -> str:
  with open(path) as f:
    return f.read()


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
