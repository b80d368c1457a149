"""Reads a peer's weights from its SavedModel's checkpoint by key, on the task that holds the
teacher they are for.

A teacher that holds the student's weights in another form or precision (stacked tables,
bfloat16, int8: ``quantization.restores_from_float32`` is false) cannot be restored into by
``load_weights``. Its values are read with one ``RestoreV2`` of the keys that the checkpoint's own
object graph gives a float32 copy of the student's architecture (``checkpoint_keys``, matched by
``tf.train.CheckpointView``), in the student's ``weights`` order, and converted where they were
read. Like TensorFlow's own restore of a parameter-server variable, the read runs on the CPU of
the task that holds the teacher (``host_cpu``): under parameter servers the ps reads the
version's variables and converts them, and no table passes through the coordinator (which a
restore into a float32 copy, then ``get_weights`` and an assign from the coordinator, cost it
about 70 ms of CPU per CTR version against about 20 ms for the read alone).
"""

from __future__ import annotations

from typing import List

import tensorflow as tf
import tf_keras as keras
from google.protobuf import message
from tensorflow.core.protobuf import trackable_object_graph_pb2

# Where a TF2 checkpoint keeps its object graph (a serialized TrackableObjectGraph).
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def checkpoint_keys(prefix: str, model: keras.Model) -> List[str]:
  """The keys of ``model.weights``, in that order, in the TF2 checkpoint at ``prefix`` of a model
  of the same architecture: its object graph matched to ``model`` from the root, as a restore
  matches them (``tf.train.CheckpointView.match``).

  Raises:
    ValueError: naming ``prefix``: not a TF2 checkpoint, an object graph that cannot be parsed,
      or a weight of ``model`` without a value in it (another architecture).
  """
  try:
    matched = tf.train.CheckpointView(prefix).match(model)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(prefix).get_tensor(_OBJECT_GRAPH_KEY))
    keys = {id(obj): attribute.checkpoint_key for node_id, obj in matched.items()
            for attribute in graph.nodes[node_id].attributes
            if attribute.name == "VARIABLE_VALUE"}
  except (message.DecodeError, IndexError) as e:
    raise ValueError(f"{prefix}: its object graph cannot be read ({e!r})") from None
  missing = [w.name for w in model.weights if id(w) not in keys]
  if missing:
    raise ValueError(f"{prefix}: no value for {missing[0]} "
                     f"({len(missing)} of {len(model.weights)} weights missing)")
  return [keys[id(w)] for w in model.weights]


def read_weights(prefix: str, model: keras.Model) -> List[tf.Tensor]:
  """The values of ``model.weights`` (a model of the checkpoint's architecture and dtypes, only
  its structure used) in the checkpoint at ``prefix``, read with one ``RestoreV2`` on the current
  device. ``ValueError`` as ``checkpoint_keys``; ``OpError`` if a value is absent or of another
  dtype."""
  keys = checkpoint_keys(prefix, model)
  return list(tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=keys,
                                   shape_and_slices=[""] * len(keys),
                                   dtypes=[w.dtype.base_dtype for w in model.weights]))


def host_cpu(model: keras.Model) -> str:
  """The CPU of the task that holds ``model``'s largest variable (a ps, under parameter servers;
  this process otherwise): where TensorFlow itself restores a variable's checkpointed value. With
  several ps tasks, the values of the others' variables travel to them from there."""
  parts = [part for var in model.weights for part in (getattr(var, "variables", None) or [var])]
  largest = max(parts, key=lambda part: part.shape.num_elements() or 0)
  return tf.DeviceSpec.from_string(largest.device).replace(device_type="CPU",
                                                           device_index=0).to_string()
