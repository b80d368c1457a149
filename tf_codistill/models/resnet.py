"""A small ResNet (He et al. 2016, the CIFAR variant): 3x3 stem, residual stages, global pooling."""

from __future__ import annotations

from typing import Optional, Sequence

import gin
import tensorflow as tf
import tf_keras as keras


def _block(x, filters: int, stride: int, name: str, init, l2: float, momentum: float):
  """Basic residual block: conv-BN-ReLU-conv-BN + shortcut (1x1 conv when the shape changes)."""
  reg = keras.regularizers.L2(l2) if l2 else None
  conv = lambda f, k, s, n: keras.layers.Conv2D(f, k, strides=s, padding="same", use_bias=False,
                                                kernel_initializer=init(), kernel_regularizer=reg,
                                                name=f"{name}_{n}")
  y = conv(filters, 3, stride, "conv1")(x)
  y = keras.layers.BatchNormalization(momentum=momentum, name=f"{name}_bn1")(y)
  y = keras.layers.ReLU(name=f"{name}_relu1")(y)
  y = conv(filters, 3, 1, "conv2")(y)
  y = keras.layers.BatchNormalization(momentum=momentum, name=f"{name}_bn2")(y)
  if stride != 1 or x.shape[-1] != filters:
    x = conv(filters, 1, stride, "shortcut")(x)
    x = keras.layers.BatchNormalization(momentum=momentum, name=f"{name}_shortcut_bn")(x)
  return keras.layers.ReLU(name=f"{name}_out")(keras.layers.Add(name=f"{name}_add")([x, y]))


@gin.configurable(module="models")
def resnet(num_classes: int = gin.REQUIRED, image_size: int = 28, channels: int = 1,
           widths: Sequence[int] = (16, 32, 64), blocks_per_stage: int = 1, l2: float = 0.0,
           bn_momentum: float = 0.9, seed: Optional[int] = None) -> keras.Model:
  """Functional ResNet on ``{'image': float32 [B, H, W, C]}`` returning logits [B, num_classes].

  Stage i has ``blocks_per_stage`` blocks of ``widths[i]`` filters; every stage after the first
  halves the resolution. ``bn_momentum`` 0.9 (Keras: 0.99) lets the moving statistics evaluation
  uses follow within tens of steps, which short runs need. With ``seed=None`` initial weights
  follow the global random seed.
  """
  counter = iter(range(10_000))
  init = lambda: keras.initializers.HeNormal(
      seed=None if seed is None else seed * 1000 + next(counter))
  image = keras.Input((image_size, image_size, channels), dtype=tf.float32, name="image")
  x = keras.layers.Conv2D(widths[0], 3, padding="same", use_bias=False, kernel_initializer=init(),
                          name="stem_conv")(image)
  x = keras.layers.BatchNormalization(momentum=bn_momentum, name="stem_bn")(x)
  x = keras.layers.ReLU(name="stem_relu")(x)
  for stage, filters in enumerate(widths):
    for block in range(blocks_per_stage):
      stride = 2 if stage > 0 and block == 0 else 1
      x = _block(x, filters, stride, f"stage{stage}_block{block}", init, l2, bn_momentum)
  x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
  logits = keras.layers.Dense(num_classes, name="logits",
                              kernel_initializer=keras.initializers.GlorotUniform(
                                  seed=None if seed is None else seed * 1000 + 999))(x)
  return keras.Model({"image": image}, logits, name="resnet")
