"""Trains one codistillation group: data -> model -> fit with exchange and teacher callbacks.

Data path: ``dataset_fn`` (data_pipelines) -> ``CodistillModel`` wrapping ``model_fn()``, with a
``exchange_config.Exchange`` -> ``fit``, which publishes every K steps and swaps in peers' newest
versions (``codistill_hooks.exchange_hooks``) -> final evaluation, export and ``results.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import gin
import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from data_pipelines import criteo
from tf_codistill import errors
from tf_codistill import filesystems
from tf_codistill import layout
from tf_codistill import metrics as metrics_lib
from tf_codistill import step_hooks
from tf_codistill.exchange import config as exchange_config
from tf_codistill.exchange import directory as exchange
from tf_codistill.exchange import lean_versions
from tf_codistill.exchange import publishing
from tf_codistill.exchange import topology
from tf_codistill.models import ctr
from tf_codistill.optim import comm
from tf_codistill.optim import fused_models
from tf_codistill.optim import fusion as fusion_lib
from tf_codistill.step_hooks import current_step
from tf_codistill.training import checkpointing
from tf_codistill.training import codistill_hooks
from tf_codistill.training import monitoring
from tf_codistill.training import step_timing
from tf_codistill.training import strategies
from tf_codistill.training import tasks as tasks_lib
from tf_codistill.training.model import CodistillModel
from tf_codistill.training.model import clone_architecture

DATA_SPLITS = ("disjoint", "same")
SKIPPED_LINES_TAG = "data/skipped_lines"
OPTIMIZERS = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD,
              "adagrad": keras.optimizers.Adagrad, "rmsprop": keras.optimizers.RMSprop}


ConfigurationError = errors.ConfigurationError
DataError = criteo.DataError
NonFiniteLossError = errors.NonFiniteLossError
_MALFORMED_RE = re.compile(r"(malformed [^\[\]\n]*? (line|row|record) [^\]\n]*)")
_MALFORMED_AT_RE = re.compile(r" (?:line|row|record) (.+?):\d+: ")  # the file of a message
_RESCAN_BATCH = 1024

# Learning-rate schedules for trainer.train.learning_rate, e.g.
#   trainer.train.learning_rate = @schedules.PiecewiseConstantDecay()
#   schedules.PiecewiseConstantDecay.boundaries = [1000]
#   schedules.PiecewiseConstantDecay.values = [1e-3, 1e-4]
for _schedule in (keras.optimizers.schedules.PiecewiseConstantDecay,
                  keras.optimizers.schedules.ExponentialDecay,
                  keras.optimizers.schedules.CosineDecay):
  gin.external_configurable(_schedule, module="schedules")


PRECISIONS = exchange_config.PRECISIONS


@gin.configurable("train", module="trainer")
@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How one group trains: every ``trainer.train.<name>`` gin binding, typed; ``validate``
  checks it once, in the launcher for every group and in every task.

  ``strategy`` is one of strategies.KINDS; with a cluster it is read from TF_CONFIG, and workers
  and ps tasks of a parameter-server group only serve. With ``codistill=True`` the group's chief
  publishes to the exchange directory every ``exchange_every_steps`` steps and every training
  task distills from the other groups' newest published versions: of every other group
  (``teacher_graph='all_to_all'``) or of its predecessor only (``'ring'``), run in
  ``teacher_precision`` (or built by ``teacher_fn(student)``, e.g. ``@models.ctr_teacher``, whose
  own layers set the precision), each version published as ``publish_format`` (a SavedModel, or a
  lean version: ``@tfc.PublishFormat()``, lean_versions.py); ``wait_for_first_teachers_s`` holds a
  group that runs ahead until its peers' first versions are loaded (exchange_config.Exchange).
  ``data_split='disjoint'`` gives each group (and each of its input pipelines) its own shard of
  ``train_files``; ``batch_size`` is the global batch of one step; exactly ``train_steps`` steps
  run, evaluated every ``steps_per_epoch``.
  ``task`` (default ``tasks.BinaryTask()``) sets the loss, metrics and results keys;
  ``prediction_batches`` caps the eval batches whose predictions ``save_eval_predictions`` keeps
  (``eval_predictions.npz``; with ``prediction_history`` also at every evaluation, for churn vs
  loss). ``fusion`` ('none', 'kernels', 'backward', 'forward') fuses the optimizer's updates
  (fusion.py);
  ``allreduce_dtype`` is the precision of a synchronous group's gradient all-reduce (comm.py).
  ``intra_op_threads`` and ``inter_op_threads`` (0: TF's default) size this task's thread pools,
  also a serving task's. The chief writes ``heartbeat.json`` every ``heartbeat_every_s``;
  ``max_wall_seconds`` ends training early, as if ``train_steps`` were reached (not for
  ``multi_worker_mirrored``); ``save_step_timeline`` writes every timed step interval (under
  parameter servers one per scheduled step, step_timing.ClosureTimer) and refresh/publish window
  (benchmarks/soak.py). Files: layout.RunDir.
  """
  strategy: str = "one_device"
  train_files: Sequence[str] = ()
  eval_files: Sequence[str] = ()
  dataset_fn: Callable[..., tf.data.Dataset] = criteo.make_dataset
  model_fn: Callable[[], keras.Model] = ctr.ctr_model
  task: Optional[tasks_lib.Task] = None
  batch_size: int = 512
  train_steps: int = 1000
  steps_per_epoch: int = 250
  steps_per_execution: int = 1
  eval_steps: Optional[int] = None
  shuffle_buffer: int = 10_000
  optimizer: str = "adam"
  learning_rate: Union[float, keras.optimizers.schedules.LearningRateSchedule] = 1e-3
  codistill: bool = False
  alpha: float = 1.0
  burn_in_steps: int = 0
  distill_kind: str = "xent"
  temperature: float = 1.0
  teacher_graph: str = "all_to_all"
  teacher_precision: str = "float32"
  teacher_fn: Optional[Callable[[keras.Model], keras.Model]] = None
  publish_format: lean_versions.PublishFormat = lean_versions.PublishFormat()
  exchange_every_steps: int = 100
  keep_last: int = 2
  poll_interval_s: float = 2.0
  wait_for_first_teachers_s: float = 0.0
  data_split: str = "disjoint"
  label_smoothing: float = 0.0
  smoothing_prior: str = "uniform"
  checkpoint_every_steps: int = 500
  summary_every_steps: int = 50
  seed: int = 0
  save_eval_predictions: bool = False
  prediction_batches: Optional[int] = None
  prediction_history: bool = False
  fusion: str = "none"
  allreduce_dtype: str = "float32"
  jit_compile: bool = False
  intra_op_threads: int = 0
  inter_op_threads: int = 0
  heartbeat_every_s: float = 5.0
  max_wall_seconds: Optional[float] = None
  save_step_timeline: bool = False
  verbose: int = 2


