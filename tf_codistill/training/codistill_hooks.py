"""Codistillation inside ``model.fit``: the hooks that publish the student and refresh teachers.

A ``CodistillModel`` given an ``Exchange`` adds the callback of ``exchange_hooks`` to every
``fit``: the chief publishes the student every ``publish_every_steps`` steps (off the training
thread), and every training process loads the peers' newest complete versions in a background
thread and swaps them in between two steps. Under ``ParameterServerStrategy``, where tf_keras
allows no batch-level callbacks, the same work runs from a thread polling the step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional

import tensorflow as tf
import tf_keras as keras

from tf_codistill import step_hooks
from tf_codistill.errors import ConfigurationError
from tf_codistill.exchange import directory as exchange_lib
from tf_codistill.exchange import lean_versions
from tf_codistill.exchange import publishing
from tf_codistill.exchange.config import Exchange
from tf_codistill.teachers import pool as teachers_lib

PROBE_EXAMPLES = 8


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
