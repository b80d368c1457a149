"""GradientReducer: nothing to reduce with one replica; unknown dtypes name the binding."""

import pytest
import tensorflow as tf

from tf_codistill.optim import comm


def test_one_replica_reduces_nothing_and_bad_dtypes_name_the_binding():
  grads = [tf.constant([1.0, 2.0]), None]
  assert comm.GradientReducer("float16").reduce(grads) == grads
  with pytest.raises(ValueError, match=r"tfc.Group.allreduce_dtype='int8' is not one of"):
    comm.GradientReducer("int8")