def validate(config: TrainConfig, *, group: int, num_groups: int,
             exchange_dir: Optional[str]) -> None:
  """Raises ConfigurationError naming the first setting of group ``group`` that cannot work.

  The one check of a configuration: the launcher runs it for every group before starting any,
  and every task before it trains.
  """
  _validate(group, num_groups, config.codistill, exchange_dir, config.data_split,
            config.optimizer)
  _validate_comm(config.strategy, config.fusion, config.allreduce_dtype)
  _validate_numbers(train_steps=config.train_steps, steps_per_epoch=config.steps_per_epoch,
                    batch_size=config.batch_size, steps_per_execution=config.steps_per_execution,
                    exchange_every_steps=config.exchange_every_steps, keep_last=config.keep_last,
                    checkpoint_every_steps=config.checkpoint_every_steps)
  if config.wait_for_first_teachers_s and config.strategy == "parameter_server":
    raise ConfigurationError("trainer.train.wait_for_first_teachers_s cannot hold a "
                             "parameter_server group (its steps are scheduled regardless of "
                             "hooks): unbind it")
  if config.max_wall_seconds is not None and config.strategy == "multi_worker_mirrored":
    raise ConfigurationError("trainer.train.max_wall_seconds cannot end a multi_worker_mirrored "
                             "group (its workers would wait for the chief): unbind it")
  if config.teacher_graph not in topology.GRAPHS:
    raise ConfigurationError(
        f"trainer.train.teacher_graph={config.teacher_graph!r} is not one of {topology.GRAPHS}")
  if config.teacher_precision not in PRECISIONS:
    raise ConfigurationError(f"trainer.train.teacher_precision={config.teacher_precision!r} is "
                             f"not one of {list(PRECISIONS)}")
  if config.teacher_fn is not None and config.teacher_precision != "float32":
    raise ConfigurationError(
        f"trainer.train.teacher_precision={config.teacher_precision!r} applies to cloned "
        "teachers, and trainer.train.teacher_fn is bound: set the precision in teacher_fn's own "
        "bindings (e.g. models.ctr_teacher.dtype_policy) and unbind teacher_precision")
  for name in ("train_files", "eval_files"):
    if not getattr(config, name):
      raise ConfigurationError(
          f"trainer.train.{name} is empty: bind it, e.g. "
          f"--gin_bindings=\"trainer.train.{name} = ['data/{name.split('_')[0]}-*']\"")


