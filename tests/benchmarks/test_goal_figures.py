"""Tests of benchmarks/goal_figures.py: the goal figures suites compute from arm summaries."""

import pytest

from benchmarks import goal_figures
from benchmarks import runner


def _arm_summary(final_losses, steps_to_target, churn=None):
  runs = [{"final_val_loss": loss, "steps_to_target": s}
          for loss, s in zip(final_losses, steps_to_target)]
  return {"runs": runs, "final_val_loss": runner._stat(final_losses),
          "steps_to_target": runner._stat(steps_to_target), "churn": churn}


def test_goal_figures_from_arm_summaries():
  arms = {"codistill": _arm_summary([0.45, 0.47], [300, 500],
                                    churn={"mean_abs_diff": {"mean": 0.01},
                                           "pairs": [{"mean_abs_diff": 0.01}]}),
          "sync_4x": _arm_summary([0.46], [800]),
          "sync_8x": _arm_summary([0.46], [None]),
          "baseline": _arm_summary([0.46, 0.46], [1000, 1000],
                                   churn={"mean_abs_diff": {"mean": 0.04},
                                          "pairs": [{"mean_abs_diff": 0.04}]})}
  value, per_run = goal_figures.steps_ratio(arms, numerator="codistill",
                                            denominators=["sync_4x", "sync_8x"])
  assert value == pytest.approx(400 / 800) and per_run == pytest.approx([300 / 800, 500 / 800])
  value, per_pair = goal_figures.churn_reduction(arms, arm="codistill", baseline="baseline")
  assert value == pytest.approx(0.75) and per_pair == pytest.approx([0.75])
  value, per_run = goal_figures.loss_minus_best(arms, arm="codistill",
                                                others=["sync_4x", "baseline"])
  assert value == pytest.approx(0.0) and per_run == pytest.approx([-0.01, 0.01])
  assert goal_figures.steps_ratio(arms, numerator="sync_8x",
                                  denominators=["sync_4x"]) == (None, [])


def test_metric_ratio_divides_arm_means_and_skips_missing_figures():
  arms = {"async": {"runs": [{"examples_per_sec": 300.0}, {"examples_per_sec": None}],
                    "examples_per_sec": runner._stat([300.0])},
          "sync": {"runs": [{"examples_per_sec": 100.0}, {"examples_per_sec": 200.0}],
                   "examples_per_sec": runner._stat([100.0, 200.0])},
          "never": {"runs": [{"examples_per_sec": None}], "examples_per_sec": None}}
  value, per_run = goal_figures.metric_ratio(arms, metric="examples_per_sec", numerator="async",
                                             denominator="sync")
  assert value == pytest.approx(2.0) and per_run == pytest.approx([2.0])
  assert goal_figures.metric_ratio(arms, metric="examples_per_sec", numerator="never",
                                   denominator="sync") == (None, [])


def test_allreduce_bytes_ratio_and_the_best_method_within_the_bytes_rule():
  def arm(sent, steps_to):
    curves = {str(s): [[100, 3.0], [200, 2.0 if steps_to == 200 else 2.5],
                       [400, 2.0]] for s in range(2)}
    return {"runs": [{"bytes_sent_per_step": sent, "trainable_parameter_bytes": 4000}] * 2,
            "seed_curves": curves}
  arms = {"sync": arm(None, 400), "cheap": arm(40, 200), "costly": arm(400, 200),
          "slow": arm(4, 400)}
  # A 2-worker ring all-reduce sends the parameter bytes a step: 4000 / 40 = 100x fewer.
  assert goal_figures.allreduce_bytes_ratio(arms, "cheap")[0] == pytest.approx(100)
  assert goal_figures.allreduce_bytes_ratio(arms, "sync") == (None, [])
  value, per = goal_figures.best_method_steps_ratio(arms, ["cheap", "costly", "slow"], ["sync"])
  assert value == pytest.approx(0.5) and per == pytest.approx([0.5, 1.0])  # costly: 10x only
  assert goal_figures.best_method_steps_ratio(arms, ["costly"], ["sync"]) == (None, [])


def test_ensemble_gain_is_the_members_loss_minus_the_ensembles_on_the_same_examples():
  arms = {"ensemble": {"runs": [{"ensemble_gain": 0.10}, {"ensemble_gain": 0.14}]},
          "older": {"runs": [{"ensemble_gain": None}]}}
  value, per, interval = goal_figures.ensemble_gain(arms, arm="ensemble")
  assert value == pytest.approx(0.12) and per == [0.10, 0.14]
  assert interval[0] == pytest.approx(0.10) and interval[1] == pytest.approx(0.14)
  assert goal_figures.ensemble_gain(arms, arm="older") == (None, [], None)


