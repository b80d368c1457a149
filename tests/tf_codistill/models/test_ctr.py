"""The CTR model: shapes, and where its initial weights come from."""

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tf_codistill.models import ctr


def _weights(seed=None, global_seed=None):
  if global_seed is not None:
    keras.utils.set_random_seed(global_seed)
  model = ctr.ctr_model(num_dense=3, num_categorical=2, num_buckets=50, embedding_dim=4,
                        hidden_units=(8,), seed=seed)
  return model, np.concatenate([w.ravel() for w in model.get_weights()])


def test_logits_shape_from_dense_and_categorical_inputs():
  model, _ = _weights(seed=1)
  logits = model({"dense": tf.zeros([5, 3]), "categorical": tf.constant([[1, 2]] * 5, tf.int64)})
  assert logits.shape == (5, 1)


def test_unseeded_weights_follow_the_global_seed_so_retrains_differ():
  _, a = _weights(global_seed=1)
  _, b = _weights(global_seed=1)
  _, c = _weights(global_seed=2)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)


def test_explicit_seed_fixes_the_weights_whatever_the_global_seed():
  _, a = _weights(seed=3, global_seed=1)
  _, b = _weights(seed=3, global_seed=2)
  np.testing.assert_array_equal(a, b)
