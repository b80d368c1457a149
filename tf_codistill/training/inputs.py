"""A group's input (``tfc.Data``): its training and evaluation pipelines, checked before
training, and malformed records reported by file and first bad line."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import gin
import tensorflow as tf

from data_pipelines import criteo
from tf_codistill import errors
from tf_codistill import serving
from tf_codistill.training import codistill_hooks

DataError = criteo.DataError
ConfigurationError = errors.ConfigurationError
SPLITS = ("disjoint", "same")
_MALFORMED_RE = re.compile(r"(malformed [^\[\]\n]*? (line|row|record) [^\]\n]*)")
_MALFORMED_AT_RE = re.compile(r" (?:line|row|record) (.+?):\d+: ")  # the file of a message
_RESCAN_BATCH = 1024


@gin.configurable(module="tfc")
@dataclasses.dataclass(frozen=True)
class Data:
  """What a group reads (``tfc.Data.<field>``): ``train_files`` and ``eval_files`` (globs),
  parsed by ``dataset_fn`` (a data_pipelines ``make_dataset``) into batches of ``batch_size``,
  the global batch of one step. ``split='disjoint'`` gives each group (and each of its input
  pipelines) its own shard of the training files; ``'same'``: every group reads all of them.
  ``raw_parser`` (e.g. ``@criteo.raw_parser()``) adds the export's ``serving_raw`` signature on
  raw lines, checked before training against ``dataset_fn`` on the first eval lines."""
  train_files: Sequence[str] = ()
  eval_files: Sequence[str] = ()
  dataset_fn: Callable[..., tf.data.Dataset] = criteo.make_dataset
  raw_parser: Optional[Callable[[tf.Tensor], Any]] = None
  batch_size: int = 512
  shuffle_buffer: int = 10_000
  split: str = "disjoint"

  def check(self) -> None:
    """Raises ConfigurationError naming the first field that cannot work."""
    if self.split not in SPLITS:
      raise ConfigurationError(f"tfc.Data.split={self.split!r} is not one of {SPLITS}")
    if self.batch_size < 1:
      raise ConfigurationError(f"tfc.Data.batch_size={self.batch_size} must be >= 1")
    for name in ("train_files", "eval_files"):
      if not getattr(self, name):
        raise ConfigurationError(
            f"tfc.Data.{name} is empty: bind it, e.g. "
            f"--gin_bindings=\"tfc.Data.{name} = ['data/{name.split('_')[0]}-*']\"")

  def shard(self, group: int, num_groups: int) -> Tuple[int, int]:
    """(shard index, number of shards) of group ``group``'s training data, before the split
    between its input pipelines."""
    return (group, num_groups) if self.split == "disjoint" else (0, 1)


@dataclasses.dataclass
class GroupData:
  """A group's input: its training pipeline (a function of the input context), evaluation set,
  probe batch of real inputs, input spec, counter of skipped records (this process's pipelines),
  the asynchronous workers that share its training data (parameter servers; 1 otherwise), and
  whether the counter sees the training pipelines (not where parameter-server workers run them).
  """
  train: Callable[..., tf.data.Dataset]
  evaluation: tf.data.Dataset
  probe: Any
  input_spec: Any
  bad_lines: criteo.BadLineCounter
  async_workers: int = 1
  training_lines_counted: bool = True

  @property
  def sample(self):
    """Zeros of the input spec's shape: builds a model's variables without reading data."""
    return codistill_hooks.sample_batch(self.input_spec)

  def resumed(self, steps: int, shared_steps: bool = False
              ) -> Callable[..., tf.data.Dataset]:
    """The training pipeline past the batches of its first ``steps`` steps, for a group resumed
    from a checkpoint of step ``steps``. Each step reads one batch of every input pipeline;
    with ``shared_steps`` (parameter servers: a step runs on whichever worker is free) each
    pipeline skips an even share of them instead."""
    if not steps:
      return self.train

    def dataset(context: Optional[tf.distribute.InputContext] = None, **kwargs) -> tf.data.Dataset:
      readers = (context.num_input_pipelines if context else 1) * self.async_workers
      return self.train(context, **kwargs).skip(steps // readers if shared_steps else steps)
    return dataset

  def predictions(self, batches: Optional[int]) -> tf.data.Dataset:
    """The evaluation batches whose predictions are kept (all of them when ``batches`` is None)."""
    return self.evaluation if batches is None else self.evaluation.take(batches)


def build(data: Data, group: int, num_groups: int, seed: int = 0,
          async_workers: int = 1, remote_input: bool = False) -> GroupData:
  """The group's pipelines, checked: files exist, the evaluation set and this group's shard
  of the training data hold valid examples. ``seed`` (with the group and pipeline) seeds the
  shuffle. ``async_workers``: a parameter-server group's workers, each of which reads its own
  part of the group's shard (TF gives every such worker the same input context).
  ``remote_input``: the training pipelines run on parameter-server workers, out of reach of this
  process's counter of skipped lines."""
  bad_lines = criteo.BadLineCounter()
  index, groups = data.shard(group, num_groups)

  def pipeline_dataset(pipeline: int, pipelines: int, batch: int, repeat: bool,
                       counted: bool) -> tf.data.Dataset:
    return data.dataset_fn(
        list(data.train_files), batch, shard_index=index * pipelines + pipeline,
        num_shards=groups * pipelines, repeat=repeat, shuffle_buffer=data.shuffle_buffer,
        seed=seed * 7919 + group * 101 + pipeline,
        bad_line_counter=bad_lines if counted else None)

  def train_dataset(context: Optional[tf.distribute.InputContext] = None, repeat: bool = True,
                    worker: Optional[tf.Tensor] = None) -> tf.data.Dataset:
    """``worker``: a parameter-server worker's index (default: the coordinator's worker this
    pipeline is made for)."""
    if context is None:
      return pipeline_dataset(0, 1, data.batch_size, repeat, counted=True)
    batch = context.get_per_replica_batch_size(data.batch_size)
    if async_workers == 1:
      return pipeline_dataset(context.input_pipeline_id, context.num_input_pipelines, batch,
                              repeat, counted=not remote_input)
    if worker is None:
      worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    parts = [pipeline_dataset(w, async_workers, batch, repeat, counted=False)
             for w in range(async_workers)]
    choice = tf.data.Dataset.from_tensors(tf.cast(worker, tf.int64)).repeat()
    return tf.data.Dataset.choose_from_datasets(parts, choice)

  with data_errors(data.dataset_fn, [*data.train_files, *data.eval_files]):
    evaluation = open_files("eval_files", lambda: data.dataset_fn(
        list(data.eval_files), data.batch_size, bad_line_counter=bad_lines))
    # A few real examples: published models and loaded teachers must predict finite values.
    probe = codistill_hooks.probe_batch(evaluation)
    check_train_data(open_files("train_files", lambda: train_dataset(repeat=False)),
                     data.train_files, group, num_groups, data.split)
    if data.raw_parser is not None:
      first_eval = criteo.resolve_files(list(data.eval_files))[0]
      serving.check_raw_parser(data.raw_parser, data.dataset_fn, first_eval)
    bad_lines.reset()  # the checks read lines the training reads again
  return GroupData(train_dataset, evaluation, probe, evaluation.element_spec[0], bad_lines,
                   async_workers, training_lines_counted=not remote_input)


def skipped_lines_elsewhere(distribution: tf.distribute.Strategy,
                            counter: criteo.BadLineCounter) -> int:
  """Malformed lines the other workers of a MultiWorkerMirrored group have skipped (each counts
  its own shard; 0 under any other strategy). A collective: every worker calls it at once."""
  if not isinstance(distribution, tf.distribute.MultiWorkerMirroredStrategy):
    return 0
  own = counter.count
  local_replicas = len(distribution.extended.worker_devices)
  values = distribution.experimental_distribute_values_from_function(
      lambda context: tf.constant(
          own if context.replica_id_in_sync_group % local_replicas == 0 else 0, tf.float64))
  return round(float(distribution.reduce(tf.distribute.ReduceOp.SUM, values, axis=None))) - own


def open_files(name: str, make: Callable[[], tf.data.Dataset]) -> tf.data.Dataset:
  """``make()``, with a missing file or pattern reported as the binding to fix."""
  try:
    return make()
  except FileNotFoundError as e:
    raise ConfigurationError(f"tfc.Data.{name}: {str(e).splitlines()[0]}") from None


@contextlib.contextmanager
def data_errors(dataset_fn: Callable[..., tf.data.Dataset],
                files: Sequence[str] = ()) -> Iterator[None]:
  """Turns a malformed-record error from ``dataset_fn``'s pipeline into DataError naming file and
  line (or row, or record) and the binding that skips such records; and a file TF cannot read as
  records at all (a truncated or corrupt TFRecord, whose error names no file) into DataError
  naming it, found by reading each of ``files`` (patterns) alone."""
  try:
    yield
  except tf.errors.DataLossError as e:
    raise DataError(unreadable_file(dataset_fn, files, e.message or str(e))) from None
  except tf.errors.InvalidArgumentError as e:
    match = _MALFORMED_RE.search(e.message or "")
    if not match:
      raise
    kind = match.group(2)
    first = first_malformed(dataset_fn, match.group(1).strip())
    raise DataError(f"{first}; fix the {kind}, or bind "
                    f"{bad_lines_binding(dataset_fn)} = 'skip' to skip malformed {kind}s"
                    ) from None
  except DataError as e:
    raise DataError(str(e).splitlines()[0]) from None  # without gin's "In call to" line


def first_malformed(dataset_fn: Callable[..., tf.data.Dataset], message: str) -> str:
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


def unreadable_file(dataset_fn: Callable[..., tf.data.Dataset], patterns: Sequence[str],
                    message: str) -> str:
  """The message for the first of the files ``patterns`` match that TF cannot read
  (``message``: TF's error, which names no file)."""
  reason = message.splitlines()[0]
  for path in (criteo.resolve_files(list(patterns)) if patterns else []):
    try:
      for _ in dataset_fn([path], _RESCAN_BATCH):
        pass
    except tf.errors.DataLossError:
      return (f"{path}: unreadable ({reason}): the file is truncated or corrupt; restore or "
              "remove it (no bad_lines policy skips a file that cannot be read)")
    except Exception:  # pylint: disable=broad-except  (another problem of another file)
      continue
  return f"a data file is truncated or corrupt ({reason})"


def bad_lines_binding(dataset_fn: Callable[..., tf.data.Dataset]) -> str:
  """``dataset_fn``'s bad_lines gin binding, e.g. ``criteo.make_dataset.bad_lines``."""
  module = getattr(dataset_fn, "__module__", "").rsplit(".", 1)[-1]
  return f"{module}.{getattr(dataset_fn, '__name__', 'dataset_fn')}.bad_lines"


def check_train_data(dataset: tf.data.Dataset, train_files: Sequence[str], group: int,
                     num_groups: int, split: str) -> None:
  """Raises DataError if this group's training shard yields no example (every line bad)."""
  for _ in dataset.take(1):
    return
  shard = f"group {group}'s shard of {num_groups}" if split == "disjoint" else "the data"
  raise DataError(f"tfc.Data.train_files {list(train_files)}: {shard} holds no valid "
                  "example (empty files, or every line malformed and skipped)")
