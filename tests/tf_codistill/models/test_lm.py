"""Tests of the LSTM language model."""

import numpy as np
import pytest
import tensorflow as tf

from tf_codistill.models import lm
from tf_codistill.training.model import clone_architecture


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


def test_transformer_is_causal_and_clones():
  model = lm.transformer_lm(40, width=16, layers=2, heads=2, ffn_width=32, max_length=8, seed=2)
  tokens = tf.constant([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], tf.int32)
  logits = model({"tokens": tokens})
  assert logits.shape == (2, 5, 40)
  changed = model({"tokens": tf.constant([[1, 2, 3, 39, 39], [6, 7, 8, 39, 39]], tf.int32)})
  np.testing.assert_allclose(changed[:, :3], logits[:, :3], rtol=1e-5, atol=1e-6)
  assert not np.allclose(changed[:, 3:], logits[:, 3:])
  clone = clone_architecture(model)
  clone.set_weights(model.get_weights())
  np.testing.assert_allclose(clone({"tokens": tokens}), logits, rtol=1e-5, atol=1e-6)
  again = lm.transformer_lm(40, width=16, layers=2, heads=2, ffn_width=32, max_length=8, seed=2)
  for x, y in zip(model.get_weights(), again.get_weights()):
    np.testing.assert_array_equal(x, y)


def test_transformer_refuses_a_width_the_heads_do_not_divide():
  with pytest.raises(ValueError, match="width=10 is not divisible by heads=4"):
    lm.transformer_lm(40, width=10, heads=4)
