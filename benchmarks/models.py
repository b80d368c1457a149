"""Benchmark models with synthetic data (static batch shapes): builders shared by the suites.

``lm_arm`` is the project's language model (``tf_codistill.models.lstm_lm``, tf_keras' ``LSTM``
layer) at the lm suite's size; ``lstm_lm`` / ``lstm_lm_arm`` is the same architecture built on
``RNN(LSTMCell)``, which XLA compiles once (tf_keras' ``LSTM`` layer recompiles every step under
``jit_compile``): the fusion suite's XLA arms and the comm suite's bytes table use it.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tf_codistill.models import ctr
from tf_codistill.models import lm

# The CTR model's serving inputs: 13 dense features, 26 categorical ids.
CTR_SPEC = {"dense": tf.TensorSpec([None, 13], tf.float32),
            "categorical": tf.TensorSpec([None, 26], tf.int64)}
Arm = Tuple[Callable[[], keras.Model], tf.data.Dataset, Callable[[], keras.optimizers.Optimizer],
            keras.losses.Loss]


def _n(value: int, scale: float) -> int:
  return max(2, int(value * scale))


def ctr_examples(batch: int, buckets: int) -> tf.data.Dataset:
  """8 batches' worth of synthetic CTR examples (13 dense features, 26 Zipf-distributed ids in
  ``buckets``, random labels), unbatched, the same every call."""
  rng = np.random.default_rng(0)
  n = batch * 8
  features = {"dense": rng.exponential(size=(n, 13)).astype("float32"),
              "categorical": rng.zipf(1.3, size=(n, 26)).astype("int64") % buckets}
  labels = rng.integers(0, 2, size=(n, 1)).astype("float32")
  return tf.data.Dataset.from_tensor_slices((features, labels))


def ctr_arm(optimizer: str, scale: float = 1.0, batch: int = 512) -> Arm:
  """The project's CTR model at the DESIGN size: 26 tables of 20000 x 16, batch 512."""
  buckets, batch = _n(20_000, scale), _n(batch, scale)
  data = ctr_examples(batch, buckets)
  make = {"adam": lambda: keras.optimizers.Adam(1e-3),
          "adagrad": lambda: keras.optimizers.Adagrad(1e-2)}[optimizer]
  return (lambda: ctr.ctr_model(num_buckets=buckets, embedding_dim=16, hidden_units=(256, 128),
                                seed=1),
          data.batch(batch, drop_remainder=True).repeat(), make,
          keras.losses.BinaryCrossentropy(from_logits=True))


def mlp_arm(scale: float = 1.0) -> Arm:
  """Dense-only: 512 inputs -> 3 x Dense(1024, relu) -> 1 logit, batch 128."""
  width, batch = _n(1024, scale), _n(128, scale)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(batch * 8, 512)).astype("float32")
  y = (x[:, :1] > 0).astype("float32")

  def make():
    init = lambda i: keras.initializers.GlorotUniform(seed=i)
    inputs = keras.Input((512,))
    h = inputs
    for i in range(3):
      h = keras.layers.Dense(width, activation="relu", kernel_initializer=init(i))(h)
    return keras.Model(inputs, keras.layers.Dense(1, kernel_initializer=init(9))(h))

  data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()
  return (make, data, lambda: keras.optimizers.Adam(1e-3),
          keras.losses.BinaryCrossentropy(from_logits=True))


def lstm_lm(vocab: int, embedding_dim: int = 64, units: int = 256, seed: int = 1) -> keras.Model:
  """Next-token LSTM language model: token ids [B, T] -> logits [B, T, vocab]."""
  tokens = keras.Input((None,), dtype=tf.int64, name="tokens")
  x = keras.layers.Embedding(vocab, embedding_dim,
                             embeddings_initializer=keras.initializers.RandomUniform(
                                 -0.05, 0.05, seed=seed))(tokens)
  # keras.layers.RNN(LSTMCell), not keras.layers.LSTM: the same math and weights, but the LSTM
  # layer's implementation-selecting defun makes XLA recompile the train step at every call
  # (~2 s and ~50 MB of never-freed executable a step on CPU); the generic RNN loop compiles once.
  x = keras.layers.RNN(keras.layers.LSTMCell(
      units, kernel_initializer=keras.initializers.GlorotUniform(seed + 1),
      recurrent_initializer=keras.initializers.Orthogonal(seed=seed + 2)),
      return_sequences=True, name="lstm")(x)
  logits = keras.layers.Dense(
      vocab, kernel_initializer=keras.initializers.GlorotUniform(seed + 3))(x)
  return keras.Model(tokens, logits, name="lstm_lm")


def lstm_lm_arm(scale: float = 1.0) -> Arm:
  """The LM stand-in: vocabulary 10000, sequences of 20 synthetic (Zipf) token ids, batch 16."""
  vocab, batch, length = _n(10_000, scale), _n(16, scale), 20
  rng = np.random.default_rng(0)
  ids = (rng.zipf(1.2, size=(batch * 8, length + 1)) % vocab).astype("int64")
  data = tf.data.Dataset.from_tensor_slices((ids[:, :-1], ids[:, 1:]))
  return (lambda: lstm_lm(vocab), data.batch(batch, drop_remainder=True).repeat(),
          lambda: keras.optimizers.Adam(1e-3),
          keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def lm_arm(scale: float = 1.0) -> Arm:
  """The project's LM at the lm suite's size (gin/lm/common.gin): vocabulary 8000, Embedding 128,
  LSTM 256, windows of 32 synthetic (Zipf) token ids, batch 32, Adam 2e-3."""
  vocab, batch, length = _n(8000, scale), _n(32, scale), 32
  rng = np.random.default_rng(0)
  ids = (rng.zipf(1.2, size=(batch * 8, length + 1)) % vocab).astype("int32")
  data = tf.data.Dataset.from_tensor_slices(({"tokens": ids[:, :-1]}, ids[:, 1:]))
  return (lambda: lm.lstm_lm(vocab, embedding_dim=_n(128, scale), lstm_units=(_n(256, scale),),
                             seed=1),
          data.batch(batch, drop_remainder=True).repeat(), lambda: keras.optimizers.Adam(2e-3),
          keras.losses.SparseCategoricalCrossentropy(from_logits=True))


# name -> builder(scale) of (model factory, dataset, optimizer factory, loss)
MODELS: Dict[str, Callable[[float], Arm]] = {
    "ctr_adam": lambda s: ctr_arm("adam", s), "ctr_adagrad": lambda s: ctr_arm("adagrad", s),
    "mlp_adam": mlp_arm, "lstm_lm_adam": lm_arm, "lstm_lm_rnn_adam": lstm_lm_arm}
# Models whose train step XLA recompiles at every call (tf_keras' LSTM layer): no jit arms.
NO_JIT = ("lstm_lm_adam",)
