"""An LSTM language model like the paper's: embedding, LSTM layers, softmax over the vocabulary."""

from __future__ import annotations

from typing import Optional, Sequence

import gin
import tensorflow as tf
import tf_keras as keras


@gin.configurable(module="models")
def lstm_lm(vocab_size: int = gin.REQUIRED, embedding_dim: int = 128,
            lstm_units: Sequence[int] = (256,), dropout: float = 0.0,
            seed: Optional[int] = None) -> keras.Model:
  """Functional model on ``{'tokens': int32 [B, T]}`` returning next-token logits [B, T, vocab_size].

  ``vocab_size`` must match the data's vocabulary (``text_lm.make_dataset.vocab_size``). With
  ``seed=None`` the initial weights follow the global random seed (the trainer sets it per group).
  """
  fixed = lambda offset: None if seed is None else seed * 1000 + offset
  tokens = keras.Input((None,), dtype=tf.int32, name="tokens")
  x = keras.layers.Embedding(vocab_size, embedding_dim, name="embedding",
                             embeddings_initializer=keras.initializers.RandomUniform(
                                 -0.05, 0.05, seed=fixed(0)))(tokens)
  for i, units in enumerate(lstm_units):
    x = keras.layers.LSTM(units, return_sequences=True, name=f"lstm_{i}",
                          kernel_initializer=keras.initializers.GlorotUniform(seed=fixed(10 + i)),
                          recurrent_initializer=keras.initializers.Orthogonal(seed=fixed(20 + i)))(x)
    if dropout:
      x = keras.layers.Dropout(dropout, seed=seed, name=f"dropout_{i}")(x)
  logits = keras.layers.Dense(vocab_size, name="logits",
                              kernel_initializer=keras.initializers.GlorotUniform(
                                  seed=fixed(99)))(x)
  return keras.Model({"tokens": tokens}, logits, name="lstm_lm")
