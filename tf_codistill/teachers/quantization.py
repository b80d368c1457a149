"""int8 teachers: weight-only quantized copies of a peer's model, in under a third of its memory.

``int8_copy(model)`` clones a Sequential or functional model with every ``Embedding`` and
``Dense`` layer replaced by an int8 one: codes ``round(w / scale)`` with one float32 scale per
row of the weight seen as rows of its last axis (``weight_codecs``' int8 codec: an embedding row,
a kernel's input row), dequantized where they are used. An embedding dequantizes only the rows it
gathers; a dense layer dequantizes its kernel each call and multiplies in bfloat16 (int8 codes
times a float32 scale, rounded to bfloat16: the precision of a bfloat16 teacher's weights), its
output in the layer's compute dtype. Other layers (LSTM, convolutions, batch norm) keep float32
variables. A row of width w takes w + 4 bytes instead of 4w (0.31 of it for the CTR model's
16-wide embeddings). A teacher copy is never trained: its values come from a peer's float32
weights through ``assign_float_weights``, quantized off the training thread.

Int8 layers are one kind of ``ConvertedLayer``: a teacher layer that holds the float weights of
one or more of the student's layers in another form (int8 codes here, embedding tables stacked
into one in ``models.ctr.StackedEmbeddings``, int8 tables with one scale per column folded into
the next kernel in ``models.ctr.Int8StackedInput``). ``float_shapes``, ``float_weights`` and
``assign_float_weights`` see any model through them in the student's ``weights`` order.
"""

from __future__ import annotations

from typing import Iterator, List, Sequence, Union

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tf_codistill.exchange import weight_codecs

ArrayOrTensor = Union[np.ndarray, tf.Tensor]  # float values to assign: numpy, or read by TF


class ConvertedLayer(keras.layers.Layer):
  """A teacher layer holding the float weights of student layers in another form."""

  def float_shapes(self) -> List[tf.TensorShape]:
    """Shapes of the float weights this layer holds, in the student's order."""
    raise NotImplementedError

  def float_weights(self) -> List[np.ndarray]:
    """The float values this layer stands for, in the student's order."""
    raise NotImplementedError

  def assign_float(self, values: Sequence[ArrayOrTensor]) -> None:
    """Converts the student's float weights ``values`` (arrays or tensors) into this layer."""
    raise NotImplementedError


class Int8Layer(ConvertedLayer):
  """A layer with one int8-coded weight (``codes`` + per-row ``scales``) and maybe a bias."""

  def _add_codes(self, rows: int, width: int) -> None:
    self.codes = self.add_weight("codes", [rows, width], tf.int8, "zeros", trainable=False)
    self.scales = self.add_weight("scales", [rows], tf.float32, "zeros", trainable=False)

  def dequantized_rows(self, ids: tf.Tensor) -> tf.Tensor:
    """The float32 rows ``ids`` of the coded weight: one gather of codes, one of scales."""
    return (tf.cast(tf.gather(self.codes, ids), tf.float32)
            * tf.expand_dims(tf.gather(self.scales, ids), -1))

  def float_shapes(self) -> List[tf.TensorShape]:
    """Shapes of the float layer's weights this layer holds, in that layer's order."""
    return [self.codes.shape] + ([self.bias.shape] if getattr(self, "bias", None) is not None
                                 else [])

  def float_weights(self) -> List[np.ndarray]:
    """The float values this layer stands for (dequantized), in the float layer's order."""
    kernel = weight_codecs.decode(weight_codecs.Encoded(self.codes.numpy(), self.scales.numpy()))
    return [kernel] + [w.numpy() for w in self.weights[2:]]

  def assign_float(self, values: Sequence[ArrayOrTensor]) -> None:
    """Quantizes the float layer's weights ``values`` into this layer."""
    encoded = weight_codecs.encode(np.asarray(values[0], np.float32), "int8")
    self.codes.assign(encoded.values.reshape(self.codes.shape))
    self.scales.assign(encoded.scales)
    for var, value in zip(self.weights[2:], values[1:]):
      var.assign(tf.cast(value, var.dtype))


class Int8Embedding(Int8Layer):
  """``keras.layers.Embedding`` with int8 rows: gathers codes and scales, then dequantizes."""

  def __init__(self, input_dim: int, output_dim: int, mask_zero: bool = False, **kwargs):
    super().__init__(**kwargs)
    self.input_dim, self.output_dim, self.mask_zero = int(input_dim), int(output_dim), mask_zero

  def build(self, input_shape):
    self._add_codes(self.input_dim, self.output_dim)
    super().build(input_shape)

  def call(self, inputs):
    ids = tf.cast(inputs, tf.int32) if inputs.dtype not in (tf.int32, tf.int64) else inputs
    return self.dequantized_rows(ids)

  def compute_mask(self, inputs, mask=None):
    return tf.not_equal(inputs, 0) if self.mask_zero else None


