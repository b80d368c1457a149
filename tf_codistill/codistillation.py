"""Codistillation inside ``model.fit``: where and how a group exchanges models with its peers.

``Exchange`` says it (directory, own group, peers, publish interval and format, versions kept,
poll interval, teacher precision). A ``CodistillModel`` given one adds the callback of
``exchange_hooks`` to every ``fit``: the chief publishes the student every ``publish_every_steps`` steps (off the training
thread), and every training process loads the peers' newest complete versions in a background
thread and swaps them in between two steps. Under ``ParameterServerStrategy``, where tf_keras
allows no batch-level callbacks, the same work runs from a thread polling the step.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, List, Optional, Sequence

import gin
import tensorflow as tf
import tf_keras as keras

from tf_codistill import lean_versions
from tf_codistill import publishing
from tf_codistill import step_hooks
from tf_codistill import exchange as exchange_lib
from tf_codistill import teachers as teachers_lib
from tf_codistill import topology
from tf_codistill.errors import ConfigurationError

# teacher_precision -> the tf_keras dtype policy of the teacher copies (int8: of their layers
# that are not quantized, see quantization.py).
PRECISIONS = {"float32": "float32", "bfloat16": "bfloat16", "mixed_bfloat16": "mixed_bfloat16",
              "int8": "float32"}
PROBE_EXAMPLES = 8


@gin.configurable(module="tfc")
@dataclasses.dataclass(frozen=True)
class Exchange:
  """Where and how one group of a codistillation job exchanges models with its peers.

  Attributes:
    directory: the exchange directory every group of the job shares (local, ``gs://``, ...).
    group: this group's index, in ``[0, num_groups)``.
    num_groups: how many groups train side by side (>= 2).
    teacher_graph: ``all_to_all`` (distill from every other group) or ``ring`` (from the
      predecessor only); ignored when ``peers`` is given.
    peers: the groups to distill from, if not given by ``teacher_graph``.
    publish_every_steps: the chief publishes the student every this many optimizer steps (K).
    keep_last: published versions of this group kept in the directory (older ones are removed).
    poll_interval_s: how often the background thread looks for newer peer versions.
    loader_nice: how much lower than training that thread runs (a Linux nice increment, 0 to
      19). 0 by default: 10 saved no throughput in a 2-core parameter-server group and made
      loads slower (the thread shares the Python GIL with the training loop).
    teacher_precision: ``float32``; ``bfloat16`` (teacher variables and compute in bfloat16:
      half the memory, read by key from peers' float32 versions and cast: restoring.py);
      ``mixed_bfloat16`` (float32 variables, bfloat16 compute); ``int8`` (Embedding and Dense
      weights as int8 codes with per-row scales, under a third of the memory: quantization.py).
    publish_format: how versions are published: whole SavedModels (the default), or lean
      versions with bfloat16/int8 weights and row deltas (``tfc.PublishFormat``); readers
      accept every format.
    wait_for_first_teachers_s: at the first step where a teacher can count (the later of the
      model's ``burn_in_steps`` and ``publish_every_steps``, when the peers' first versions are
      due), hold training up to this many seconds until every peer's first version is loaded
      (0: never wait; not under ParameterServerStrategy, whose steps are not held by hooks).
      Every training process waits on its own: in a MultiWorkerMirrored group keep it below the
      collectives' timeout (``strategies.make_strategy.timeout_seconds``).
    input_spec: the student's input spec (a ``tf.TensorSpec`` or a dict of them), needed only
      when ``fit`` is not given a ``tf.data.Dataset`` and the model was never called.

  Raises:
    ConfigurationError: a value that cannot work, named by its field.
  """
  directory: str
  group: int
  num_groups: int = 2
  teacher_graph: str = "all_to_all"
  peers: Optional[Sequence[int]] = None
  publish_every_steps: int = 100
  keep_last: int = 2
  poll_interval_s: float = 2.0
  loader_nice: int = 0
  teacher_precision: str = "float32"
  publish_format: lean_versions.PublishFormat = lean_versions.PublishFormat()
  wait_for_first_teachers_s: float = 0.0
  input_spec: Any = None

  def __post_init__(self):
    if not self.directory:
      raise ConfigurationError("Exchange.directory is empty: give the shared exchange directory")
    if self.teacher_precision not in PRECISIONS:
      raise ConfigurationError(f"Exchange.teacher_precision={self.teacher_precision!r} is not "
                               f"one of {list(PRECISIONS)}")
    for name in ("publish_every_steps", "keep_last"):
      if getattr(self, name) < 1:
        raise ConfigurationError(f"Exchange.{name}={getattr(self, name)} must be >= 1")
    if self.poll_interval_s <= 0:
      raise ConfigurationError(f"Exchange.poll_interval_s={self.poll_interval_s} must be > 0")
    low, high = teachers_lib.LOADER_NICE_RANGE
    if not low <= self.loader_nice <= high:
      raise ConfigurationError(f"Exchange.loader_nice={self.loader_nice} must be in "
                               f"[{low}, {high}]")
    if not 0 <= self.wait_for_first_teachers_s <= threading.TIMEOUT_MAX:
      raise ConfigurationError(f"Exchange.wait_for_first_teachers_s="
                               f"{self.wait_for_first_teachers_s} must be >= 0 and finite")
    try:
      peers = topology.teacher_groups(self.group, self.num_groups, self.teacher_graph)
      peers = self.peer_groups()
    except ValueError as e:
      raise ConfigurationError(f"Exchange: {e}") from None
    if self.group in peers or any(not 0 <= p < self.num_groups for p in peers) or not peers:
      raise ConfigurationError(f"Exchange.peers={list(peers)} must be other groups of "
                               f"range({self.num_groups}) than group {self.group}")

  def peer_groups(self) -> List[int]:
    """The groups this group distills from, in ascending order."""
    if self.peers is not None:
      return sorted(int(p) for p in self.peers)
    return topology.teacher_groups(self.group, self.num_groups, self.teacher_graph)

  @property
  def num_teachers(self) -> int:
    return len(self.peer_groups())

  def teacher_dtype_policy(self) -> Optional[str]:
    """The dtype policy of teacher copies (None: the student's own)."""
    policy = PRECISIONS[self.teacher_precision]
    return None if policy == "float32" else policy


def batched_spec(structure) -> Any:
  """``tf.TensorSpec``s with a free batch dimension, from tensors or specs of one batch."""
  return tf.nest.map_structure(
      lambda t: tf.TensorSpec([None] + list(t.shape)[1:], t.dtype), structure)


def sample_batch(input_spec) -> Any:
  """A batch of one all-zero example of ``input_spec`` (builds a model's variables)."""
  return tf.nest.map_structure(lambda s: tf.zeros([1] + s.shape[1:], s.dtype), input_spec)


def features_spec(data) -> Optional[Any]:
  """The features' spec of a ``tf.data.Dataset`` of ``(features, labels[, weights])``."""
  if not isinstance(data, tf.data.Dataset):
    return None
  spec = data.element_spec
  return batched_spec(spec[0] if isinstance(spec, tuple) else spec)


def probe_batch(data) -> Optional[Any]:
  """A few real inputs from ``data`` (a published or loaded model must predict finite values on
  them), or None when ``data`` is not a dataset that can be read here."""
  if not isinstance(data, tf.data.Dataset):
    return None
  element = next(iter(data.take(1)), None)
  if element is None:
    return None
  features = element[0] if isinstance(element, tuple) else element
  return tf.nest.map_structure(lambda t: t[:PROBE_EXAMPLES], features)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
  """Whether this process publishes: the chief of a multi-worker group, the coordinator of a
  parameter-server group, the only process otherwise."""
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    return True  # only the coordinator runs fit
  try:
    return bool(strategy.extended.should_checkpoint)
  except NotImplementedError:
    return True


@dataclasses.dataclass
class ExchangeHooks:
  """The work ``fit`` does for codistillation, and the callback that runs it between steps."""
  refresh: teachers_lib.TeacherRefresh
  publisher: Optional[publishing.ExchangePublisher]  # the chief's only
  callback: Optional[keras.callbacks.Callback]
  first_wait: Optional[teachers_lib.FirstTeachersWait] = None

  @property
  def hooks(self) -> List[step_hooks.StepHook]:
    optional = [self.publisher, self.first_wait]  # the wait after this group's own publish
    return [self.refresh] + [hook for hook in optional if hook is not None]


def exchange_hooks(model, exchange: Exchange, input_spec, probe=None,
                   summary_writer: Optional[tf.summary.SummaryWriter] = None,
                   local: Optional[publishing.LocalCopy] = None) -> ExchangeHooks:
  """Builds the teacher refresh (every training process) and the publisher (the chief) of a
  built CodistillModel, driven after every batch, or from a polling thread under parameter
  servers (tf_keras allows no batch-level callbacks there). The publisher writes from ``local``
  (a local copy of the student; by default a new one).

  Raises:
    ConfigurationError: the chief cannot write to its group's exchange directory, or a wait for
      the first teachers is asked for under parameter servers.
  """
  parameter_server = isinstance(model.distribute_strategy,
                                tf.distribute.experimental.ParameterServerStrategy)
  if parameter_server and exchange.wait_for_first_teachers_s > 0:
    raise ConfigurationError(
        "Exchange.wait_for_first_teachers_s cannot hold a ParameterServerStrategy group (its "
        "steps are scheduled regardless of hooks): set it to 0")
  sample = sample_batch(input_spec)
  with model.distribute_strategy.scope():  # student and teacher variables exist from here on
    output_shape = [None] + model(sample).shape.as_list()[1:]
  pool = teachers_lib.TeacherPool(exchange.directory, exchange.peer_groups(), model, input_spec,
                                  output_shape, poll_interval_s=exchange.poll_interval_s,
                                  probe=probe, loader_nice=exchange.loader_nice)
  refresh = teachers_lib.TeacherRefresh(pool, summary_writer)
  publisher = None
  if is_chief(model.distribute_strategy):
    own = exchange_lib.group_dir(exchange.directory, exchange.group)
    try:
      exchange_lib.check_writable(own)
    except (tf.errors.OpError, OSError) as e:
      raise ConfigurationError(f"Exchange.directory: cannot write to {own}: {e}") from None
    if local is None:
      local = publishing.LocalCopy(model.student, model.copy_student(),
                                      before_snapshot=model.flush_fusion)
      local.model(sample)
    writer = None
    if exchange.publish_format.lean:
      writer = lean_versions.LeanWriter(
          exchange.publish_format, [w.name for w in local.model.weights],
          exchange_lib.expected_signature(input_spec, output_shape))
    publisher = publishing.ExchangePublisher(
        local, exchange.directory, exchange.group, exchange.publish_every_steps, input_spec,
        keep_last=exchange.keep_last, probe=probe, writer=writer)
  hooks = ExchangeHooks(refresh, publisher, callback=None)
  if exchange.wait_for_first_teachers_s > 0:
    hooks.first_wait = teachers_lib.FirstTeachersWait(
        refresh, max(model.burn_in_steps, exchange.publish_every_steps),
        exchange.wait_for_first_teachers_s)
  hooks.callback = (step_hooks.ThreadDriver(hooks.hooks) if parameter_server
                    else step_hooks.BatchDriver(hooks.hooks))
  return hooks
