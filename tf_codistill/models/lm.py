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
  """Functional model on ``{'tokens': int32 [B, T]}`` returning next-token logits
  [B, T, vocab_size].

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
                          recurrent_initializer=keras.initializers.Orthogonal(
                              seed=fixed(20 + i)))(x)
    if dropout:
      x = keras.layers.Dropout(dropout, seed=seed, name=f"dropout_{i}")(x)
  logits = keras.layers.Dense(vocab_size, name="logits",
                              kernel_initializer=keras.initializers.GlorotUniform(
                                  seed=fixed(99)))(x)
  return keras.Model({"tokens": tokens}, logits, name="lstm_lm")


class _PositionEmbedding(keras.layers.Layer):
  """Learned position embeddings added to token embeddings [B, T, D] (T <= ``max_length``)."""

  def __init__(self, max_length: int, initializer=None, **kwargs):
    super().__init__(**kwargs)
    self.max_length = max_length
    self.initializer = keras.initializers.get(initializer or "glorot_uniform")

  def build(self, input_shape):
    self.positions = self.add_weight("positions", [self.max_length, input_shape[-1]],
                                     initializer=self.initializer)

  def call(self, x):
    return x + tf.cast(self.positions[:tf.shape(x)[1]], x.dtype)

  def get_config(self):
    return {**super().get_config(), "max_length": self.max_length,
            "initializer": keras.initializers.serialize(self.initializer)}


def _block(x, i: int, heads: int, width: int, ffn: int, dropout: float, init) -> tf.Tensor:
  """One pre-norm causal Transformer block (self-attention, then a ReLU feed-forward layer)."""
  h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"ln_attn_{i}")(x)
  h = keras.layers.MultiHeadAttention(heads, width // heads, dropout=dropout, name=f"attn_{i}",
                                      kernel_initializer=init(30 + i))(h, h, use_causal_mask=True)
  x = x + h
  h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"ln_ffn_{i}")(x)
  h = keras.layers.Dense(ffn, activation="relu", name=f"ffn_in_{i}",
                         kernel_initializer=init(40 + i))(h)
  h = keras.layers.Dense(width, name=f"ffn_out_{i}", kernel_initializer=init(50 + i))(h)
  if dropout:
    h = keras.layers.Dropout(dropout, name=f"dropout_{i}")(h)
  return x + h


@gin.configurable(module="models")
def transformer_lm(vocab_size: int = gin.REQUIRED, width: int = 128, layers: int = 2,
                   heads: int = 4, ffn_width: int = 512, max_length: int = 256,
                   dropout: float = 0.0, seed: Optional[int] = None) -> keras.Model:
  """A small causal (GPT-style, pre-norm) Transformer on ``{'tokens': int32 [B, T]}`` returning
  next-token logits [B, T, vocab_size]; T must be <= ``max_length``.

  ``width`` must be divisible by ``heads``. With ``seed=None`` the initial weights follow the
  global random seed (the trainer sets it per group).
  """
  if width % heads:
    raise ValueError(f"models.transformer_lm: width={width} is not divisible by heads={heads}")
  init = lambda offset: keras.initializers.GlorotUniform(
      seed=None if seed is None else seed * 1000 + offset)
  tokens = keras.Input((None,), dtype=tf.int32, name="tokens")
  x = keras.layers.Embedding(vocab_size, width, name="embedding",
                             embeddings_initializer=keras.initializers.RandomNormal(
                                 stddev=0.02, seed=None if seed is None else seed * 1000))(tokens)
  x = _PositionEmbedding(max_length, init(1), name="positions")(x)
  for i in range(layers):
    x = _block(x, i, heads, width, ffn_width, dropout, init)
  x = keras.layers.LayerNormalization(epsilon=1e-5, name="ln_final")(x)
  logits = keras.layers.Dense(vocab_size, name="logits", kernel_initializer=init(99))(x)
  return keras.Model({"tokens": tokens}, logits, name="transformer_lm")