def teacher_factory(teacher_fn: Optional[Callable[[keras.Model], keras.Model]],
                    student: keras.Model) -> Optional[Callable[[], keras.Model]]:
  """CodistillModel's ``teacher_factory`` from ``trainer.train.teacher_fn``: a teacher_fn that
  cannot build a teacher of this student raises ConfigurationError naming the binding (a
  permanent failure, not one a restart fixes)."""
  if teacher_fn is None:
    return None

  def make() -> keras.Model:
    try:
      return teacher_fn(student)
    except ValueError as e:
      raise ConfigurationError(f"trainer.train.teacher_fn: {e}") from None
  return make


def train(model_dir: str, *, group: int = 0, num_groups: int = 1,
          exchange_dir: Optional[str] = None, **settings) -> Dict[str, float]:
  """Runs this process's part of group ``group`` of ``num_groups``; the chief returns its metrics.

  ``settings`` override fields of ``TrainConfig`` (the others come from gin bindings). Workers
  and ps tasks of a parameter-server group serve until stopped (this call then never returns).

  Failures that a restart cannot fix raise before training starts where they can be seen then:
  ConfigurationError (flags, bindings, TF_CONFIG, unwritable directories, missing files) and
  DataError (an empty file, a malformed line under ``bad_lines='error'``, naming file and line;
  also raised mid-training). A NaN/Inf loss raises NonFiniteLossError naming the step, before
  that step is checkpointed or published.
  """
  config = TrainConfig(**settings)
  validate(config, group=group, num_groups=num_groups, exchange_dir=exchange_dir)
  return GroupTrainer(config, model_dir, group, num_groups, exchange_dir).run()


@dataclasses.dataclass
class _Data:
  """A group's input: its training pipeline (a function of the input context), evaluation set,
  probe batch of real inputs, input spec and counter of skipped records."""
  train: Callable[..., tf.data.Dataset]
  evaluation: tf.data.Dataset
  probe: Any
  input_spec: Any
  bad_lines: criteo.BadLineCounter

  @property
  def sample(self):
    return codistill_hooks.sample_batch(self.input_spec)


@dataclasses.dataclass
class _Callbacks:
  """What ``fit`` runs, and the parts of it the results are read from."""
  fit: List[keras.callbacks.Callback]
  evaluation: monitoring.LocalEvaluation
  hooks: List[step_hooks.StepHook] = dataclasses.field(default_factory=list)  # run by fit
  initial_epoch: int = 0
  summary_writer: Optional[tf.summary.SummaryWriter] = None
  step_summaries: Optional[monitoring.StepSummaries] = None
  step_timer: Optional[Union[step_timing.StepTimer, step_timing.ClosureTimer]] = None


