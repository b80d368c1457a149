"""The fused update kernels (fusion.py) in a plain training loop, without Keras' fit."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill.optim import fusion

import fusion_cases as cases


def _train(make_optimizer, mode, steps=4):
  """Weights after ``steps`` steps of a custom loop: optimizer.minimize (mode None) or
  fusion.minimize with an OptimizerFusion built on the model's variables."""
  model = cases.model()
  optimizer = make_optimizer()
  loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
  batches = iter(cases.data())
  x0 = next(iter(cases.data()))[0]
  model(x0)
  optimizer.build(model.trainable_variables)
  fused = None
  if mode:
    fused = fusion.OptimizerFusion(optimizer, mode)
    fused.build(model.trainable_variables, fusion.probe_gradients(model, x0))

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      if fused is not None and mode == "forward":
        with fused.forward(model, tape):
          logits = model(x, training=True)
      else:
        logits = model(x, training=True)
      loss = loss_fn(y, logits)
    fusion.minimize(optimizer, loss, tape, model.trainable_variables, fusion=fused)

  for _ in range(steps):
    step(*next(batches))
  if fused is not None:
    fused.flush()
  return model.get_weights()


@pytest.mark.parametrize("mode", ["kernels", "backward", "forward"])
@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adagrad"])
def test_fused_kernels_in_a_custom_loop_give_the_optimizers_weights(name, mode):
  reference = _train(cases.OPTIMIZERS[name], None)
  cases.assert_same(reference, _train(cases.OPTIMIZERS[name], mode))
  assert not np.allclose(reference[0], cases.model().get_weights()[0])  # it trained


def test_unsupported_optimizers_and_modes_are_refused_before_building():
  with pytest.raises(fusion.FusionError, match=r"no fused update for .*Nadam.*supported"):
    fusion.OptimizerFusion(keras.optimizers.Nadam(0.01), "backward")
  with pytest.raises(fusion.FusionError, match="needs no OptimizerFusion"):
    fusion.OptimizerFusion(keras.optimizers.Adam(0.01), "none")


def test_probe_finds_the_embedding_gradient_sparse():
  specs = fusion.probe_gradients(cases.model(), next(iter(cases.data()))[0])
  assert specs[0] is not None and specs[0].shape.as_list() == [16 * 3, 4]
  assert all(s is None for s in specs[1:])
