"""Trains one codistillation group: data -> model -> fit with exchange and teacher callbacks.

Data path: ``dataset_fn`` (data_pipelines) -> ``CodistillModel`` wrapping ``model_fn()`` ->
``fit`` with ``ExchangePublisher`` (publish every K steps) and ``TeacherRefresh`` (swap in peers'
newest versions) -> final evaluation, export and ``results.json``.
"""

from __future__ import annotations

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
from tf_codistill import exchange
from tf_codistill import losses
from tf_codistill import teachers as teachers_lib
from tf_codistill.model import CodistillModel
from tf_codistill.models import ctr

DATA_SPLITS = ("disjoint", "same")
SMOOTHING_PRIORS = ("uniform", "unigram")
OPTIMIZERS = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD,
              "adagrad": keras.optimizers.Adagrad, "rmsprop": keras.optimizers.RMSprop}


class ConfigurationError(ValueError):
  """A training configuration that cannot work; raised before any training starts."""


class ProgressLog(keras.callbacks.Callback):
  """Appends one JSON line per epoch (step, wall time, metrics) to ``path`` for launchers/benchmarks."""

  def __init__(self, path: str, group: int, total_steps: int):
    super().__init__()
    self.path = path
    self.group = group
    self.total_steps = total_steps
    self._start = time.monotonic()

  def on_epoch_end(self, epoch, logs=None):
    record = {"group": self.group, "epoch": epoch + 1,
              "step": int(self.model.optimizer.iterations.numpy()),
              "total_steps": self.total_steps, "wall_time_s": time.monotonic() - self._start}
    record.update({k: float(v) for k, v in (logs or {}).items()})
    with tf.io.gfile.GFile(self.path, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")


class ExchangePublisher(keras.callbacks.Callback):
  """Publishes the student to the exchange directory every ``every_steps`` optimizer steps."""

  def __init__(self, exchange_dir: str, group: int, every_steps: int, input_spec, *,
               keep_last: int = 2):
    super().__init__()
    if every_steps < 1:
      raise ValueError(f"exchange_every_steps={every_steps} must be >= 1")
    self.exchange_dir = exchange_dir
    self.group = group
    self.every_steps = every_steps
    self.input_spec = input_spec
    self.keep_last = keep_last
    self.last_published = -1
    self.failures = 0
    self.publish_seconds: List[float] = []

  def _publish(self, step: int) -> None:
    start = time.monotonic()
    self.last_published = step
    try:
      path = exchange.publish(self.model.student, self.exchange_dir, self.group, step,
                              self.input_spec, keep_last=self.keep_last)
    except (tf.errors.OpError, OSError) as e:
      # Peers keep the previous version; training goes on and the next interval retries.
      self.failures += 1
      logging.error("exchange: publishing step %d to %s failed, previous version kept: %s",
                    step, self.exchange_dir, e)
      return
    self.publish_seconds.append(time.monotonic() - start)
    logging.info("exchange: published step %d to %s (%.2fs)", step, path, self.publish_seconds[-1])

  def on_train_batch_end(self, batch, logs=None):
    step = int(self.model.optimizer.iterations.numpy())
    if step % self.every_steps == 0 and step != self.last_published:
      self._publish(step)

  def on_train_end(self, logs=None):
    step = int(self.model.optimizer.iterations.numpy())
    if step != self.last_published:
      self._publish(step)


class StepSummaries(keras.callbacks.Callback):
  """Writes step-level TensorBoard scalars: losses, alpha, teacher staleness, examples/sec."""

  def __init__(self, writer: tf.summary.SummaryWriter, batch_size: int, every_steps: int = 50):
    super().__init__()
    self.writer = writer
    self.batch_size = batch_size
    self.every_steps = max(1, every_steps)
    self._last_time = None
    self._last_step = None
    self.examples_per_sec: List[float] = []

  def on_train_begin(self, logs=None):
    self._last_time = time.monotonic()
    self._last_step = int(self.model.optimizer.iterations.numpy())

  def on_train_batch_end(self, batch, logs=None):
    step = int(self.model.optimizer.iterations.numpy())
    if step - self._last_step < self.every_steps:
      return
    now = time.monotonic()
    rate = (step - self._last_step) * self.batch_size / max(now - self._last_time, 1e-9)
    self.examples_per_sec.append(rate)
    self._last_time, self._last_step = now, step
    with self.writer.as_default(step=step):
      tf.summary.scalar("examples_per_sec", rate)
      for key in ("loss", "task_loss", "distill_loss", "alpha", "teacher_staleness"):
        if logs and key in logs:
          tf.summary.scalar(key, float(logs[key]))


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
          exchange_dir: Optional[str] = None,
          train_files: Sequence[str] = (), eval_files: Sequence[str] = (),
          dataset_fn: Callable[..., tf.data.Dataset] = criteo.make_dataset,
          model_fn: Callable[[], keras.Model] = ctr.ctr_model,
          batch_size: int = 512, train_steps: int = 1000, steps_per_epoch: int = 250,
          eval_steps: Optional[int] = None, shuffle_buffer: int = 10_000,
          optimizer: str = "adam", learning_rate: float = 1e-3,
          codistill: bool = False, alpha: float = 1.0, burn_in_steps: int = 0,
          distill_kind: str = "xent", temperature: float = 1.0,
          exchange_every_steps: int = 100, keep_last: int = 2, poll_interval_s: float = 2.0,
          data_split: str = "disjoint", label_smoothing: float = 0.0,
          smoothing_prior: str = "uniform", checkpoint_every_steps: int = 500,
          summary_every_steps: int = 50, seed: int = 0, intra_op_threads: int = 0,
          inter_op_threads: int = 0, verbose: int = 2) -> Dict[str, float]:
  """Trains group ``group`` of ``num_groups`` and returns/writes its final validation metrics.

  With ``codistill=True`` the group publishes to ``exchange_dir`` every ``exchange_every_steps``
  steps and distills from the other ``num_groups - 1`` groups' newest published versions.
  ``data_split='disjoint'`` gives each group its own shard of ``train_files``.
  """
  _validate(group, num_groups, codistill, exchange_dir, data_split, optimizer)
  if intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
  if inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
  keras.utils.set_random_seed(seed * 7919 + group)
  tf.io.gfile.makedirs(model_dir)
  start = time.time()

  shards = (group, num_groups) if data_split == "disjoint" else (0, 1)
  bad_lines = criteo.BadLineCounter()
  train_ds = dataset_fn(list(train_files), batch_size, shard_index=shards[0], num_shards=shards[1],
                        repeat=True, shuffle_buffer=shuffle_buffer, seed=seed * 7919 + group,
                        bad_line_counter=bad_lines)
  eval_ds = dataset_fn(list(eval_files), batch_size, bad_line_counter=bad_lines)
  input_spec = train_ds.element_spec[0]

  positive_rate = (estimate_positive_rate(train_ds)
                   if label_smoothing and smoothing_prior == "unigram" else None)
  task_loss = make_task_loss(label_smoothing=label_smoothing, smoothing_prior=smoothing_prior,
                             positive_rate=positive_rate)

  student = model_fn()
  peers = [g for g in range(num_groups) if g != group] if codistill else []
  model = CodistillModel(student, len(peers), alpha=alpha, burn_in_steps=burn_in_steps,
                         output="sigmoid", distill_kind=distill_kind, temperature=temperature)
  model.compile(optimizer=OPTIMIZERS[optimizer](learning_rate=learning_rate), loss=task_loss,
                metrics=[keras.metrics.BinaryCrossentropy(from_logits=True, name="logloss"),
                         keras.metrics.AUC(from_logits=True, name="auc")])
  # Build student and teachers once so the teacher pool can restore into existing variables.
  sample = next(iter(train_ds.take(1)))[0]
  model(sample)
  output_shape = student.compute_output_shape(
      tf.nest.map_structure(lambda s: s.shape, input_spec))

  summary_writer = tf.summary.create_file_writer(os.path.join(model_dir, "tb", "steps"))
  step_summaries = StepSummaries(summary_writer, batch_size, summary_every_steps)
  callbacks: List[keras.callbacks.Callback] = [
      keras.callbacks.BackupAndRestore(os.path.join(model_dir, "backup"),
                                       save_freq=checkpoint_every_steps),
      keras.callbacks.TensorBoard(os.path.join(model_dir, "tb"), update_freq="epoch"),
      step_summaries,
      ProgressLog(os.path.join(model_dir, "progress.jsonl"), group, train_steps),
  ]
  refresh = publisher = None
  if codistill:
    publisher = ExchangePublisher(exchange_dir, group, exchange_every_steps, input_spec,
                                  keep_last=keep_last)
    pool = teachers_lib.TeacherPool(exchange_dir, peers, model, input_spec, output_shape,
                                    poll_interval_s=poll_interval_s)
    refresh = teachers_lib.TeacherRefresh(pool, summary_writer)
    callbacks += [refresh, publisher]

  epochs = max(1, -(-train_steps // steps_per_epoch))
  history = model.fit(train_ds, epochs=epochs, steps_per_epoch=steps_per_epoch,
                      validation_data=eval_ds, validation_steps=eval_steps, callbacks=callbacks,
                      verbose=verbose)
  final = model.evaluate(eval_ds, steps=eval_steps, return_dict=True, verbose=0)
  exchange.save_model(student, os.path.join(model_dir, "export"), input_spec)
  if bad_lines.count:
    logging.warning("skipped %d malformed input lines (bad_lines='skip')", bad_lines.count)
  with summary_writer.as_default(step=int(model.optimizer.iterations.numpy())):
    tf.summary.scalar("data/skipped_lines", bad_lines.count)
  summary_writer.flush()

  results = {
      "group": group,
      "num_groups": num_groups,
      "codistill": codistill,
      "steps": int(model.optimizer.iterations.numpy()),
      "val_logloss": float(final["logloss"]),
      "val_auc": float(final["auc"]),
      "val_loss": float(final["loss"]),
      "wall_time_s": time.time() - start,
      "examples_per_sec": float(np.median(step_summaries.examples_per_sec))
                          if step_summaries.examples_per_sec else None,
      "skipped_lines": bad_lines.count,
      "history": {k: [float(v) for v in vals] for k, vals in history.history.items()},
  }
  if codistill:
    results.update(teacher_loads=refresh.swaps, teacher_rejections=refresh.pool.rejections,
                   teacher_steps=[int(s) for s in model.teacher_steps.numpy()],
                   final_teacher_staleness=float(model.teacher_staleness().numpy()),
                   publishes=len(publisher.publish_seconds),
                   publish_failures=publisher.failures,
                   publish_seconds_median=float(np.median(publisher.publish_seconds))
                   if publisher.publish_seconds else None)
  with tf.io.gfile.GFile(os.path.join(model_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=2, sort_keys=True)
  logging.info("group %d done: val_logloss=%.4f val_auc=%.4f steps=%d", group,
               results["val_logloss"], results["val_auc"], results["steps"])
  return results


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
