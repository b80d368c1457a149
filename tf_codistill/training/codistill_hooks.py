"""The exchange inside ``model.fit``: hooks that publish the student, refresh teachers, average.

A ``CodistillModel`` given an ``Exchange`` runs the hooks of ``exchange_hooks`` in every
``fit``: the chief publishes the student every ``publish_every_steps`` steps (off the training
thread), and every training process loads the peers' newest complete versions in a background
thread and swaps them in between two steps. Under ``ParameterServerStrategy``, where tf_keras
allows only batch callbacks that read no logs, the same work runs from a thread polling the
step. With ``Exchange.averaging`` every training process also takes the parameter-averaging
rounds (``averaging_hooks``; under parameter servers from such a batch callback).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tf_codistill import step_hooks
from tf_codistill.exchange import averaging as averaging_lib
from tf_codistill.exchange import directory as exchange_lib
from tf_codistill.exchange import lean_versions
from tf_codistill.exchange import publishing
from tf_codistill.exchange.config import Exchange
from tf_codistill.teachers import pool as teachers_lib
from tf_codistill.training import averaging_hooks

PROBE_EXAMPLES = 64  # real inputs a published or loaded model must predict finite values on


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


@dataclasses.dataclass(frozen=True)
class HookOptions:
  """What a caller of ``CodistillModel.fit`` may lend the exchange's hooks: real inputs a model
  must predict finite values on (``probe``), a summary writer for the teacher refreshes, and the
  local copy of the student to publish from (by default a new one)."""
  probe: Any = None
  summary_writer: Optional[tf.summary.SummaryWriter] = None
  local_copy: Optional[publishing.LocalCopy] = None


@dataclasses.dataclass
class ExchangeHooks:
  """The work ``fit`` does for the exchange between steps, and what it measured: parameter
  averaging rounds, and for distillation the teacher refresh and the chief's publisher."""
  refresh: Optional[teachers_lib.TeacherRefresh]  # with distillation only
  publisher: Optional[publishing.ExchangePublisher]  # the chief's only
  first_wait: Optional[teachers_lib.FirstTeachersWait] = None
  averaging: Optional[averaging_hooks.AveragingRound] = None
  # Under parameter servers the rounds run from this batch callback instead of a StepHook.
  scheduled_rounds: Optional[averaging_hooks.ScheduledRounds] = None

  @property
  def hooks(self) -> List[step_hooks.StepHook]:
    # A round first, so that the same step's publish holds the averaged parameters; the wait
    # for the first teachers after this group's own publish.
    rounds = self.averaging if self.scheduled_rounds is None else None
    hooks = [rounds, self.refresh, self.publisher, self.first_wait]
    return [hook for hook in hooks if hook is not None]

  @property
  def callbacks(self) -> List[keras.callbacks.Callback]:
    """Keras callbacks ``fit`` runs beside the hooks' driver."""
    return [self.scheduled_rounds] if self.scheduled_rounds is not None else []

  def stop(self) -> None:
    """Stops loading teachers and waits for a publish in flight (training stopped early)."""
    if self.refresh is not None:
      self.refresh.stop()
    if self.publisher is not None:
      self.publisher.drain()

  def statistics(self) -> Dict[str, Any]:
    """Teacher loads (in all and per peer group) and rejections, publishes and their failures,
    the first teachers' wait, averaging rounds."""
    stats: Dict[str, Any] = {}
    if self.averaging is not None:
      stats["averaging_rounds"] = self.averaging.statistics()
    if self.refresh is None:
      return stats
    stats.update(teacher_loads=self.refresh.swaps, teacher_rejections=self.refresh.rejections,
                 teacher_loads_by_group={str(peer): n for peer, n in
                                         sorted(self.refresh.loads_by_group.items())})
    if self.publisher is not None:
      seconds = self.publisher.publish_seconds
      stats.update(publishes=len(seconds), publish_failures=self.publisher.failures,
                   publish_bytes=int(sum(self.publisher.published_bytes)),
                   publish_refused_non_finite=self.publisher.refused,
                   publish_seconds_median=float(np.median(seconds)) if seconds else None)
    stats["first_teachers_wait_s"] = self.first_wait and self.first_wait.waited_seconds
    return stats

  def windows(self) -> Dict[str, Sequence[Tuple[float, float]]]:
    """When each teacher refresh (load off-thread .. swap), publish (snapshot .. written) and the
    wait for the first teachers ran."""
    windows: Dict[str, Sequence[Tuple[float, float]]] = {
        "refresh": self.refresh.windows if self.refresh is not None else []}
    windows["publish"] = self.publisher.windows if self.publisher is not None else []
    if self.first_wait is not None:
      windows["first_teachers_wait"] = self.first_wait.windows
    return windows


