"""Models, data and optimizers shared by the fusion tests (test_fusion.py, test_fused_models.py)."""

import numpy as np
import tensorflow as tf
import tf_keras as keras

STEPS = 6  # batches per epoch of data()


def model(seed=1):
  """Embedding (IndexedSlices gradients) + dense features -> MLP: both gradient kinds."""
  ids = keras.Input((3,), dtype=tf.int64, name="ids")
  num = keras.Input((4,), name="num")
  emb = keras.layers.Embedding(
      50, 4, embeddings_initializer=keras.initializers.RandomUniform(-0.1, 0.1, seed=seed))(ids)
  h = keras.layers.Concatenate()([keras.layers.Flatten()(emb), num])
  h = keras.layers.Dense(8, activation="relu", kernel_constraint=keras.constraints.MaxNorm(2.0),
                         kernel_initializer=keras.initializers.GlorotUniform(seed))(h)
  out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed + 1))(h)
  return keras.Model({"ids": ids, "num": num}, out)


def data(seed=0):
  """STEPS batches of 16 examples for model(), labels from the first dense feature plus noise."""
  rng = np.random.default_rng(seed)
  n = 16 * STEPS
  x = {"ids": rng.integers(0, 50, size=(n, 3)), "num": rng.normal(size=(n, 4)).astype("float32")}
  y = (x["num"][:, :1] + rng.normal(size=(n, 1)) > 0).astype("float32")
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
}


def compiled(make_optimizer, jit):
  """``model()`` compiled with a new optimizer and the binary cross-entropy of logits."""
  net = model()
  net.compile(make_optimizer(), keras.losses.BinaryCrossentropy(from_logits=True),
              jit_compile=jit)
  return net


# Float round-off differs between the fused kernels and tf_keras' ops; Adam's normalized update
# (m / sqrt(v)) magnifies it where v is tiny: 2e-5 is 0.2% of one Adam step at lr=0.01.
def assert_same(reference, other, rtol=1e-4, atol=2e-5):
  for a, b in zip(reference, other):
    np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)


def slots(optimizer):
  """The optimizer's state; SGD without momentum never reads its momentum slot (not written)."""
  if isinstance(optimizer, keras.optimizers.SGD) and not optimizer.momentum:
    return [optimizer.iterations.numpy()]
  return [v.numpy() for v in optimizer.variables]
