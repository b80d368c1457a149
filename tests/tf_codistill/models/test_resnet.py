"""Tests of the small ResNet."""

import numpy as np
import tensorflow as tf

from tf_codistill.models import resnet
from tf_codistill.training.model import clone_architecture


def test_shapes_downsampling_and_clone():
  model = resnet.resnet(10, image_size=28, channels=1, widths=(8, 16, 32), blocks_per_stage=2,
                        seed=0)
  image = tf.random.stateless_uniform([3, 28, 28, 1], seed=[0, 1])
  logits = model({"image": image}, training=False)
  assert logits.shape == (3, 10)
  assert model.get_layer("stage2_block0_out").output.shape[1:] == (7, 7, 32)
  clone = clone_architecture(model)
  clone.set_weights(model.get_weights())
  np.testing.assert_allclose(clone({"image": image}, training=False), logits, rtol=1e-5, atol=1e-6)
