"""outer: the outer optimizers against a transcription of PyTorch's SGD, and bit-reproducibility."""

import numpy as np
import pytest

from tf_codistill.optim import outer


def _torch_sgd(params, grads_per_round, lr, mu, nesterov):
  """PyTorch SGD (dampening 0, no weight decay), transcribed from its documentation."""
  p, b = params.astype(np.float64), None
  for g in grads_per_round:
    b = g.copy() if b is None else mu * b + g
    d = g + mu * b if nesterov else b
    p = p - lr * d
  return p, b


@pytest.mark.parametrize("kind", ["nesterov", "momentum"])
def test_momentum_kinds_follow_pytorch_sgd_over_three_rounds(kind):
  rng = np.random.default_rng(0)
  changes = [[rng.normal(size=(3, 4)).astype(np.float32)] for _ in range(3)]
  opt = outer.OuterOptimizer(kind, 0.7, 0.9)
  start = [rng.normal(size=(3, 4)).astype(np.float32)]
  got, b = start, None
  for change in changes:
    got, b = opt.step(got, change, b)
  want, want_b = _torch_sgd(start[0], [c[0].astype(np.float64) for c in changes], 0.7, 0.9,
                            kind == "nesterov")
  np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(b[0], want_b, rtol=1e-5, atol=1e-5)
  assert got[0].dtype == np.float32 and b[0].dtype == np.float32


def test_first_round_momentum_is_the_change_itself():
  change = [np.array([1.0, -2.0], np.float32)]
  theta, b = outer.OuterOptimizer("nesterov", 0.5, 0.9).step([np.zeros(2, np.float32)], change,
                                                             None)
  np.testing.assert_array_equal(b[0], change[0])
  np.testing.assert_allclose(theta[0], -0.5 * (1 + 0.9) * change[0], rtol=1e-6)


def test_average_is_the_mean_of_the_members_parameters():
  rng = np.random.default_rng(1)
  anchor = [rng.normal(size=(5,)).astype(np.float32)]
  locals_ = [[rng.normal(size=(5,)).astype(np.float32)] for _ in range(3)]
  changes = [[anchor[0] - p[0]] for p in locals_]
  theta, b = outer.OuterOptimizer("average").step(anchor, outer.average_in_order(changes), None)
  assert b is None
  np.testing.assert_allclose(theta[0], np.mean([p[0] for p in locals_], axis=0), atol=1e-6)


def test_the_accumulation_is_float64_in_order_and_rounded_once():
  rng = np.random.default_rng(2)
  scales = [np.float32(10.0 ** rng.integers(-6, 6)) for _ in range(4)]
  changes = [[rng.normal(size=(64, 33)).astype(np.float32) * s] for s in scales]
  once = outer.average_in_order(changes)
  total = changes[0][0].astype(np.float64)
  for c in changes[1:]:
    total = total + c[0].astype(np.float64)
  np.testing.assert_array_equal(once[0], (total / 4).astype(np.float32))
  # Not float32 accumulation, which rounds at every addition.
  float32_sum = changes[0][0] + changes[1][0] + changes[2][0] + changes[3][0]
  assert not np.array_equal(once[0], float32_sum / np.float32(4))


def test_digest_tells_arrays_apart_and_finiteness_is_checked():
  a = [np.ones((2, 2), np.float32)]
  assert outer.digest(a) == outer.digest([np.ones((2, 2), np.float32)])
  assert outer.digest(a) != outer.digest([np.ones((4,), np.float32)])
  assert outer.all_finite(a) and not outer.all_finite([np.array([np.nan], np.float32)])


def test_unknown_kind_and_empty_average_are_refused():
  with pytest.raises(ValueError, match="'adam' is not one of"):
    outer.OuterOptimizer("adam")
  with pytest.raises(ValueError, match="no member changes"):
    outer.average_in_order([])
