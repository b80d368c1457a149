"""Reading a peer version's float32 weights by key: the values of a real SavedModel, in the
weights' order, refused for another architecture, on the CPU of the task holding the teacher."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from testing_utils import small_net
from tf_codistill import exchange
from tf_codistill import restoring

SPEC = tf.TensorSpec([None, 4], tf.float32)


def _prefix(path):
  return os.path.join(path, "variables", "variables")


def test_read_float_weights_gives_a_published_versions_values_in_weights_order(tmp_path):
  peer = small_net(seed=3, hidden=6)
  path = exchange.publish(peer, str(tmp_path), 1, 10, SPEC)
  float_copy = small_net(seed=9, hidden=6)  # the architecture only: its own values differ
  values = restoring.read_float_weights(_prefix(path), float_copy)
  assert [v.dtype for v in values] == [tf.float32] * 4
  for value, expected in zip(values, peer.get_weights()):
    np.testing.assert_array_equal(value.numpy(), expected)
  keys = restoring.checkpoint_keys(float_copy, restoring.object_graph(_prefix(path)))
  assert len(set(keys)) == 4 and all(k.endswith("/.ATTRIBUTES/VARIABLE_VALUE") for k in keys)


def test_a_checkpoint_without_a_weight_of_the_model_is_refused_naming_it(tmp_path):
  path = exchange.publish(small_net(seed=3), str(tmp_path), 1, 10, SPEC)
  x = keras.Input((4,))
  h = keras.layers.Dense(8, name="one")(x)
  deeper = keras.Model(x, keras.layers.Dense(1, name="three")(keras.layers.Dense(8, name="two")(h)))
  with pytest.raises(ValueError, match=r"no value for three/kernel.*\(2 of 6 weights missing\)"):
    restoring.read_float_weights(_prefix(path), deeper)


def test_a_checkpoint_without_an_object_graph_is_refused_naming_it(tmp_path):
  prefix = str(tmp_path / "v1")
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["w"], shape_and_slices=[""],
                    tensors=[tf.zeros([2])])
  with pytest.raises(ValueError, match=f"{prefix}: not an object-based"):
    restoring.object_graph(prefix)


def test_host_cpu_is_this_process_cpu_for_local_variables():
  net = small_net()
  assert tf.DeviceSpec.from_string(restoring.host_cpu(net)).device_type == "CPU"
  assert restoring.host_cpu(net).endswith("/device:CPU:0")
