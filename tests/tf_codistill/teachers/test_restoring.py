"""Reading a peer version's weights by key: the values of a real SavedModel, in the weights'
order and dtypes, refused for another architecture or an unreadable object graph, on the CPU of
the task holding the teacher."""

import os
import types

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill.exchange import directory as exchange
from tf_codistill.teachers import restoring

from testing_utils import normalized_net
from testing_utils import small_net

SPEC = tf.TensorSpec([None, 4], tf.float32)


def _prefix(path):
  return os.path.join(path, "variables", "variables")


def test_read_weights_gives_a_published_versions_values_in_weights_order(tmp_path):
  peer = small_net(seed=3, hidden=6)
  path = exchange.publish(peer, str(tmp_path), 1, 10, SPEC)
  float_copy = small_net(seed=9, hidden=6)  # the architecture only: its own values differ
  values = restoring.read_weights(_prefix(path), float_copy)
  assert [v.dtype for v in values] == [tf.float32] * 4
  for value, expected in zip(values, peer.get_weights()):
    np.testing.assert_array_equal(value.numpy(), expected)
  keys = restoring.checkpoint_keys(_prefix(path), float_copy)
  assert len(set(keys)) == 4 and all(k.endswith("/.ATTRIBUTES/VARIABLE_VALUE") for k in keys)


def test_weights_that_are_not_float_are_read_in_their_own_dtype(tmp_path):
  data = np.arange(12, dtype=np.float32).reshape(3, 4)
  peer = normalized_net(data)
  assert tf.int64 in [w.dtype for w in peer.weights]  # Normalization's count
  path = exchange.publish(peer, str(tmp_path), 1, 10, SPEC)
  values = restoring.read_weights(_prefix(path), normalized_net(data[:2]))
  assert [v.dtype for v in values] == [w.dtype for w in peer.weights]
  for value, expected in zip(values, peer.get_weights()):
    np.testing.assert_array_equal(value.numpy(), expected)


def test_a_checkpoint_without_a_weight_of_the_model_is_refused_naming_it(tmp_path):
  path = exchange.publish(small_net(seed=3), str(tmp_path), 1, 10, SPEC)
  x = keras.Input((4,))
  h = keras.layers.Dense(8, name="one")(x)
  deeper = keras.Model(x, keras.layers.Dense(1, name="three")(keras.layers.Dense(8, name="two")(h)))
  with pytest.raises(ValueError, match=r"variables: no value for three/kernel.*\(2 of 6 weights "
                                       r"missing\)"):
    restoring.read_weights(_prefix(path), deeper)


def test_a_checkpoint_without_an_object_graph_is_refused_naming_it(tmp_path):
  prefix = str(tmp_path / "v1")
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["w"], shape_and_slices=[""],
                    tensors=[tf.zeros([2])])
  with pytest.raises(ValueError, match=f"{prefix}.*object-based"):
    restoring.checkpoint_keys(prefix, small_net())


def test_an_unreadable_object_graph_is_refused_naming_the_checkpoint(tmp_path):
  prefix = str(tmp_path / "garbled")
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["_CHECKPOINTABLE_OBJECT_GRAPH"],
                    shape_and_slices=[""], tensors=[tf.constant(b"\xff\xff not a proto")])
  with pytest.raises(ValueError, match=f"{prefix}: its object graph cannot be read"):
    restoring.checkpoint_keys(prefix, small_net())


def test_host_cpu_sees_through_sharded_variables_to_their_tasks_cpu():
  from tensorflow.python.distribute import sharded_variable  # what a partitioned ps variable is
  with tf.device("/cpu:0"):
    table = sharded_variable.ShardedVariable([tf.Variable(tf.zeros([2, 2])),
                                              tf.Variable(tf.zeros([5, 2]))])
    bias = tf.Variable(tf.zeros([3]))
  device = restoring.host_cpu(types.SimpleNamespace(weights=[bias, table]))
  assert device == tf.DeviceSpec.from_string(table.variables[1].device).to_string()
  assert device.endswith("/device:CPU:0")
