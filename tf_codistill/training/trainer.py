"""Trains one codistillation group: data -> model -> fit with exchange and teacher callbacks.

Data path: ``dataset_fn`` (data_pipelines, ``inputs.build``) -> ``CodistillModel`` wrapping
``model_fn()``, with a ``exchange_config.Exchange`` -> ``fit`` with ``fit_callbacks.build``'s
callbacks, which publishes every K steps and swaps in peers' newest versions
(``codistill_hooks.exchange_hooks``) -> final evaluation, export and ``results.json``
(``results``). The configuration and its checks are ``train_config``'s.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from tf_codistill import errors
from tf_codistill import filesystems
from tf_codistill import layout
from tf_codistill import metrics as metrics_lib
from tf_codistill import serving
from tf_codistill.exchange import config as exchange_config
from tf_codistill.exchange import directory as exchange
from tf_codistill.exchange import publishing
from tf_codistill.optim import comm
from tf_codistill.step_hooks import current_step
from tf_codistill.training import codistill_hooks
from tf_codistill.training import connections
from tf_codistill.training import fit_callbacks
from tf_codistill.training import inputs
from tf_codistill.training import results as results_lib
from tf_codistill.training import strategies
from tf_codistill.training import tasks as tasks_lib
from tf_codistill.training import train_config
from tf_codistill.training.model import CodistillModel
from tf_codistill.training.model import clone_architecture
from tf_codistill.training.train_config import TrainConfig

ConfigurationError = errors.ConfigurationError
NonFiniteLossError = errors.NonFiniteLossError
__all__ = ["GroupTrainer", "train"]


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
  config = train_config.from_bindings(**settings)
  train_config.validate(config, group=group, num_groups=num_groups, exchange_dir=exchange_dir)
  return GroupTrainer(config, model_dir, group, num_groups, exchange_dir).run()


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
    self.exchange = (train_config.exchange_for(config, self.shared_exchange, group, num_groups)
                     if config.exchanges else None)
    self.distills = self.exchange is not None and self.exchange.distill
    self.info = strategies.task_info(config.shape.strategy)
    self.connection_timeout: Optional[connections.ConnectionTimeout] = None

  def run(self) -> Dict[str, float]:
    """Trains (or, on a parameter-server worker or ps task, serves until stopped)."""
    self._prepare_process()
    if self.info.serves_only:
      # Blocks until the launcher (or the cluster manager) stops the task.
      strategies.serve(self.info, strategies.server_config(self.config.inter_op_threads,
                                                           self.config.intra_op_threads))
      return {}
    distribution = strategies.make_strategy(self.config.shape.strategy)
    if self.config.data.batch_size % distribution.num_replicas_in_sync:
      raise ConfigurationError(
          f"tfc.Data.batch_size={self.config.data.batch_size} (the global batch) must be "
          f"divisible by the {distribution.num_replicas_in_sync} replicas of strategy "
          f"{self.config.shape.strategy!r}")
    keras.utils.set_random_seed(self.config.seed * 7919 + self.group)
    tf.io.gfile.makedirs(self.model_dir)
    start = time.time()
    data = self.build_data()
    model, local = self.build_model(distribution, data)
    callbacks = fit_callbacks.build(
        self.config, fit_callbacks.GroupTask(self.group, self.run_dir, self.info, self.task),
        model, local, data)
    history = self.fit(model, data, local, callbacks)
    model.flush_fusion()
    skipped_elsewhere = inputs.skipped_lines_elsewhere(distribution, data.bad_lines)
    digest = results_lib.weights_digest(model.student)
    logging.info("final student weights digest (%s:%d): %s", self.info.task_type or "local",
                 self.info.task_id, digest)
    if not self.info.is_chief:
      return {}
    earlier_s = callbacks.progress.resumed_wall_time_s if callbacks.progress else 0.0
    return self.finalize(model, local, data, callbacks, history,
                         {"wall_time_s": earlier_s + time.time() - start,
                          "resumed_from_step": callbacks.resume_step, "weights_digest": digest},
                         skipped_elsewhere)

  def _prepare_process(self) -> None:
    config = self.config
    filesystems.ensure_filesystems([self.model_dir, self.exchange_dir, *config.data.train_files,
                                    *config.data.eval_files])
    if self.info.is_chief:
      exchange.check_writable(self.model_dir, "--model_dir")
      if config.exchanges:
        exchange.check_writable(exchange.group_dir(self.shared_exchange, self.group),
                                "--exchange_dir")
    if config.shape.is_cluster and config.shape.connection_timeout_s:
      self.connection_timeout = connections.ConnectionTimeout(
          config.shape.connection_timeout_s).start()
    if config.intra_op_threads:
      tf.config.threading.set_intra_op_parallelism_threads(config.intra_op_threads)
    if config.inter_op_threads:
      tf.config.threading.set_inter_op_parallelism_threads(config.inter_op_threads)

  def build_data(self) -> inputs.GroupData:
    """The group's pipelines, checked (inputs.build)."""
    shape = self.config.shape
    return inputs.build(self.config.data, self.group, self.num_groups, self.config.seed,
                        async_workers=shape.workers_per_group if shape.asynchronous else 1,
                        remote_input=shape.asynchronous and self.info.task_type is not None)

  def build_model(self, distribution: tf.distribute.Strategy, data: inputs.GroupData
                  ) -> Tuple[CodistillModel, publishing.LocalCopy]:
    """The compiled CodistillModel (student and teacher variables created) and a local copy of
    its student for evaluation, publishing and export."""
    config = self.config
    prior = (self.task.estimate_prior(list(config.data.train_files), data.train())
             if config.label_smoothing and config.smoothing_prior == "unigram" else None)
    try:
      task_loss = self.task.task_loss(config.label_smoothing, config.smoothing_prior, prior)
    except ValueError as e:
      raise ConfigurationError(f"trainer.train.label_smoothing/smoothing_prior: {e}") from None
    with distribution.scope():
      student = config.model_fn()
      reducer = (comm.GradientReducer(config.shape.allreduce_dtype)
                 if config.shape.allreduce_dtype != "float32" else None)
      model = CodistillModel(
          student, exchange=self.exchange_config(data.input_spec),
          teachers=config.teachers, distillation=config.distillation, output=self.task.output,
          fusion=config.fusion, reducer=reducer, fusion_binding="trainer.train.fusion")
      model.compile(  # a FusionError here is a ConfigurationError naming the binding
          optimizer=train_config.OPTIMIZERS[config.optimizer](learning_rate=config.learning_rate),
          loss=task_loss, metrics=self.task.metrics(),
          steps_per_execution=config.steps_per_execution, jit_compile=config.jit_compile)
    model(data.sample)  # student and teacher variables exist before a teacher is restored
    # Pending forward-fusion updates are applied before every read of the weights for a
    # checkpoint, a publish, an evaluation or the export.
    local = publishing.LocalCopy(student, clone_architecture(student),
                                 before_snapshot=model.flush_fusion)
    local.model(data.sample)
    return model, local

  @property
  def shared_exchange(self) -> str:
    """The exchange directory every group shares (validate: an exchange needs one)."""
    if not self.exchange_dir:
      raise ConfigurationError("the exchange (codistillation, averaging) needs --exchange_dir")
    return self.exchange_dir

  def exchange_config(self, input_spec: Any = None) -> Optional[exchange_config.Exchange]:
    """Where and how this group exchanges models (None without codistillation or averaging);
    ``input_spec`` is the student's (``fit`` under parameter servers reads no dataset to find
    it)."""
    if self.exchange is None:
      return None
    return dataclasses.replace(self.exchange, input_spec=input_spec)

  def fit(self, model: CodistillModel, data: inputs.GroupData, local: publishing.LocalCopy,
          callbacks: fit_callbacks.FitCallbacks) -> keras.callbacks.History:
    """``model.fit`` for exactly ``train_steps`` steps; a NaN/Inf loss raises
    NonFiniteLossError saying what was kept."""
    config = self.config
    resumed = callbacks.resume_step if config.checkpoints.resume_input else 0
    if resumed:
      logging.info("group %d resumes at step %d: its input skips the batches of steps 1-%d",
                   self.group, resumed, resumed)
    train = data.resumed(resumed, shared_steps=config.shape.asynchronous)
    dataset = train() if self.info.task_type is None else \
        keras.utils.experimental.DatasetCreator(train)
    try:
      with inputs.data_errors(config.data.dataset_fn,
                              [*config.data.train_files, *config.data.eval_files]):
        history = model.fit(dataset, epochs=config.epochs,
                            steps_per_epoch=config.steps_per_epoch,
                            initial_epoch=callbacks.initial_epoch, callbacks=callbacks.fit,
                            verbose=config.verbose if self.info.is_chief else 0,
                            hooks=callbacks.hooks,
                            exchange_options=codistill_hooks.HookOptions(
                                data.probe, callbacks.summary_writer, local))
    except NonFiniteLossError as e:
      raise NonFiniteLossError(results_lib.non_finite_message(
          str(e), self.model_dir, self.exchange_dir, self.group, config.shape.strategy,
          self.distills and self.info.is_chief), e.step) from None
    return history

  def finalize(self, model: CodistillModel, local: publishing.LocalCopy, data: inputs.GroupData,
               callbacks: fit_callbacks.FitCallbacks, history: keras.callbacks.History,
               extra: Dict[str, Any], skipped_elsewhere: int = 0) -> Dict[str, Any]:
    """The chief's end of training: final evaluation, export (refused if not finite),
    predictions, summaries, ``results.json`` and the step timeline. ``skipped_elsewhere``: the
    malformed lines the group's other workers skipped."""
    config, run = self.config, self.run_dir
    step = current_step(model)
    final = callbacks.evaluation.evaluate()
    callbacks.pulse("exporting")
    weights = local.snapshot()
    with local.at_step(step, weights) as final_model:
      problem = publishing.finiteness_problem(final_model, weights,
                                               exchange.ProbeForward(data.probe))
      if problem:
        raise NonFiniteLossError(f"the final model of step {step} is not exported: {problem}",
                                 step)
      exchange.save_model(final_model, run.export, data.input_spec, serving.raw_signatures(
          final_model, config.data.raw_parser, self.task.output))
    if config.save_eval_predictions:
      callbacks.pulse("saving predictions")
      probs, labels = metrics_lib.model_probabilities(
          local.model, data.predictions(config.prediction_batches), self.task.output)
      results_lib.save_npz(run.eval_predictions, probs=probs, labels=labels)
    skipped = data.bad_lines.count + skipped_elsewhere
    if skipped:
      logging.warning("skipped %d malformed input lines (bad_lines='skip')", skipped)
    if not data.training_lines_counted:
      logging.info("input lines skipped by the parameter-server workers' training pipelines are "
                   "not counted: skipped_lines covers the evaluation set only")
    writer = callbacks.summary_writer
    if writer is not None:
      with writer.as_default(step=step):
        tf.summary.scalar(results_lib.SKIPPED_LINES_TAG, skipped)
      writer.flush()
    results = self._results(model, callbacks, history, step, final, {
        **extra, "skipped_lines": skipped,
        "skipped_training_lines_counted": data.training_lines_counted,
        **results_lib.consumed(config.data.batch_size, config.data.split, step,
                               data.evaluation)})
    exchange.write_atomically(run.results, json.dumps(results, indent=2, sort_keys=True))
    if config.save_step_timeline and callbacks.step_timer is not None:
      exchange.write_atomically(run.step_timeline, json.dumps(
          callbacks.step_timer.timeline(results_lib.windows(model.exchange_hooks))))
    logging.info("group %d done: %s steps=%d", self.group,
                 " ".join(f"{k}={v:.4f}" for k, v in sorted(self.task.results(final).items())),
                 step)
    return results


  def _results(self, model: CodistillModel, callbacks: fit_callbacks.FitCallbacks,
               history: keras.callbacks.History, step: int, final: Dict[str, float],
               extra: Dict[str, Any]) -> Dict[str, Any]:
    """The contents of ``results.json``: the group's, and its exchange's when it codistills."""
    rates = callbacks.step_summaries.examples_per_sec if callbacks.step_summaries else []
    results = results_lib.group_results(
        self.config, group=self.group, num_groups=self.num_groups, info=self.info,
        task=self.task, exchange=self.exchange, steps=step, final=final, history=history,
        examples_per_sec=rates, trainable_bytes=int(sum(
            np.prod(v.shape) * 4 for v in model.student.trainable_variables)), **extra)
    hooks, timer = model.exchange_hooks, callbacks.step_timer
    if hooks is not None:
      results.update(results_lib.exchange_results(
          hooks, model.teacher_steps.numpy(), model.teacher_staleness().numpy(),
          timer.quantiles_ms(results_lib.windows(hooks)) if timer is not None else None))
    return results
