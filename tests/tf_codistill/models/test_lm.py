"""Tests of the LSTM language model."""

import numpy as np
import tensorflow as tf

from tf_codistill.model import clone_architecture
from tf_codistill.models import lm


def test_shapes_and_a_clone_with_copied_weights_agrees():
  model = lm.lstm_lm(50, embedding_dim=8, lstm_units=(16, 16), seed=1)
  tokens = tf.constant([[1, 2, 3, 4], [5, 6, 7, 8]], tf.int32)
  logits = model({"tokens": tokens})
  assert logits.shape == (2, 4, 50)
  clone = clone_architecture(model)
  clone.set_weights(model.get_weights())
  np.testing.assert_allclose(clone({"tokens": tokens}), logits, rtol=1e-6)
  # Causal: the first position's logits do not depend on later tokens.
  other = model({"tokens": tf.constant([[1, 9, 9, 9], [5, 9, 9, 9]], tf.int32)})
  np.testing.assert_allclose(other[:, 0], logits[:, 0], rtol=1e-6)


def test_seed_fixes_initial_weights():
  a, b = lm.lstm_lm(20, 4, (8,), seed=3), lm.lstm_lm(20, 4, (8,), seed=3)
  for x, y in zip(a.get_weights(), b.get_weights()):
    np.testing.assert_array_equal(x, y)
