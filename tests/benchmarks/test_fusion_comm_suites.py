"""The fusion and comm suites' code paths at toy sizes (the suites themselves are not run in CI)."""

import pytest

from benchmarks import comm as comm_suite
from benchmarks import fusion as fusion_suite


def test_fusion_suite_measures_every_arm_and_its_speedups():
  steps = fusion_suite.measure(["ctr_adam", "lstm_lm_adam"], ["none", "backward", "forward",
                                                             "grads_only"], [False], steps=2,
                               rounds=1, scale=0.01)
  assert len(steps) == 8 and all(s["ms_per_step_best"] > 0 for s in steps.values())
  ratios = fusion_suite.speedups(steps)
  assert set(ratios) == {"ctr_adam/graph", "lstm_lm_adam/graph"}
  assert set(ratios["ctr_adam/graph"]) >= {"backward", "forward", "update_share_best"}


def test_comm_bytes_table_compares_allreduce_with_codistillation():
  table = comm_suite.bytes_table(batch_per_worker=8, exchange_every=100, scale=0.01)
  ctr = table["ctr"]
  assert ctr["sparse_gradients"] == 26 and ctr["gradients"] == 26 + 6
  two = ctr["allreduce"]["2"]
  assert two["plain"]["bytes_per_step"] == two["packed"]["bytes_per_step"]
  assert two["float16"]["bytes_per_step"] < two["packed"]["bytes_per_step"]
  reduction = ctr["reduction_at_default_interval"]["2"]["vs_packed_float32_as_sent"]
  assert reduction == pytest.approx(two["packed"]["bytes_per_step"]
                                    / ctr["codistill"]["100"]["bytes_per_step"])