class GroupTrainer:
  """One group's training in this process: ``run`` builds the data, the model and the
  callbacks, fits, and (on the chief) evaluates, exports and writes the results."""

  def __init__(self, config: TrainConfig, model_dir: str, group: int = 0, num_groups: int = 1,
               exchange_dir: Optional[str] = None):
    self.config = config
    self.model_dir = model_dir
    self.group = group
    self.num_groups = num_groups
    self.exchange_dir = exchange_dir
    self.run_dir = layout.RunDir(model_dir)
    self.task = config.task or tasks_lib.BinaryTask()
    self.peers = (topology.teacher_groups(group, num_groups, config.teacher_graph)
                  if config.codistill else [])
    self.info = strategies.task_info(config.strategy)

  def run(self) -> Dict[str, float]:
    """Trains (or, on a parameter-server worker or ps task, serves until stopped)."""
    self._prepare_process()
    if self.info.serves_only:
      # Blocks until the launcher (or the cluster manager) stops the task.
      strategies.serve(self.info, strategies.server_config(self.config.inter_op_threads,
                                                           self.config.intra_op_threads))
      return {}
    distribution = strategies.make_strategy(self.config.strategy)
    if self.config.batch_size % distribution.num_replicas_in_sync:
      raise ConfigurationError(
          f"trainer.train.batch_size={self.config.batch_size} (the global batch) must be "
          f"divisible by the {distribution.num_replicas_in_sync} replicas of strategy "
          f"{self.config.strategy!r}")
    keras.utils.set_random_seed(self.config.seed * 7919 + self.group)
    tf.io.gfile.makedirs(self.model_dir)
    start = time.time()
    data = self.build_data()
    model, local = self.build_model(distribution, data)
    callbacks = self.build_callbacks(model, local, data)
    history = self.fit(model, data, local, callbacks)
    model.flush_fusion()
    digest = weights_digest(model.student)
    logging.info("final student weights digest (%s:%d): %s", self.info.task_type or "local",
                 self.info.task_id, digest)
    if not self.info.is_chief:
      return {}
    return self.finalize(model, local, data, callbacks, history,
                         {"wall_time_s": time.time() - start, "weights_digest": digest})

  def _prepare_process(self) -> None:
    config = self.config
    filesystems.ensure_filesystems([self.model_dir, self.exchange_dir, *config.train_files,
                                    *config.eval_files])
    if self.info.is_chief:
      exchange.check_writable(self.model_dir, "--model_dir")
      if config.codistill:
        exchange.check_writable(exchange.group_dir(self.shared_exchange, self.group),
                                "--exchange_dir")
    if config.intra_op_threads:
      tf.config.threading.set_intra_op_parallelism_threads(config.intra_op_threads)
    if config.inter_op_threads:
      tf.config.threading.set_inter_op_parallelism_threads(config.inter_op_threads)

  def build_data(self) -> _Data:
    """The group's pipelines, checked: files exist, the evaluation set and this group's shard
    of the training data hold valid examples."""
    config, group, num_groups = self.config, self.group, self.num_groups
    bad_lines = criteo.BadLineCounter()

    def train_dataset(context: Optional[tf.distribute.InputContext] = None,
                      repeat: bool = True) -> tf.data.Dataset:
      pipelines, pipeline = ((context.num_input_pipelines, context.input_pipeline_id)
                             if context else (1, 0))
      batch = context.get_per_replica_batch_size(config.batch_size) if context \
          else config.batch_size
      groups, index = (num_groups, group) if config.data_split == "disjoint" else (1, 0)
      return config.dataset_fn(
          list(config.train_files), batch, shard_index=index * pipelines + pipeline,
          num_shards=groups * pipelines, repeat=repeat, shuffle_buffer=config.shuffle_buffer,
          seed=config.seed * 7919 + group * 101 + pipeline,
          bad_line_counter=None if context else bad_lines)

    with _data_errors(config.dataset_fn):
      evaluation = _open_files("eval_files", lambda: config.dataset_fn(
          list(config.eval_files), config.batch_size, bad_line_counter=bad_lines))
      # A few real examples: published models and loaded teachers must predict finite values.
      probe = codistill_hooks.probe_batch(evaluation)
      _check_train_data(_open_files("train_files", lambda: train_dataset(repeat=False)),
                        config.train_files, group, num_groups, config.data_split)
      bad_lines.reset()  # the checks read lines the training reads again
    return _Data(train_dataset, evaluation, probe, evaluation.element_spec[0], bad_lines)

  def build_model(self, distribution: tf.distribute.Strategy, data: _Data
                  ) -> Tuple[CodistillModel, publishing.LocalCopy]:
    """The compiled CodistillModel (student and teacher variables created) and a local copy of
    its student for evaluation, publishing and export."""
    config = self.config
    prior = (self.task.estimate_prior(list(config.train_files), data.train())
             if config.label_smoothing and config.smoothing_prior == "unigram" else None)
    try:
      task_loss = self.task.task_loss(config.label_smoothing, config.smoothing_prior, prior)
    except ValueError as e:
      raise ConfigurationError(f"trainer.train.label_smoothing/smoothing_prior: {e}") from None
    with distribution.scope():
      student = config.model_fn()
      reducer = (comm.GradientReducer(config.allreduce_dtype)
                 if config.allreduce_dtype != "float32" else None)
      model = CodistillModel(
          student, exchange=self.exchange_config(data.input_spec),
          teacher_factory=teacher_factory(config.teacher_fn, student),
          alpha=config.alpha,
          burn_in_steps=config.burn_in_steps, output=self.task.output,
          distill_kind=config.distill_kind, temperature=config.temperature,
          fusion=config.fusion, reducer=reducer, fusion_binding="trainer.train.fusion")
      try:
        model.compile(optimizer=OPTIMIZERS[config.optimizer](learning_rate=config.learning_rate),
                      loss=task_loss, metrics=self.task.metrics(),
                      steps_per_execution=config.steps_per_execution,
                      jit_compile=config.jit_compile)
      except fusion_lib.FusionError as e:
        raise ConfigurationError(str(e)) from e
    model(data.sample)  # student and teacher variables exist before a teacher is restored
    # Pending forward-fusion updates are applied before every read of the weights for a
    # checkpoint, a publish, an evaluation or the export.
    local = publishing.LocalCopy(student, clone_architecture(student),
                                 before_snapshot=model.flush_fusion)
    local.model(data.sample)
    return model, local

  @property
  def shared_exchange(self) -> str:
    """The exchange directory every group shares (validate: codistillation needs one)."""
    if not self.exchange_dir:
      raise ConfigurationError("codistillation needs --exchange_dir")
    return self.exchange_dir

  def exchange_config(self, input_spec: Any = None) -> Optional[exchange_config.Exchange]:
    """Where and how this group exchanges models (None without codistillation); ``input_spec``
    is the student's (``fit`` under parameter servers reads no dataset to find it)."""
    config = self.config
    if not config.codistill:
      return None
    return exchange_config.Exchange(
        self.shared_exchange, self.group, self.num_groups, config.teacher_graph,
        publish_every_steps=config.exchange_every_steps, keep_last=config.keep_last,
        poll_interval_s=config.poll_interval_s, teacher_precision=config.teacher_precision,
        publish_format=config.publish_format,
        wait_for_first_teachers_s=config.wait_for_first_teachers_s, input_spec=input_spec)

  def _predictions_of(self, data: _Data) -> tf.data.Dataset:
    batches = self.config.prediction_batches
    return data.evaluation if batches is None else data.evaluation.take(batches)

  def _chief_callbacks(self, local: publishing.LocalCopy, data: _Data,
                       callbacks: _Callbacks) -> Tuple[List[step_hooks.StepHook],
                                                       List[keras.callbacks.Callback]]:
    """The chief's step hooks (heartbeat, step timing, summaries) and epoch callbacks."""
    config, run = self.config, self.run_dir
    callbacks.summary_writer = tf.summary.create_file_writer(run.step_summaries)
    callbacks.step_summaries = monitoring.StepSummaries(
        callbacks.summary_writer, config.batch_size, config.summary_every_steps,
        counters={SKIPPED_LINES_TAG: lambda: data.bad_lines.count})
    hooks = [monitoring.Heartbeat(run.heartbeat, config.heartbeat_every_s,
                                  f"{self.info.task_type or 'chief'}:{self.info.task_id}"),
             callbacks.step_summaries]
    parameter_server = config.strategy == "parameter_server"
    if parameter_server:  # each scheduled step, timed as it finishes (a batch callback)
      callbacks.step_timer = step_timing.ClosureTimer(config.steps_per_execution)
    else:
      callbacks.step_timer = step_timing.StepTimer(config.steps_per_epoch)
      hooks.append(callbacks.step_timer)
    if config.max_wall_seconds is not None:
      hooks.append(step_hooks.WallClockLimit(config.max_wall_seconds))
    epoch_callbacks = [
        callbacks.evaluation,
        keras.callbacks.TensorBoard(run.tensorboard, update_freq="epoch"),
        monitoring.ProgressLog(run.progress, self.group, config.train_steps,
                               rates=callbacks.step_summaries.examples_per_sec)]
    if parameter_server:
      epoch_callbacks.append(callbacks.step_timer)
    if config.save_eval_predictions and config.prediction_history:
      epoch_callbacks.append(monitoring.PredictionHistory(
          local, self._predictions_of(data), self.task.output, run.prediction_history,
          _save_npz))
    return hooks, epoch_callbacks

  def build_callbacks(self, model: CodistillModel, local: publishing.LocalCopy,
                      data: _Data) -> _Callbacks:
    """Checkpoints, evaluation and monitoring (the chief's), the NaN guard, the exact step
    limit and the exchange of models."""
    config = self.config
    evaluation = monitoring.LocalEvaluation(local, data.evaluation, self.task.task_loss(),
                                            self.task.metrics, config.eval_steps)
    callbacks = _Callbacks(fit=[], evaluation=evaluation)
    hooks: List[step_hooks.StepHook] = []
    epoch_callbacks: List[keras.callbacks.Callback] = []
    if self.info.is_chief:
      hooks, epoch_callbacks = self._chief_callbacks(local, data, callbacks)
    parameter_server = config.strategy == "parameter_server"
    if parameter_server:
      checkpoints = checkpointing.EpochCheckpoint(self.run_dir.checkpoints, model,
                                                  before_save=model.flush_fusion)
      callbacks.initial_epoch = checkpoints.restore() // config.steps_per_epoch
      epoch_callbacks.insert(0, checkpoints)
    else:
      epoch_callbacks.insert(0, fused_models.BackupAndRestore(
          self.run_dir.backup, model.flush_fusion, save_freq=config.checkpoint_every_steps))
    guard = step_hooks.NonFiniteGuard()
    if parameter_server:
      # The guard runs first in fit's polling thread; it makes the driver stop training.
      callbacks.hooks = [guard] + hooks
      callbacks.fit = epoch_callbacks
    else:
      # The guard comes first: a NaN step is never checkpointed (BackupAndRestore) or published.
      callbacks.hooks = hooks
      callbacks.fit = [guard] + epoch_callbacks
    callbacks.fit.append(step_hooks.StepLimit(config.train_steps, config.steps_per_epoch))
    return callbacks

  def fit(self, model: CodistillModel, data: _Data, local: publishing.LocalCopy,
          callbacks: _Callbacks) -> keras.callbacks.History:
    """``model.fit`` for exactly ``train_steps`` steps; a NaN/Inf loss raises
    NonFiniteLossError saying what was kept."""
    config = self.config
    dataset = data.train() if self.info.task_type is None else \
        keras.utils.experimental.DatasetCreator(data.train)
    try:
      with _data_errors(config.dataset_fn):
        epochs = max(1, -(-config.train_steps // config.steps_per_epoch))
        history = model.fit(dataset, epochs=epochs,
                            steps_per_epoch=config.steps_per_epoch,
                            initial_epoch=callbacks.initial_epoch, callbacks=callbacks.fit,
                            verbose=config.verbose if self.info.is_chief else 0,
                            hooks=callbacks.hooks,
                            exchange_options=codistill_hooks.HookOptions(
                                data.probe, callbacks.summary_writer, local))
    except NonFiniteLossError as e:
      raise NonFiniteLossError(_non_finite_message(
          str(e), self.model_dir, self.exchange_dir, self.group, config.strategy,
          config.codistill and self.info.is_chief), e.step) from None
    return history

  def finalize(self, model: CodistillModel, local: publishing.LocalCopy, data: _Data,
               callbacks: _Callbacks, history: keras.callbacks.History,
               extra: Dict[str, Any]) -> Dict[str, Any]:
    """The chief's end of training: final evaluation, export (refused if not finite),
    predictions, summaries, ``results.json`` and the step timeline."""
    config, run = self.config, self.run_dir
    step = current_step(model)
    final = callbacks.evaluation.evaluate()
    weights = local.snapshot()
    with local.at_step(step, weights) as final_model:
      problem = publishing.finiteness_problem(final_model, weights,
                                               exchange.ProbeForward(data.probe))
      if problem:
        raise NonFiniteLossError(f"the final model of step {step} is not exported: {problem}",
                                 step)
      exchange.save_model(final_model, run.export, data.input_spec)
    if config.save_eval_predictions:
      probs, labels = metrics_lib.model_probabilities(local.model, self._predictions_of(data),
                                                      self.task.output)
      _save_npz(run.eval_predictions, probs=probs, labels=labels)
    skipped = data.bad_lines.count
    if skipped:
      logging.warning("skipped %d malformed input lines (bad_lines='skip')", skipped)
    writer = callbacks.summary_writer
    if writer is not None:
      with writer.as_default(step=step):
        tf.summary.scalar(SKIPPED_LINES_TAG, skipped)
      writer.flush()
    results = self._results(model, callbacks, history, step, final,
                            {**extra, "skipped_lines": skipped, **_consumed(config, step, data)})
    exchange.write_atomically(run.results, json.dumps(results, indent=2, sort_keys=True))
    if config.save_step_timeline and callbacks.step_timer is not None:
      exchange.write_atomically(run.step_timeline, json.dumps(
          callbacks.step_timer.timeline(_windows(model.exchange_hooks))))
    logging.info("group %d done: %s steps=%d", self.group,
                 " ".join(f"{k}={v:.4f}" for k, v in sorted(self.task.results(final).items())),
                 step)
    return results

  def _results(self, model: CodistillModel, callbacks: _Callbacks,
               history: keras.callbacks.History, step: int, final: Dict[str, float],
               extra: Dict[str, Any]) -> Dict[str, Any]:
    """The contents of ``results.json``."""
    config = self.config
    rates = callbacks.step_summaries.examples_per_sec if callbacks.step_summaries else []
    results = {
        "group": self.group, "num_groups": self.num_groups, "strategy": config.strategy,
        "num_workers": self.info.num_workers, "codistill": config.codistill, "steps": step,
        **self.task.results(final),
        "teacher_graph": config.teacher_graph, "teacher_groups": self.peers,
        "teacher_precision": config.teacher_precision,
        "teacher_fn": (None if config.teacher_fn is None
                       else getattr(config.teacher_fn, "__name__", repr(config.teacher_fn))),
        "examples_per_sec": float(np.median(rates)) if rates else None,
        "history": {k: [float(v) for v in vals] for k, vals in history.history.items()},
        **extra,
    }
    hooks, timer = model.exchange_hooks, callbacks.step_timer
    if hooks is not None:
      results.update(
          **hooks.statistics(),
          teacher_steps=[int(s) for s in model.teacher_steps.numpy()],
          final_teacher_staleness=float(model.teacher_staleness().numpy()),
          # Step times of steps overlapping a refresh, a publish, an epoch end, or nothing.
          step_time_ms=timer.quantiles_ms(_windows(hooks)) if timer is not None else None)
    return results


def _windows(hooks: Optional[codistill_hooks.ExchangeHooks]
             ) -> Dict[str, Sequence[Tuple[float, float]]]:
  """The exchange hooks' windows (refreshes, publishes, the first teachers' wait), if any."""
  return {} if hooks is None else hooks.windows()


def _consumed(config: TrainConfig, step: int, data: _Data) -> Dict[str, Any]:
  """How much training data the group read: examples, and prediction targets (an LM's tokens)."""
  dims = data.evaluation.element_spec[1].shape[1:]
  per_example = int(np.prod(dims)) if dims.is_fully_defined() else None
  examples = step * config.batch_size
  return {"batch_size": config.batch_size, "data_split": config.data_split,
          "train_examples": examples,
          "train_targets": None if per_example is None else examples * per_example}


def _save_npz(path: str, **arrays: np.ndarray) -> None:
  """Writes arrays as .npz atomically through tf.io.gfile."""
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  exchange.write_atomically(path, buffer.getvalue())


def weights_digest(model: keras.Model) -> str:
  """SHA-256 of all weight values: equal on every replica of a synchronous group."""
  digest = hashlib.sha256()
  for value in model.get_weights():
    digest.update(np.ascontiguousarray(value).tobytes())
  return digest.hexdigest()


def _open_files(name: str, make: Callable[[], tf.data.Dataset]) -> tf.data.Dataset:
  """``make()``, with a missing file or pattern reported as the binding to fix."""
  try:
    return make()
  except FileNotFoundError as e:
    raise ConfigurationError(f"trainer.train.{name}: {str(e).splitlines()[0]}") from None


@contextlib.contextmanager
def _data_errors(dataset_fn: Callable[..., tf.data.Dataset]) -> Iterator[None]:
  """Turns a malformed-record error from ``dataset_fn``'s pipeline into DataError naming file and
  line (or row, or record) and the binding that skips such records."""
  try:
    yield
  except tf.errors.InvalidArgumentError as e:
    match = _MALFORMED_RE.search(e.message or "")
    if not match:
      raise
    kind = match.group(2)
    first = _first_malformed(dataset_fn, match.group(1).strip())
    raise DataError(f"{first}; fix the {kind}, or bind "
                    f"{_bad_lines_binding(dataset_fn)} = 'skip' to skip malformed {kind}s"
                    ) from None
  except DataError as e:
    raise DataError(str(e).splitlines()[0]) from None  # without gin's "In call to" line


def _first_malformed(dataset_fn: Callable[..., tf.data.Dataset], message: str) -> str:
  """The message for the first malformed record of the file ``message`` names, in file order.

  Shuffled, interleaved batches fail on whichever bad record a batch meets first; reading that
  file alone, in order and unshuffled, up to its first failing batch names its first bad record
  (``message`` if the file cannot be read again).
  """
  where = _MALFORMED_AT_RE.search(message)
  if not where:
    return message
  try:
    for _ in dataset_fn([where.group(1)], _RESCAN_BATCH):
      pass
  except tf.errors.InvalidArgumentError as e:
    match = _MALFORMED_RE.search(e.message or "")
    if match:
      return match.group(1).strip()
  except Exception:  # pylint: disable=broad-except
    pass  # the file cannot be read again here (an unbound gin parameter, gone): keep the first
  return message


def _bad_lines_binding(dataset_fn: Callable[..., tf.data.Dataset]) -> str:
  """``dataset_fn``'s bad_lines gin binding, e.g. ``criteo.make_dataset.bad_lines``."""
  module = getattr(dataset_fn, "__module__", "").rsplit(".", 1)[-1]
  return f"{module}.{getattr(dataset_fn, '__name__', 'dataset_fn')}.bad_lines"


def _check_train_data(dataset: tf.data.Dataset, train_files: Sequence[str], group: int,
                      num_groups: int, data_split: str) -> None:
  """Raises DataError if this group's training shard yields no example (every line bad)."""
  for _ in dataset.take(1):
    return
  shard = f"group {group}'s shard of {num_groups}" if data_split == "disjoint" else "the data"
  raise DataError(f"trainer.train.train_files {list(train_files)}: {shard} holds no valid "
                  "example (empty files, or every line malformed and skipped)")


def _non_finite_message(reason: str, model_dir: str, exchange_dir: Optional[str], group: int,
                        strategy: str, publishes: bool) -> str:
  """What stopped, and what was kept: the newest checkpoint and published version."""
  run = layout.RunDir(model_dir)
  if strategy == "parameter_server":
    checkpoint = tf.train.latest_checkpoint(run.checkpoints)
  else:
    checkpoint = tf.train.latest_checkpoint(os.path.join(run.backup, "chief"))
  kept = ["no checkpoint"]
  if checkpoint:
    kept = [f"last checkpoint {checkpoint} (step {checkpointing.checkpoint_step(checkpoint)}; a "
            "restart resumes from it)"]
  if publishes and exchange_dir:
    versions = exchange.list_versions(exchange_dir, group)
    kept.append(f"last published version {versions[0].path if versions else 'none'}")
  return (f"training stopped: {reason}; nothing of this step or later was checkpointed or "
          f"published; kept: {', '.join(kept)}. Lower trainer.train.learning_rate or check the "
          "input data")


def _validate_numbers(**values: int) -> None:
  for name, value in values.items():
    if value < 1:
      raise ConfigurationError(f"trainer.train.{name}={value} must be >= 1")


def _validate_comm(strategy: str, fusion: str, allreduce_dtype: str) -> None:
  if fusion not in fusion_lib.MODES:
    raise ConfigurationError(f"trainer.train.fusion={fusion!r} is not one of {fusion_lib.MODES}")
  if fusion == "forward" and strategy == "parameter_server":
    raise ConfigurationError(
        "trainer.train.fusion='forward' cannot run under strategy='parameter_server': "
        "asynchronous workers would overwrite each other's pending gradients; use 'backward'")
  if allreduce_dtype not in comm.DTYPES:
    raise ConfigurationError(f"trainer.train.allreduce_dtype={allreduce_dtype!r} is not one of "
                             f"{sorted(comm.DTYPES)}")
  if allreduce_dtype != "float32" and strategy not in ("mirrored", "multi_worker_mirrored"):
    raise ConfigurationError(
        f"trainer.train.allreduce_dtype={allreduce_dtype!r} needs a synchronous group "
        f"(strategy='multi_worker_mirrored' or 'mirrored'); strategy={strategy!r} has no "
        "gradient all-reduce")


def _validate(group: int, num_groups: int, codistill: bool, exchange_dir: Optional[str],
              data_split: str, optimizer: str) -> None:
  if num_groups < 1:
    raise ConfigurationError(f"--num_groups={num_groups} must be >= 1")
  if not 0 <= group < num_groups:
    raise ConfigurationError(f"--group={group} is out of range for --num_groups={num_groups}")
  if codistill and num_groups < 2:
    raise ConfigurationError("codistillation needs --num_groups >= 2 (or bind "
                             "trainer.train.codistill = False)")
  if codistill and not exchange_dir:
    raise ConfigurationError("codistillation needs --exchange_dir")
  if data_split not in DATA_SPLITS:
    raise ConfigurationError(f"trainer.train.data_split={data_split!r} is not one of {DATA_SPLITS}")
  if optimizer not in OPTIMIZERS:
    raise ConfigurationError(f"trainer.train.optimizer={optimizer!r} is not one of "
                             f"{sorted(OPTIMIZERS)}")
