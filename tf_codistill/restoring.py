"""Reads a peer's float32 weights from its SavedModel's checkpoint by key, on the task that holds
the teacher they are for.

A teacher that holds the student's weights in another form or precision (stacked tables,
bfloat16, int8: ``quantization.restores_from_float32`` is false) cannot be restored into by
``load_weights``. Its values are read with one ``RestoreV2`` of the keys that the checkpoint's own
object graph gives a float32 copy of the student's architecture (``checkpoint_keys``), in the
student's ``weights`` order, and converted where they were read. Like TensorFlow's own restore of
a parameter-server variable, the read runs on the CPU of the task that holds the teacher
(``host_cpu``): under parameter servers the ps reads the version's files and converts them, and
no table passes through the coordinator (which a restore into a float32 copy, then
``get_weights`` and an assign from the coordinator, cost it about 70 ms of CPU per CTR version
against about 20 ms for the read alone).
"""

from __future__ import annotations

from typing import Dict, List

import tensorflow as tf
import tf_keras as keras
from tensorflow.core.protobuf import trackable_object_graph_pb2

# Where a TF2 checkpoint keeps its object graph (a serialized TrackableObjectGraph).
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def object_graph(prefix: str) -> trackable_object_graph_pb2.TrackableObjectGraph:
  """The object graph of the TF2 checkpoint at ``prefix`` (a SavedModel's variables/variables).

  Raises:
    ValueError: the checkpoint has no object graph (a TF1 name-based checkpoint).
  """
  reader = tf.train.load_checkpoint(prefix)
  if not reader.has_tensor(_OBJECT_GRAPH_KEY):
    raise ValueError(f"{prefix}: not an object-based (TF2) checkpoint")
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
  return graph


def checkpoint_keys(model: keras.Model,
                    graph: trackable_object_graph_pb2.TrackableObjectGraph) -> List[str]:
  """The checkpoint keys of ``model.weights``, in that order, in a checkpoint of a model of the
  same architecture whose object graph is ``graph``: the graph is walked from its root together
  with ``model``'s trackable children of the same names, as a restore matches them.

  Raises:
    ValueError: a weight of ``model`` has no value in the checkpoint (another architecture).
  """
  found: Dict[int, str] = {}
  queue = [(0, model)]
  seen = {0}
  while queue:
    node_id, obj = queue.pop(0)
    node = graph.nodes[node_id]
    for attribute in node.attributes:
      if attribute.name == "VARIABLE_VALUE":
        found[id(obj)] = attribute.checkpoint_key
    children = tf.train.TrackableView(obj).children(obj)
    for ref in node.children:
      if ref.node_id not in seen and ref.local_name in children:
        seen.add(ref.node_id)
        queue.append((ref.node_id, children[ref.local_name]))
  missing = [w.name for w in model.weights if id(w) not in found]
  if missing:
    raise ValueError(f"the checkpoint has no value for {missing[0]} "
                     f"({len(missing)} of {len(model.weights)} weights missing)")
  return [found[id(w)] for w in model.weights]


def read_float_weights(prefix: str, float_model: keras.Model) -> List[tf.Tensor]:
  """The float32 values of ``float_model.weights`` (a float32 model of the checkpoint's
  architecture, only its structure used) in the checkpoint at ``prefix``, read with one
  ``RestoreV2`` on the current device. ``OpError`` if a key is absent or not float32."""
  keys = checkpoint_keys(float_model, object_graph(prefix))
  values = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=keys, shape_and_slices=[""] * len(keys),
                                dtypes=[tf.float32] * len(keys))
  return list(values)


def host_cpu(model: keras.Model) -> str:
  """The CPU of the task that holds ``model``'s largest variable (a ps, under parameter servers;
  this process otherwise): where TensorFlow itself restores a variable's checkpointed value."""
  parts = [part for var in model.weights for part in (getattr(var, "variables", None) or [var])]
  largest = max(parts, key=lambda part: part.shape.num_elements() or 0)
  return tf.DeviceSpec.from_string(largest.device).replace(device_type="CPU",
                                                           device_index=0).to_string()
