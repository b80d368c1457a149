"""A multilayer perceptron on images: flatten, ReLU hidden layers, logits over the classes."""

from __future__ import annotations

from typing import Optional, Sequence

import gin
import tensorflow as tf
import tf_keras as keras


@gin.configurable(module="models")
def mlp(num_classes: int = gin.REQUIRED, image_size: int = 28, channels: int = 1,
        hidden_units: Sequence[int] = (512, 512), dropout: float = 0.0, l2: float = 0.0,
        seed: Optional[int] = None) -> keras.Model:
  """Functional MLP on ``{'image': float32 [B, H, W, C]}`` returning logits [B, num_classes].

  No BatchNorm: a teacher restored from a peer's variables computes exactly what the peer's
  training step computed (the ResNet's teachers use moving statistics instead). With
  ``seed=None`` initial weights follow the global random seed (the trainer sets it per group).
  """
  fixed = lambda offset: None if seed is None else seed * 1000 + offset
  regularizer = keras.regularizers.L2(l2) if l2 else None
  image = keras.Input((image_size, image_size, channels), dtype=tf.float32, name="image")
  x = keras.layers.Flatten(name="flatten")(image)
  for i, units in enumerate(hidden_units):
    x = keras.layers.Dense(units, activation="relu", kernel_regularizer=regularizer,
                           kernel_initializer=keras.initializers.GlorotUniform(seed=fixed(i)),
                           name=f"hidden_{i}")(x)
    if dropout:
      x = keras.layers.Dropout(dropout, seed=seed, name=f"dropout_{i}")(x)
  logits = keras.layers.Dense(num_classes, name="logits",
                              kernel_initializer=keras.initializers.GlorotUniform(seed=fixed(99)))(x)
  return keras.Model({"image": image}, logits, name="mlp")
