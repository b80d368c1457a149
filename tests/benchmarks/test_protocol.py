"""benchmarks/protocol.py: the rules of the pre-registered comparisons, on hand-made curves."""

import pytest

from benchmarks import protocol


def test_best_loss_judges_an_overfitting_run_by_its_best_point():
  curve = [(100, 0.5), (200, 0.3), (300, 0.45)]
  assert protocol.best_loss(curve) == 0.3
  assert protocol.steps_to(curve, 0.35) == 200
  assert protocol.steps_to(curve, 0.2) is None


def test_mean_curve_keeps_the_steps_every_curve_has():
  assert protocol.mean_curve([[(1, 1.0), (2, 0.5)], [(1, 0.0), (2, 0.3), (3, 0.1)]]) == [
      (1, 0.5), (2, pytest.approx(0.4))]


def test_target_is_the_best_sync_arms_minimum():
  name, target = protocol.best_arm({"sync_b": [[(1, 0.5), (2, 0.4)], [(1, 0.5), (2, 0.2)]],
                                    "sync_2b": [[(1, 0.35), (2, 0.45)]]})
  assert (name, target) == ("sync_b", pytest.approx(0.3))


def test_b_star_is_where_doubling_stops_cutting_steps_by_15_percent():
  def curve(reach):  # loss 1.0 until step `reach`, then 0.5
    return [[(s, 1.0 if s < reach else 0.5) for s in range(100, 1100, 100)]]
  found = protocol.b_star({64: curve(800), 128: curve(400), 256: curve(300), 512: curve(300)})
  assert found["steps_to_target"] == {64: 800, 128: 400, 256: 300, 512: 300}
  assert found["doubling_ratio"] == {64: 0.5, 128: 0.75, 256: 1.0}
  assert found["b_star"] == 256 and found["scaling_stopped"]
  still = protocol.b_star({64: curve(800), 128: curve(400)})
  assert still["b_star"] == 64 and not still["scaling_stopped"]


def test_steps_ratio_counts_to_the_best_sync_arms_best_loss():
  sync = {"sync": [[(100, 0.6), (200, 0.4), (300, 0.5)]]}
  assert protocol.steps_ratio([[(100, 0.38), (200, 0.3)]], sync) == 0.5
  assert protocol.steps_ratio([[(100, 0.45), (200, 0.41)]], sync) is None


def test_bootstrap_interval_brackets_the_statistic_and_marks_unreached_ends():
  low, high = protocol.bootstrap(lambda xs: sum(xs) / len(xs), [1.0, 2.0, 3.0, 4.0])
  assert 1.0 <= low < 2.5 < high <= 4.0
  # A statistic that is None in some resamples (a target not reached) has an open upper end.
  interval = protocol.bootstrap(lambda xs: None if max(xs) > 3 else 1.0, [1.0, 2.0, 4.0])
  assert interval == [1.0, None]
  assert protocol.bootstrap(lambda xs: 0.0, []) is None


def test_churn_is_compared_at_the_loss_every_pair_reaches():
  # (loss, churn) per evaluation: the arm's pairs reach lower losses with less churn.
  arm = [[(0.6, 0.10), (0.4, 0.05), (0.3, 0.04)], [(0.6, 0.12), (0.45, 0.06)]]
  base = [[(0.6, 0.10), (0.42, 0.10)], [(0.5, 0.11), (0.4, 0.10)]]
  assert protocol.matched_loss(arm + base) == 0.45
  assert protocol.churn_at(arm[0], 0.45) == 0.05
  assert protocol.churn_reduction_at(arm, base) == pytest.approx(1 - 0.055 / 0.10)


def test_every_arms_churn_at_the_loss_all_their_pairs_reach():
  def pair(points):  # (step, loss, mean_abs_diff, disagreement)
    return [{"step": s, "loss": loss, "mean_abs_diff": c, "disagreement": d}
            for s, loss, c, d in points]
  found = protocol.churn_at_matched_loss({
      "sync_b": [pair([(100, 0.6, 0.10, 0.2), (200, 0.40, 0.08, 0.10)]),
                 pair([(100, 0.5, 0.12, 0.2), (200, 0.45, 0.06, 0.12)])],
      "codistill": [pair([(100, 0.5, 0.05, 0.05), (200, 0.3, 0.04, 0.04)]),
                    pair([(100, 0.5, 0.05, 0.05), (200, 0.44, 0.04, 0.04)])],
      "single": [pair([(100, 0.5, 0.03, 0.03)])],  # one pair: does not set the loss
      "ensemble": []})
  assert found["loss"] == 0.45  # the highest best loss among the 2-pair arms' pairs
  assert found["arms"]["single"]["mean_abs_diff"] is None  # never reaches 0.45
  assert set(found["arms"]) == {"sync_b", "codistill", "single"}
  sync = found["arms"]["sync_b"]
  assert sync["pairs"] == 2
  assert sync["mean_abs_diff"] == pytest.approx((0.08 + 0.06) / 2)
  assert sync["disagreement"] == pytest.approx((0.10 + 0.12) / 2)
  assert sync["mean_abs_diff_interval"] == [pytest.approx(0.06), pytest.approx(0.08)]
  assert found["arms"]["codistill"]["mean_abs_diff"] == pytest.approx(0.04)
  assert protocol.churn_at_matched_loss({"a": []}) == {}
