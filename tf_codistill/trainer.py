"""Trains one codistillation group: data -> model -> fit with exchange and teacher callbacks.

Data path: ``dataset_fn`` (data_pipelines) -> ``CodistillModel`` wrapping ``model_fn()`` ->
``fit`` with ``ExchangePublisher`` (publish every K steps) and ``TeacherRefresh`` (swap in peers'
newest versions) -> final evaluation, export and ``results.json``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import gin
import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from data_pipelines import criteo
from tf_codistill import callbacks as callbacks_lib
from tf_codistill import comm
from tf_codistill import exchange
from tf_codistill import filesystems
from tf_codistill import fusion as fusion_lib
from tf_codistill import losses
from tf_codistill import metrics as metrics_lib
from tf_codistill import strategies
from tf_codistill import teachers as teachers_lib
from tf_codistill.callbacks import current_step
from tf_codistill.model import CodistillModel, clone_architecture
from tf_codistill.models import ctr

DATA_SPLITS = ("disjoint", "same")
SMOOTHING_PRIORS = ("uniform", "unigram")
OPTIMIZERS = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD,
              "adagrad": keras.optimizers.Adagrad, "rmsprop": keras.optimizers.RMSprop}


class ConfigurationError(ValueError):
  """A training configuration that cannot work; raised before any training starts."""


def estimate_positive_rate(dataset: tf.data.Dataset, num_batches: int = 20) -> float:
  """Positive rate of the first ``num_batches`` batches: the unigram prior for CTR smoothing."""
  total = positives = 0.0
  for _, labels in dataset.take(num_batches):
    positives += float(tf.reduce_sum(labels))
    total += float(tf.size(labels))
  if total == 0:
    raise ValueError("cannot estimate the class prior: the training data is empty")
  return positives / total


@gin.configurable(module="trainer")
def make_task_loss(label_smoothing: float = 0.0, smoothing_prior: str = "uniform",
                   positive_rate: Optional[float] = None) -> keras.losses.Loss:
  """Binary cross-entropy from logits, optionally label-smoothed toward uniform or the prior."""
  if smoothing_prior not in SMOOTHING_PRIORS:
    raise ValueError(f"smoothing_prior={smoothing_prior!r} is not one of {SMOOTHING_PRIORS}")
  prior = 0.5 if smoothing_prior == "uniform" else positive_rate
  if prior is None:
    raise ValueError("smoothing_prior='unigram' needs the training positive rate")
  return losses.SmoothedBinaryCrossentropy(smoothing=label_smoothing, prior=prior)


@gin.configurable(module="trainer", denylist=["model_dir", "group", "num_groups", "exchange_dir"])
def train(model_dir: str, *, group: int = 0, num_groups: int = 1,
          exchange_dir: Optional[str] = None, strategy: str = "one_device",
          train_files: Sequence[str] = (), eval_files: Sequence[str] = (),
          dataset_fn: Callable[..., tf.data.Dataset] = criteo.make_dataset,
          model_fn: Callable[[], keras.Model] = ctr.ctr_model,
          batch_size: int = 512, train_steps: int = 1000, steps_per_epoch: int = 250,
          steps_per_execution: int = 1, eval_steps: Optional[int] = None,
          shuffle_buffer: int = 10_000, optimizer: str = "adam", learning_rate: float = 1e-3,
          codistill: bool = False, alpha: float = 1.0, burn_in_steps: int = 0,
          distill_kind: str = "xent", temperature: float = 1.0,
          exchange_every_steps: int = 100, keep_last: int = 2, poll_interval_s: float = 2.0,
          data_split: str = "disjoint", label_smoothing: float = 0.0,
          smoothing_prior: str = "uniform", checkpoint_every_steps: int = 500,
          summary_every_steps: int = 50, seed: int = 0, save_eval_predictions: bool = False,
          fusion: str = "none", allreduce_dtype: str = "float32", jit_compile: bool = False,
          intra_op_threads: int = 0,
          inter_op_threads: int = 0, verbose: int = 2) -> Dict[str, float]:
  """Runs this process's part of group ``group`` of ``num_groups``; the chief returns its metrics.

  ``strategy`` is one of strategies.KINDS; with a cluster it is read from TF_CONFIG, and workers
  and ps tasks of a parameter-server group only serve (this call then never returns). With
  ``codistill=True`` the group's chief publishes to ``exchange_dir`` every
  ``exchange_every_steps`` steps and every training task distills from the other groups' newest
  published versions. ``data_split='disjoint'`` gives each group (and each of its input
  pipelines) its own shard of ``train_files``; ``batch_size`` is the global batch of one step.
  ``fusion`` ('none', 'backward', 'forward') fuses the optimizer's updates (fusion.py);
  ``allreduce_dtype`` ('float32', 'float16', 'bfloat16') is the precision of a synchronous
  group's gradient all-reduce (comm.py).
  """
  _validate(group, num_groups, codistill, exchange_dir, data_split, optimizer)
  _validate_comm(strategy, fusion, allreduce_dtype)
  for name, files in (("train_files", train_files), ("eval_files", eval_files)):
    if not files:
      raise ConfigurationError(
          f"trainer.train.{name} is empty: bind it, e.g. "
          f"--gin_bindings=\"trainer.train.{name} = ['data/{name.split('_')[0]}-*']\"")
  filesystems.ensure_filesystems([model_dir, exchange_dir, *train_files, *eval_files])
  info = strategies.task_info(strategy)
  if intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
  if inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
  if info.serves_only:
    strategies.serve(info)  # blocks until the launcher (or the cluster manager) stops the task
    return {}
  distribution = strategies.make_strategy(strategy)
  if batch_size % distribution.num_replicas_in_sync:
    raise ConfigurationError(
        f"trainer.train.batch_size={batch_size} (the global batch) must be divisible by the "
        f"{distribution.num_replicas_in_sync} replicas of strategy {strategy!r}")
  keras.utils.set_random_seed(seed * 7919 + group)
  tf.io.gfile.makedirs(model_dir)
  start = time.time()

  bad_lines = criteo.BadLineCounter()

  def train_dataset(context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
    pipelines, pipeline = (context.num_input_pipelines, context.input_pipeline_id) if context \
        else (1, 0)
    batch = context.get_per_replica_batch_size(batch_size) if context else batch_size
    groups, index = (num_groups, group) if data_split == "disjoint" else (1, 0)
    return dataset_fn(list(train_files), batch, shard_index=index * pipelines + pipeline,
                      num_shards=groups * pipelines, repeat=True, shuffle_buffer=shuffle_buffer,
                      seed=seed * 7919 + group * 101 + pipeline,
                      bad_line_counter=None if context else bad_lines)

  eval_ds = dataset_fn(list(eval_files), batch_size, bad_line_counter=bad_lines)
  input_spec = eval_ds.element_spec[0]
  sample = tf.nest.map_structure(lambda s: tf.zeros([1] + s.shape[1:], s.dtype), input_spec)
  positive_rate = (estimate_positive_rate(train_dataset())
                   if label_smoothing and smoothing_prior == "unigram" else None)
  metrics = lambda: [keras.metrics.BinaryCrossentropy(from_logits=True, name="logloss"),
                     keras.metrics.AUC(from_logits=True, name="auc")]

  peers = [g for g in range(num_groups) if g != group] if codistill else []
  with distribution.scope():
    student = model_fn()
    reducer = (comm.GradientReducer(allreduce_dtype) if allreduce_dtype != "float32" else None)
    model = CodistillModel(student, len(peers), alpha=alpha, burn_in_steps=burn_in_steps,
                           output="sigmoid", distill_kind=distill_kind, temperature=temperature,
                           fusion=fusion, reducer=reducer, fusion_binding="trainer.train.fusion")
    try:
      model.compile(optimizer=OPTIMIZERS[optimizer](learning_rate=learning_rate),
                    loss=make_task_loss(label_smoothing=label_smoothing,
                                        smoothing_prior=smoothing_prior,
                                        positive_rate=positive_rate),
                    metrics=metrics(), steps_per_execution=steps_per_execution,
                    jit_compile=jit_compile)
    except fusion_lib.FusionError as e:
      raise ConfigurationError(str(e)) from e
  # Create student and teacher variables now, so the teacher pool can restore into them.
  model(sample)
  # Pending forward-fusion updates are applied before every read of the weights for a
  # checkpoint, a publish, an evaluation or the export.
  local = callbacks_lib.LocalCopy(student, clone_architecture(student),
                                  before_snapshot=model.flush_fusion)
  local.model(sample)

  summary_writer = None
  evaluation = callbacks_lib.LocalEvaluation(local, eval_ds, make_task_loss(), metrics, eval_steps)
  step_summaries = step_timer = None
  hooks: List[callbacks_lib.StepHook] = []
  epoch_callbacks: List[keras.callbacks.Callback] = []
  if info.is_chief:
    summary_writer = tf.summary.create_file_writer(os.path.join(model_dir, "tb", "steps"))
    step_summaries = callbacks_lib.StepSummaries(summary_writer, batch_size, summary_every_steps)
    step_timer = callbacks_lib.StepTimer(steps_per_epoch)
    hooks += [step_timer, step_summaries]
    epoch_callbacks = [
        evaluation,
        keras.callbacks.TensorBoard(os.path.join(model_dir, "tb"), update_freq="epoch"),
        callbacks_lib.ProgressLog(os.path.join(model_dir, "progress.jsonl"), group, train_steps,
                                rates=step_summaries.examples_per_sec),
    ]
  initial_epoch = 0
  if strategy == "parameter_server":
    checkpoints = callbacks_lib.EpochCheckpoint(os.path.join(model_dir, "checkpoints"), model,
                                                before_save=model.flush_fusion)
    initial_epoch = checkpoints.restore() // steps_per_epoch
    epoch_callbacks.insert(0, checkpoints)
  else:
    epoch_callbacks.insert(0, fusion_lib.BackupAndRestore(
        os.path.join(model_dir, "backup"), model.flush_fusion, save_freq=checkpoint_every_steps))
  refresh = publisher = None
  if codistill:
    pool = teachers_lib.TeacherPool(exchange_dir, peers, model, input_spec,
                                    [None] + list(student.output_shape[1:]),
                                    poll_interval_s=poll_interval_s)
    refresh = teachers_lib.TeacherRefresh(pool, summary_writer)
    hooks.append(refresh)
    if info.is_chief:
      publisher = callbacks_lib.ExchangePublisher(local, exchange_dir, group, exchange_every_steps,
                                                  input_spec, keep_last=keep_last)
      hooks.append(publisher)
  driver = (callbacks_lib.ThreadDriver(hooks) if strategy == "parameter_server"
            else callbacks_lib.BatchDriver(hooks))

  data = train_dataset() if info.task_type is None else \
      keras.utils.experimental.DatasetCreator(train_dataset)
  epochs = max(1, -(-train_steps // steps_per_epoch))
  history = model.fit(data, epochs=epochs, steps_per_epoch=steps_per_epoch,
                      initial_epoch=initial_epoch, callbacks=epoch_callbacks + [driver],
                      verbose=verbose if info.is_chief else 0)
  model.flush_fusion()
  digest = weights_digest(student)
  logging.info("final student weights digest (%s:%d): %s", info.task_type or "local",
               info.task_id, digest)
  if not info.is_chief:
    return {}

  step = current_step(model)
  final = evaluation.evaluate()
  with local.at_step(step) as final_model:
    exchange.save_model(final_model, os.path.join(model_dir, "export"), input_spec)
  if save_eval_predictions:
    probs, labels = metrics_lib.model_probabilities(local.model, eval_ds)
    _save_npz(os.path.join(model_dir, "eval_predictions.npz"), probs=probs, labels=labels)
  if bad_lines.count:
    logging.warning("skipped %d malformed input lines (bad_lines='skip')", bad_lines.count)
  with summary_writer.as_default(step=step):
    tf.summary.scalar("data/skipped_lines", bad_lines.count)
  summary_writer.flush()

  results = {
      "group": group,
      "num_groups": num_groups,
      "strategy": strategy,
      "num_workers": info.num_workers,
      "codistill": codistill,
      "steps": step,
      "val_logloss": final["logloss"],
      "val_auc": final["auc"],
      "val_loss": final["loss"],
      "wall_time_s": time.time() - start,
      "examples_per_sec": float(np.median(step_summaries.examples_per_sec))
                          if step_summaries.examples_per_sec else None,
      "skipped_lines": bad_lines.count,
      "weights_digest": digest,
      "history": {k: [float(v) for v in vals] for k, vals in history.history.items()},
  }
  if codistill:
    results.update(teacher_loads=refresh.swaps, teacher_rejections=refresh.pool.rejections,
                   teacher_steps=[int(s) for s in model.teacher_steps.numpy()],
                   final_teacher_staleness=float(model.teacher_staleness().numpy()),
                   publishes=len(publisher.publish_seconds),
                   publish_failures=publisher.failures,
                   publish_seconds_median=float(np.median(publisher.publish_seconds))
                   if publisher.publish_seconds else None,
                   # Step times of steps overlapping a teacher refresh (load off-thread ..
                   # swap), a publish (snapshot .. written), an epoch end, or nothing.
                   step_time_ms=step_timer.quantiles_ms({"refresh": refresh.windows,
                                                         "publish": publisher.windows}))
  with tf.io.gfile.GFile(os.path.join(model_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=2, sort_keys=True)
  logging.info("group %d done: val_logloss=%.4f val_auc=%.4f steps=%d", group,
               results["val_logloss"], results["val_auc"], results["steps"])
  return results


def _save_npz(path: str, **arrays: np.ndarray) -> None:
  """Writes arrays as .npz atomically (temp file + rename) through tf.io.gfile."""
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  tmp = f"{path}.tmp-{os.getpid()}"
  with tf.io.gfile.GFile(tmp, "wb") as f:
    f.write(buffer.getvalue())
  tf.io.gfile.rename(tmp, path, overwrite=True)


def weights_digest(model: keras.Model) -> str:
  """SHA-256 of all weight values: equal on every replica of a synchronous group."""
  digest = hashlib.sha256()
  for value in model.get_weights():
    digest.update(np.ascontiguousarray(value).tobytes())
  return digest.hexdigest()


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
    raise ConfigurationError("codistillation needs --num_groups >= 2 (or bind trainer.train.codistill = False)")
  if codistill and not exchange_dir:
    raise ConfigurationError("codistillation needs --exchange_dir")
  if data_split not in DATA_SPLITS:
    raise ConfigurationError(f"trainer.train.data_split={data_split!r} is not one of {DATA_SPLITS}")
  if optimizer not in OPTIMIZERS:
    raise ConfigurationError(f"trainer.train.optimizer={optimizer!r} is not one of {sorted(OPTIMIZERS)}")