def exchange_hooks(model, exchange: Exchange, input_spec,
                   options: HookOptions = HookOptions()) -> ExchangeHooks:
  """Builds the averaging round (with ``exchange.averaging``; every training process), the
  teacher refresh (every training process) and the publisher (the chief) of a built
  CodistillModel; ``CodistillModel.fit`` runs them with the caller's hooks through one driver.
  The publisher writes from ``options.local_copy`` (by default a new local copy).

  Raises:
    ConfigurationError: the chief cannot write to its group's exchange directory, or the
      exchange asks for what parameter servers cannot do.
  """
  parameter_server = isinstance(model.distribute_strategy,
                                tf.distribute.experimental.ParameterServerStrategy)
  exchange.check_strategy(parameter_server)
  sample = sample_batch(input_spec)
  with model.distribute_strategy.scope():  # student and teacher variables exist from here on
    output_shape = [None] + model(sample).shape.as_list()[1:]
  chief = is_chief(model.distribute_strategy)
  hooks = ExchangeHooks(None, None)
  if exchange.averaging is not None:
    if chief:
      exchange_lib.check_writable(averaging_lib.root(exchange.directory), "tfc.Exchange.directory")
    hooks.averaging = averaging_hooks.AveragingRound(
        exchange.averaging, exchange.directory, exchange.group, exchange.num_groups, chief,
        options.summary_writer, before_read=model.flush_fusion,
        agree=averaging_hooks.min_across_workers(model.distribute_strategy))
    if parameter_server:
      hooks.scheduled_rounds = averaging_hooks.ScheduledRounds(hooks.averaging)
  if not exchange.distill:
    return hooks
  pool = teachers_lib.TeacherPool(exchange.directory, exchange.peer_groups(), model, input_spec,
                                  output_shape, poll_interval_s=exchange.poll_interval_s,
                                  probe=options.probe, loader_nice=exchange.loader_nice)
  hooks.refresh = teachers_lib.TeacherRefresh(pool, options.summary_writer)
  if chief:
    hooks.publisher = _publisher(model, exchange, input_spec, output_shape, sample, options,
                                 read_lock=None if hooks.averaging is None
                                 else hooks.averaging.lock)
  if exchange.wait_for_first_teachers_s > 0:
    hooks.first_wait = teachers_lib.FirstTeachersWait(
        hooks.refresh, max(model.distillation.burn_in_steps, exchange.publish_every_steps),
        exchange.wait_for_first_teachers_s)
  return hooks


def _publisher(model, exchange: Exchange, input_spec, output_shape, sample,
               options: HookOptions, read_lock=None) -> publishing.ExchangePublisher:
  """The chief's publisher, after checking that it can write to its group's directory; it
  snapshots the student under ``read_lock`` (an averaging round's, where rounds run)."""
  exchange_lib.check_writable(exchange_lib.group_dir(exchange.directory, exchange.group),
                              "tfc.Exchange.directory")
  local = options.local_copy
  if local is None:
    local = publishing.LocalCopy(model.student, model.copy_student(),
                                 before_snapshot=model.flush_fusion)
    local.model(sample)
  if read_lock is not None:
    local.read_lock = read_lock
  writer = None
  if exchange.publish_format.lean:
    writer = lean_versions.LeanWriter(
        exchange.publish_format, [w.name for w in local.model.weights],
        exchange_lib.expected_signature(input_spec, output_shape))
  return publishing.ExchangePublisher(
      local, exchange.directory, exchange.group, exchange.publish_every_steps, input_spec,
      keep_last=exchange.keep_last, probe=options.probe, writer=writer)
