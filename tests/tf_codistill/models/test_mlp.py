"""The image MLP: shapes, no BatchNorm, and where its initial weights come from."""

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tf_codistill.models import mlp


def _weights(seed=None, global_seed=None):
  if global_seed is not None:
    keras.utils.set_random_seed(global_seed)
  model = mlp.mlp(num_classes=10, image_size=8, channels=1, hidden_units=(16, 8), seed=seed)
  return model, np.concatenate([w.ravel() for w in model.get_weights()])


def test_logits_over_the_classes_from_images():
  model, _ = _weights(seed=1)
  assert model({"image": tf.zeros([5, 8, 8, 1])}).shape == (5, 10)
  # Flatten, two hidden layers and the logits: a restored teacher computes what the peer did.
  assert ([type(layer).__name__ for layer in model.layers[1:]]
          == ["Flatten", "Dense", "Dense", "Dense"])


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