def test_teacher_minus_student_loss_reads_the_peer_curve_at_the_teachers_step():
  # Seed 0: group 0 distills from group 1's version 100 steps old, and the other way round.
  arms = {"codistill": {
      "group_curves": {"0_0": [[100, 0.9], [200, 0.5], [300, 0.4]],
                       "0_1": [[100, 0.8], [200, 0.6], [300, 0.45]]},
      "group_staleness": {"0_0": [[200, 100], [300, 50]], "0_1": [[300, 100]]}}}
  value, per = goal_figures.teacher_minus_student_loss(arms, arm="codistill")
  # Group 0: teacher at step 100 (0.8) vs 0.5; at step 250 (0.525) vs 0.4. Group 1: 0.5 vs 0.45.
  assert per == [pytest.approx(((0.8 - 0.5) + (0.525 - 0.4)) / 2), pytest.approx(0.05)]
  assert value == pytest.approx(sum(per) / 2)


def test_alpha0_check_compares_group_0_with_the_baseline_of_the_same_seed():
  arms = {"alpha0": {"group_curves": {"0_0": [[100, 0.5], [200, 0.4]],
                                      "0_1": [[100, 0.9], [200, 0.9]]}},
          "sync_b": {"group_curves": {"0_0": [[100, 0.5], [200, 0.41]],
                                      "1_0": [[100, 0.1], [200, 0.1]]}}}
  value, per = goal_figures.group_curve_difference(arms, arm="alpha0", baseline="sync_b")
  assert value == pytest.approx(0.01) and per == [pytest.approx(0.01)]


def _churn_curves(*pairs):
  """An arm summary whose independent pairs have these churn values at evaluations 1, 2, ..."""
  return {"churn": {"curves": [[{"step": 50 * (i + 1), "loss": 0.5 - 0.01 * i,
                                 "mean_abs_diff": c, "disagreement": c}
                                for i, c in enumerate(churns)] for churns in pairs]}}


def test_late_churn_averages_each_pairs_last_evaluations_and_swing_measures_their_moves():
  arms = {"codistill": _churn_curves([0.9, 0.02, 0.04], [0.9, 0.03, 0.03]),
          "baseline": _churn_curves([0.9, 0.06, 0.02], [0.9, 0.04, 0.04])}
  value, per_pair, interval = goal_figures.churn_reduction_late(arms, "codistill", "baseline",
                                                                evaluations=2)
  # Last two evaluations: codistill pairs 0.03 and 0.03, baseline 0.04 and 0.04.
  assert value == pytest.approx(1 - 0.03 / 0.04) and per_pair == pytest.approx([0.25, 0.25])
  assert interval == pytest.approx([0.25, 0.25])
  swing, per_pair, _ = goal_figures.churn_swing(arms, "baseline", evaluations=2)
  assert per_pair == pytest.approx([0.04 / 0.04, 0.0]) and swing == pytest.approx(0.5)
  assert goal_figures.churn_reduction_late({"codistill": {}, "baseline": {}}, "codistill",
                                           "baseline") == (None, [], None)


def _best_curves(*seeds):
  """An arm summary whose seeds' curves reach these best validation losses."""
  return {"seed_curves": {str(i): [[100, best + 0.5], [200, best]] for i, best in enumerate(seeds)}}


def test_ensemble_gain_captured_is_the_share_of_the_ensembles_gain():
  arms = {"single": _best_curves(2.0, 2.0), "ensemble": _best_curves(1.9, 1.9),
          "codistill": _best_curves(1.95, 1.97)}
  value, per, interval = goal_figures.ensemble_gain_captured(arms, arm="codistill", single="single",
                                                             ensemble="ensemble")
  assert value == pytest.approx(0.4) and per == [pytest.approx(0.4)]
  assert interval == [pytest.approx(0.3), pytest.approx(0.5)]
  arms["ensemble"] = _best_curves(2.01, 2.0)  # no gain: nothing to capture
  assert goal_figures.ensemble_gain_captured(arms, arm="codistill", single="single",
                                             ensemble="ensemble")[0] is None


def test_repeated_tokens_adds_every_trained_arm_and_is_missing_while_unrecorded():
  arms = {"sync_b": {"config": {"kind": "train"}, "repeated_tokens": 0},
          "codistill": {"config": {"kind": "train"}, "repeated_tokens": 64},
          "ensemble": {"config": {"kind": "ensemble"}, "repeated_tokens": None}}
  assert goal_figures.repeated_tokens(arms) == (64, [0, 64])
  arms["sync_b"]["repeated_tokens"] = None
  assert goal_figures.repeated_tokens(arms) == (None, [])
