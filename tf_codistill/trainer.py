"""Trains one codistillation group: data -> model -> fit with exchange and teacher callbacks.

Data path: ``dataset_fn`` (data_pipelines) -> ``CodistillModel`` wrapping ``model_fn()`` ->
``fit`` with ``ExchangePublisher`` (publish every K steps) and ``TeacherRefresh`` (swap in peers'
newest versions) -> final evaluation, export and ``results.json``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

import gin
import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from data_pipelines import criteo
from tf_codistill import callbacks as callbacks_lib
from tf_codistill import errors
from tf_codistill import comm
from tf_codistill import exchange
from tf_codistill import filesystems
from tf_codistill import fusion as fusion_lib
from tf_codistill import losses
from tf_codistill import metrics as metrics_lib
from tf_codistill import strategies
from tf_codistill import tasks as tasks_lib
from tf_codistill import teachers as teachers_lib
from tf_codistill import topology
from tf_codistill.callbacks import current_step
from tf_codistill.model import CodistillModel, clone_architecture
from tf_codistill.models import ctr

DATA_SPLITS = ("disjoint", "same")
SKIPPED_LINES_TAG = "data/skipped_lines"
OPTIMIZERS = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD,
              "adagrad": keras.optimizers.Adagrad, "rmsprop": keras.optimizers.RMSprop}


ConfigurationError = errors.ConfigurationError
DataError = criteo.DataError
NonFiniteLossError = errors.NonFiniteLossError
PROBE_EXAMPLES = 64
_MALFORMED_RE = re.compile(r"(malformed [^\[\]\n]*? (line|row|record) [^\]\n]*)")

# Learning-rate schedules for trainer.train.learning_rate, e.g.
#   trainer.train.learning_rate = @schedules.PiecewiseConstantDecay()
#   schedules.PiecewiseConstantDecay.boundaries = [1000]
#   schedules.PiecewiseConstantDecay.values = [1e-3, 1e-4]
for _schedule in (keras.optimizers.schedules.PiecewiseConstantDecay,
                  keras.optimizers.schedules.ExponentialDecay,
                  keras.optimizers.schedules.CosineDecay):
  gin.external_configurable(_schedule, module="schedules")


# Teacher forward-pass precision -> the tf_keras dtype policy of the teacher copies (variables stay
# float32, so the peers' float32 SavedModels load as they are).
PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16"}


@gin.configurable(module="trainer", denylist=["model_dir", "group", "num_groups", "exchange_dir"])
def train(model_dir: str, *, group: int = 0, num_groups: int = 1,
          exchange_dir: Optional[str] = None, strategy: str = "one_device",
          train_files: Sequence[str] = (), eval_files: Sequence[str] = (),
          dataset_fn: Callable[..., tf.data.Dataset] = criteo.make_dataset,
          model_fn: Callable[[], keras.Model] = ctr.ctr_model,
          task: Optional[tasks_lib.Task] = None,
          batch_size: int = 512, train_steps: int = 1000, steps_per_epoch: int = 250,
          steps_per_execution: int = 1, eval_steps: Optional[int] = None,
          shuffle_buffer: int = 10_000, optimizer: str = "adam",
          learning_rate: Union[float, keras.optimizers.schedules.LearningRateSchedule] = 1e-3,
          codistill: bool = False, alpha: float = 1.0, burn_in_steps: int = 0,
          distill_kind: str = "xent", temperature: float = 1.0,
          teacher_graph: str = "all_to_all", teacher_precision: str = "float32",
          exchange_every_steps: int = 100, keep_last: int = 2, poll_interval_s: float = 2.0,
          data_split: str = "disjoint", label_smoothing: float = 0.0,
          smoothing_prior: str = "uniform", checkpoint_every_steps: int = 500,
          summary_every_steps: int = 50, seed: int = 0, save_eval_predictions: bool = False,
          prediction_batches: Optional[int] = None, prediction_history: bool = False,
          fusion: str = "none", allreduce_dtype: str = "float32", jit_compile: bool = False,
          intra_op_threads: int = 0, inter_op_threads: int = 0, heartbeat_every_s: float = 5.0,
          max_wall_seconds: Optional[float] = None, save_step_timeline: bool = False,
          verbose: int = 2) -> Dict[str, float]:
  """Runs this process's part of group ``group`` of ``num_groups``; the chief returns its metrics.

  ``strategy`` is one of strategies.KINDS; with a cluster it is read from TF_CONFIG, and workers
  and ps tasks of a parameter-server group only serve (this call then never returns). With
  ``codistill=True`` the group's chief publishes to ``exchange_dir`` every
  ``exchange_every_steps`` steps and every training task distills from the other groups' newest
  published versions: of every other group (``teacher_graph='all_to_all'``) or of its
  predecessor only (``'ring'``), run in ``teacher_precision``. ``data_split='disjoint'`` gives
  each group (and each of its input pipelines) its own shard of ``train_files``; ``batch_size``
  is the global batch of one step. ``task`` (default ``tasks.BinaryTask()``) sets the loss,
  metrics and results keys; ``prediction_batches`` caps the eval batches whose predictions
  ``save_eval_predictions`` keeps (in ``eval_predictions.npz``, and with ``prediction_history``
  also at every evaluation in ``eval_predictions/step_<n>.npz``, for churn vs loss). ``fusion`` ('none', 'backward', 'forward') fuses the
  optimizer's updates (fusion.py); ``allreduce_dtype`` ('float32', 'float16', 'bfloat16') is the
  precision of a synchronous group's gradient all-reduce (comm.py). ``intra_op_threads`` and
  ``inter_op_threads`` (0: TF's default) size this task's thread pools, also a serving task's
  (strategies.server_config, which keeps at least 2 inter-op threads there).

  Failures that a restart cannot fix raise before training starts where they can be seen then:
  ConfigurationError (flags, bindings, TF_CONFIG, unwritable directories, missing files) and
  DataError (an empty file, a malformed line under ``bad_lines='error'``, naming file and line;
  also raised mid-training). A NaN/Inf loss raises NonFiniteLossError naming the step, before
  that step is checkpointed or published. The chief writes ``model_dir/heartbeat.json`` (step,
  the step it started from, time) every ``heartbeat_every_s``; ``max_wall_seconds`` ends
  training early, as if ``train_steps`` were reached (not for ``multi_worker_mirrored``).
  ``save_step_timeline`` makes the chief write ``model_dir/step_timeline.json``: every timed
  step interval and teacher-refresh/publish window on the host's monotonic clock, so that step
  times of several groups on one machine can be lined up (benchmarks/soak.py).
  """
  _validate(group, num_groups, codistill, exchange_dir, data_split, optimizer)
  _validate_comm(strategy, fusion, allreduce_dtype)
  _validate_numbers(train_steps=train_steps, steps_per_epoch=steps_per_epoch,
                    batch_size=batch_size, steps_per_execution=steps_per_execution,
                    exchange_every_steps=exchange_every_steps, keep_last=keep_last,
                    checkpoint_every_steps=checkpoint_every_steps)
  if max_wall_seconds is not None and strategy == "multi_worker_mirrored":
    raise ConfigurationError("trainer.train.max_wall_seconds cannot end a multi_worker_mirrored "
                             "group (its workers would wait for the chief): unbind it")
  if teacher_graph not in topology.GRAPHS:
    raise ConfigurationError(
        f"trainer.train.teacher_graph={teacher_graph!r} is not one of {topology.GRAPHS}")
  if teacher_precision not in PRECISIONS:
    raise ConfigurationError(
        f"trainer.train.teacher_precision={teacher_precision!r} is not one of {PRECISIONS}")
  task = task or tasks_lib.BinaryTask()
  for name, files in (("train_files", train_files), ("eval_files", eval_files)):
    if not files:
      raise ConfigurationError(
          f"trainer.train.{name} is empty: bind it, e.g. "
          f"--gin_bindings=\"trainer.train.{name} = ['data/{name.split('_')[0]}-*']\"")
  filesystems.ensure_filesystems([model_dir, exchange_dir, *train_files, *eval_files])
  info = strategies.task_info(strategy)
  if info.is_chief:
    _check_writable("--model_dir", model_dir)
    if codistill:
      _check_writable("--exchange_dir", exchange.group_dir(exchange_dir, group))
  if intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
  if inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
  if info.serves_only:
    # Blocks until the launcher (or the cluster manager) stops the task.
    strategies.serve(info, strategies.server_config(inter_op_threads, intra_op_threads))
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

  def train_dataset(context: Optional[tf.distribute.InputContext] = None,
                    repeat: bool = True) -> tf.data.Dataset:
    pipelines, pipeline = (context.num_input_pipelines, context.input_pipeline_id) if context \
        else (1, 0)
    batch = context.get_per_replica_batch_size(batch_size) if context else batch_size
    groups, index = (num_groups, group) if data_split == "disjoint" else (1, 0)
    return dataset_fn(list(train_files), batch, shard_index=index * pipelines + pipeline,
                      num_shards=groups * pipelines, repeat=repeat, shuffle_buffer=shuffle_buffer,
                      seed=seed * 7919 + group * 101 + pipeline,
                      bad_line_counter=None if context else bad_lines)

  with _data_errors(dataset_fn):
    eval_ds = _open_files("eval_files", lambda: dataset_fn(list(eval_files), batch_size,
                                                           bad_line_counter=bad_lines))
    # A few real examples: published models and loaded teachers must predict finite values on them.
    probe = tf.nest.map_structure(lambda t: t[:PROBE_EXAMPLES], next(iter(eval_ds))[0])
    _check_train_data(_open_files("train_files", lambda: train_dataset(repeat=False)),
                      train_files, group, num_groups, data_split)
    bad_lines.reset()  # the checks read lines the training will read again
  input_spec = eval_ds.element_spec[0]
  sample = tf.nest.map_structure(lambda s: tf.zeros([1] + s.shape[1:], s.dtype), input_spec)
  prior = (task.estimate_prior(list(train_files), train_dataset())
           if label_smoothing and smoothing_prior == "unigram" else None)
  try:
    task_loss = task.task_loss(label_smoothing, smoothing_prior, prior)
  except ValueError as e:
    raise ConfigurationError(f"trainer.train.label_smoothing/smoothing_prior: {e}") from None
  metrics = task.metrics

  peers = topology.teacher_groups(group, num_groups, teacher_graph) if codistill else []
  with distribution.scope():
    student = model_fn()
    teacher_factory = (None if teacher_precision == "float32" else
                       lambda: clone_architecture(student, dtype_policy=PRECISIONS[teacher_precision]))
    reducer = (comm.GradientReducer(allreduce_dtype) if allreduce_dtype != "float32" else None)
    model = CodistillModel(student, len(peers), alpha=alpha, burn_in_steps=burn_in_steps,
                           output=task.output, distill_kind=distill_kind, temperature=temperature,
                           teacher_factory=teacher_factory, fusion=fusion, reducer=reducer,
                           fusion_binding="trainer.train.fusion")
    try:
      model.compile(optimizer=OPTIMIZERS[optimizer](learning_rate=learning_rate),
                    loss=task_loss, metrics=metrics(), steps_per_execution=steps_per_execution,
                    jit_compile=jit_compile)
    except fusion_lib.FusionError as e:
      raise ConfigurationError(str(e)) from e
  # Create student and teacher variables now, so the teacher pool can restore into them.
  # The published signature's output shape: the student's on the data's input spec.
  output_shape = [None] + model(sample).shape.as_list()[1:]
  # Pending forward-fusion updates are applied before every read of the weights for a
  # checkpoint, a publish, an evaluation or the export.
  local = callbacks_lib.LocalCopy(student, clone_architecture(student),
                                  before_snapshot=model.flush_fusion)
  local.model(sample)

  summary_writer = None
  evaluation = callbacks_lib.LocalEvaluation(local, eval_ds, task.task_loss(), metrics, eval_steps)
  step_summaries = step_timer = None
  guard = callbacks_lib.NonFiniteGuard()
  hooks: List[callbacks_lib.StepHook] = []
  epoch_callbacks: List[keras.callbacks.Callback] = []
  if info.is_chief:
    summary_writer = tf.summary.create_file_writer(os.path.join(model_dir, "tb", "steps"))
    step_summaries = callbacks_lib.StepSummaries(
        summary_writer, batch_size, summary_every_steps,
        counters={SKIPPED_LINES_TAG: lambda: bad_lines.count})
    step_timer = callbacks_lib.StepTimer(steps_per_epoch)
    hooks += [callbacks_lib.Heartbeat(os.path.join(model_dir, "heartbeat.json"),
                                      heartbeat_every_s, f"{info.task_type or 'chief'}:"
                                      f"{info.task_id}"),
              step_timer, step_summaries]
    if max_wall_seconds is not None:
      hooks.append(callbacks_lib.WallClockLimit(max_wall_seconds))
    epoch_callbacks = [
        evaluation,
        keras.callbacks.TensorBoard(os.path.join(model_dir, "tb"), update_freq="epoch"),
        callbacks_lib.ProgressLog(os.path.join(model_dir, "progress.jsonl"), group, train_steps,
                                rates=step_summaries.examples_per_sec),
    ]
    if save_eval_predictions and prediction_history:
      epoch_callbacks.append(callbacks_lib.PredictionHistory(
          local, eval_ds if prediction_batches is None else eval_ds.take(prediction_batches),
          task.output, os.path.join(model_dir, "eval_predictions"), _save_npz))
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
                                    output_shape,
                                    poll_interval_s=poll_interval_s, probe=probe)
    refresh = teachers_lib.TeacherRefresh(pool, summary_writer)
    hooks.append(refresh)
    if info.is_chief:
      publisher = callbacks_lib.ExchangePublisher(local, exchange_dir, group, exchange_every_steps,
                                                  input_spec, keep_last=keep_last, probe=probe)
      hooks.append(publisher)
  if strategy == "parameter_server":
    # The guard runs first in the polling thread; it makes the driver stop training.
    driver = callbacks_lib.ThreadDriver([guard] + hooks)
    fit_callbacks = epoch_callbacks + [driver]
  else:
    # The guard comes first: a NaN step is never checkpointed (BackupAndRestore) or published.
    driver = callbacks_lib.BatchDriver(hooks)
    fit_callbacks = [guard] + epoch_callbacks + [driver]

  data = train_dataset() if info.task_type is None else \
      keras.utils.experimental.DatasetCreator(train_dataset)
  epochs = max(1, -(-train_steps // steps_per_epoch))
  try:
    with _data_errors(dataset_fn):
      history = model.fit(data, epochs=epochs, steps_per_epoch=steps_per_epoch,
                          initial_epoch=initial_epoch, callbacks=fit_callbacks,
                          verbose=verbose if info.is_chief else 0)
    if isinstance(driver, callbacks_lib.ThreadDriver) and driver.error is not None:
      raise driver.error
  except NonFiniteLossError as e:
    if refresh is not None:
      refresh.pool.stop()
    if publisher is not None:
      publisher.drain()
    raise NonFiniteLossError(_non_finite_message(str(e), model_dir, exchange_dir, group,
                                                 strategy, codistill and info.is_chief),
                             e.step) from None
  model.flush_fusion()
  digest = weights_digest(student)
  logging.info("final student weights digest (%s:%d): %s", info.task_type or "local",
               info.task_id, digest)
  if not info.is_chief:
    return {}

  step = current_step(model)
  final = evaluation.evaluate()
  weights = local.snapshot()
  with local.at_step(step, weights) as final_model:
    problem = callbacks_lib.finiteness_problem(final_model, weights, probe)
    if problem:
      raise NonFiniteLossError(f"the final model of step {step} is not exported: {problem}", step)
    exchange.save_model(final_model, os.path.join(model_dir, "export"), input_spec)
  if save_eval_predictions:
    probs, labels = metrics_lib.model_probabilities(
        local.model, eval_ds if prediction_batches is None else eval_ds.take(prediction_batches),
        task.output)
    _save_npz(os.path.join(model_dir, "eval_predictions.npz"), probs=probs, labels=labels)
  if bad_lines.count:
    logging.warning("skipped %d malformed input lines (bad_lines='skip')", bad_lines.count)
  with summary_writer.as_default(step=step):
    tf.summary.scalar(SKIPPED_LINES_TAG, bad_lines.count)
  summary_writer.flush()

  # When each teacher refresh (load off-thread .. swap) and publish (snapshot .. written) ran.
  windows = {"refresh": refresh.windows, "publish": publisher.windows} if codistill else {}
  results = {
      "group": group,
      "num_groups": num_groups,
      "strategy": strategy,
      "num_workers": info.num_workers,
      "codistill": codistill,
      "steps": step,
      **task.results(final),
      "teacher_graph": teacher_graph,
      "teacher_groups": peers,
      "teacher_precision": teacher_precision,
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
                   publish_refused_non_finite=publisher.refused,
                   publish_seconds_median=float(np.median(publisher.publish_seconds))
                   if publisher.publish_seconds else None,
                   # Step times of steps overlapping a refresh, a publish, an epoch end, or
                   # nothing.
                   step_time_ms=step_timer.quantiles_ms(windows))
  exchange.write_atomically(os.path.join(model_dir, "results.json"),
                            json.dumps(results, indent=2, sort_keys=True))
  if save_step_timeline:
    exchange.write_atomically(os.path.join(model_dir, "step_timeline.json"),
                              json.dumps(step_timer.timeline(windows)))
  logging.info("group %d done: %s steps=%d", group,
               " ".join(f"{k}={v:.4f}" for k, v in sorted(task.results(final).items())),
               results["steps"])
  return results


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


def _check_writable(flag: str, directory: str) -> None:
  try:
    exchange.check_writable(directory)
  except (tf.errors.OpError, OSError) as e:
    reason = getattr(e, "message", None) or getattr(e, "strerror", None) or str(e)
    raise ConfigurationError(f"{flag}: cannot write to {directory} ({reason}): make it writable "
                             "by this job or pass another directory") from None


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
    raise DataError(f"{match.group(1).strip()}; fix the {kind}, or bind "
                    f"{_bad_lines_binding(dataset_fn)} = 'skip' to skip malformed {kind}s"
                    ) from None
  except DataError as e:
    raise DataError(str(e).splitlines()[0]) from None  # without gin's "In call to" line


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
  if strategy == "parameter_server":
    checkpoint = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  else:
    checkpoint = tf.train.latest_checkpoint(os.path.join(model_dir, "backup", "chief"))
  kept = ["no checkpoint"]
  if checkpoint:
    kept = [f"last checkpoint {checkpoint} (step {callbacks_lib.checkpoint_step(checkpoint)}; a "
            "restart resumes from it)"]
  if publishes:
    versions = exchange.list_versions(exchange_dir, group)
    kept.append(f"last published version {versions[0].path if versions else 'none'}")
  return (f"training stopped: {reason}; nothing of this step or later was checkpointed or "
          f"published; kept: {', '.join(kept)}. Lower trainer.train.learning_rate or check the "
          "input data")


def _validate_numbers(**values: int) -> None:
  for name, value in values.items():
    if value < 1:
      raise ConfigurationError(f"trainer.train.{name}={value} must be >= 1")


def check_config(num_groups: int, groups: Sequence[int], exchange_dir: Optional[str]) -> None:
  """Validates the gin-bound trainer.train settings for ``groups`` of ``num_groups`` (launcher)."""
  bound: Dict[str, Any] = {}
  try:
    bound = gin.get_bindings("trainer.train")
  except (ValueError, KeyError):
    pass
  defaults = {name: p.default for name, p in _signature_parameters().items()}
  value = lambda name: bound.get(name, defaults[name])
  for group in groups:
    _validate(group, num_groups, value("codistill"), exchange_dir, value("data_split"),
              value("optimizer"))


def _signature_parameters():
  import inspect
  return inspect.signature(getattr(train, "__wrapped__", train)).parameters


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