class Int8Dense(Int8Layer):
  """``keras.layers.Dense`` with an int8 kernel (one scale per input row)."""

  def __init__(self, units: int, activation=None, use_bias: bool = True, **kwargs):
    super().__init__(**kwargs)
    self.units, self.use_bias = int(units), use_bias
    self.activation = keras.activations.get(activation)

  def build(self, input_shape):
    self._add_codes(int(input_shape[-1]), self.units)
    self.bias = (self.add_weight("bias", [self.units], tf.float32, "zeros", trainable=False)
                 if self.use_bias else None)
    super().build(input_shape)

  def call(self, inputs, input_scales=None):
    """``activation(inputs @ kernel + bias)``. ``input_scales`` (a float32 vector): the leading
    inputs come as int8 codes, input i meaning ``inputs[..., i] * input_scales[i]``; each scale
    multiplies its kernel row instead (once per call, not once per example), the other inputs
    are values (``models.ctr.Int8StackedInput``)."""
    scales = self.scales
    if input_scales is not None:
      scales = scales * tf.pad(input_scales, [[0, self.codes.shape[0] - input_scales.shape[0]]],
                               constant_values=1.0)
    # The kernel is dequantized through float32 (TF's int8 -> bfloat16 cast is slower than
    # int8 -> float32, a multiply and float32 -> bfloat16 together) and multiplied in bfloat16
    # (oneDNN's bf16 kernels, about twice float32's speed on CPUs with AVX512_BF16/AMX),
    # accumulated in float32; the output comes back in the layer's compute dtype.
    kernel = tf.cast(tf.cast(self.codes, tf.float32) * tf.expand_dims(scales, -1), tf.bfloat16)
    inputs = tf.cast(inputs, tf.bfloat16)
    if inputs.shape.rank == 2:
      outputs = tf.matmul(inputs, kernel)
    else:
      outputs = tf.tensordot(inputs, kernel, [[inputs.shape.rank - 1], [0]])
    outputs = tf.cast(outputs, self.compute_dtype)
    if self.bias is not None:
      outputs = tf.nn.bias_add(outputs, tf.cast(self.bias, self.compute_dtype))
    return self.activation(outputs)


def _int8_layer(layer: keras.layers.Layer) -> keras.layers.Layer:
  """clone_model's clone_function: the int8 version of an Embedding or Dense layer, else a
  float copy."""
  config = layer.get_config()
  if type(layer) is keras.layers.Embedding:
    return Int8Embedding(config["input_dim"], config["output_dim"],
                         mask_zero=config.get("mask_zero", False), name=config["name"])
  if type(layer) is keras.layers.Dense:
    return Int8Dense(config["units"], config["activation"], config["use_bias"],
                     name=config["name"])
  return layer.__class__.from_config(config)


def int8_copy(model: keras.Model) -> keras.Model:
  """A copy of a Sequential or functional model with int8 Embedding and Dense layers."""
  return keras.models.clone_model(model, clone_function=_int8_layer)


def _leaves(model: keras.layers.Layer) -> Iterator[keras.layers.Layer]:
  """The layers of ``model`` that hold weights (or will: converted layers), in the order of
  ``model.weights``."""
  for layer in model.layers:
    if isinstance(layer, ConvertedLayer):
      yield layer
    elif isinstance(layer, keras.Model):
      yield from _leaves(layer)
    elif layer.weights:
      yield layer


def is_quantized(model: keras.Model) -> bool:
  """Whether ``model`` has int8 layers."""
  return any(isinstance(layer, Int8Layer) for layer in _leaves(model))


def is_converted(model: keras.Model) -> bool:
  """Whether ``model`` has layers that hold the student's weights in another form (int8,
  stacked tables): then a float32 checkpoint cannot be restored into it directly."""
  return any(isinstance(layer, ConvertedLayer) for layer in _leaves(model))


def restores_from_float32(model: keras.Model) -> bool:
  """Whether a float32 checkpoint of the student restores into ``model`` as it is: no converted
  layers and every floating variable float32 (else its float32 values are read by key,
  ``restoring.py``, and assigned by ``assign_float_weights``)."""
  return not is_converted(model) and all(
      v.dtype == tf.float32 for v in model.weights if v.dtype.is_floating)


def float_shapes(model: keras.Model) -> List[tf.TensorShape]:
  """The shapes of the float32 weights ``model`` stands for (its own, for a float model)."""
  if not is_converted(model):  # any model, subclassed ones included: its own weights' order
    return [v.shape for v in model.weights]
  return [s for layer in _leaves(model)
          for s in (layer.float_shapes() if isinstance(layer, ConvertedLayer)
                    else [v.shape for v in layer.weights])]


def float_weights(model: keras.Model) -> List[np.ndarray]:
  """The float32 weights ``model`` stands for, in the float model's ``weights`` order."""
  if not is_converted(model):
    return [np.asarray(w, np.float32) for w in model.get_weights()]
  return [np.asarray(w, np.float32) for layer in _leaves(model)
          for w in (layer.float_weights() if isinstance(layer, ConvertedLayer)
                    else layer.get_weights())]


def assign_float_weights(model: keras.Model, values: Sequence[ArrayOrTensor]) -> None:
  """Assigns float weights (arrays or tensors, in the float model's ``weights`` order) to
  ``model``: cast into float and bfloat16 variables, converted into converted layers (quantized,
  stacked); the casts and stacking run on the current device.

  Raises:
    ValueError: the values do not match the model's weights in number or shape.
  """
  shapes = float_shapes(model)
  if len(values) != len(shapes):
    raise ValueError(f"{len(values)} arrays for a model with {len(shapes)} weights")
  for value, shape in zip(values, shapes):
    value_shape = tuple(value.shape) if tf.is_tensor(value) else np.shape(value)  # no copy
    if value_shape != tuple(shape):
      raise ValueError(f"an array of shape {value_shape} where the teacher has {shape}")
  if not is_converted(model):
    for var, value in zip(model.weights, values):
      var.assign(tf.cast(value, var.dtype))
    return
  start = 0
  for layer in _leaves(model):
    converted = isinstance(layer, ConvertedLayer)
    count = len(layer.float_shapes()) if converted else len(layer.weights)
    chunk = values[start:start + count]
    start += count
    if converted:
      layer.assign_float(chunk)
    else:
      for var, value in zip(layer.weights, chunk):
        var.assign(tf.cast(value, var.dtype))
