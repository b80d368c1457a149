"""A CTR model: one embedding per categorical feature + dense features -> MLP -> one logit."""

from __future__ import annotations

from typing import Optional, Sequence

import gin
import tensorflow as tf
import tf_keras as keras


@gin.configurable(module="models")
def ctr_model(num_dense: int = 13, num_categorical: int = 26, num_buckets: int = 100_000,
              embedding_dim: int = 16, hidden_units: Sequence[int] = (256, 128),
              dropout: float = 0.0, l2: float = 0.0, seed: Optional[int] = None) -> keras.Model:
  """Functional DLRM/Wide&Deep-like model on {'dense': [B, num_dense], 'categorical': [B, num_cat]}.

  ``num_buckets`` must match the input pipeline's hashing (``criteo.make_dataset.num_buckets``).
  Returns logits of shape [B, 1]. With ``seed=None`` the initial weights follow the global random
  seed (the trainer sets it from ``trainer.train.seed`` and the group, so retrains and groups start
  from different weights); an int fixes them.
  """
  dense_in = keras.Input((num_dense,), dtype=tf.float32, name="dense")
  cat_in = keras.Input((num_categorical,), dtype=tf.int64, name="categorical")
  fixed = lambda offset: None if seed is None else seed * 1000 + offset
  init = lambda i: keras.initializers.RandomUniform(-0.05, 0.05, seed=fixed(i))
  regularizer = keras.regularizers.L2(l2) if l2 else None
  embedded = []
  for i in range(num_categorical):
    column = keras.layers.Lambda(lambda t, i=i: t[:, i], name=f"cat_{i}")(cat_in)
    embedded.append(keras.layers.Embedding(num_buckets, embedding_dim, embeddings_initializer=init(i),
                                           embeddings_regularizer=regularizer,
                                           name=f"embedding_{i}")(column))
  x = keras.layers.Concatenate(name="concat")(embedded + [dense_in])
  for j, units in enumerate(hidden_units):
    x = keras.layers.Dense(units, activation="relu", kernel_regularizer=regularizer,
                           kernel_initializer=keras.initializers.GlorotUniform(seed=fixed(100 + j)),
                           name=f"hidden_{j}")(x)
    if dropout:
      x = keras.layers.Dropout(dropout, seed=seed, name=f"dropout_{j}")(x)
  logits = keras.layers.Dense(1, name="logits",
                              kernel_initializer=keras.initializers.GlorotUniform(seed=fixed(99)))(x)
  return keras.Model({"dense": dense_in, "categorical": cat_in}, logits, name="ctr_model")
