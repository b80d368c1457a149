"""Every committed suite file parses into a valid Suite whose goals name existing arms."""

import os

import gin
import pytest

from benchmarks import registry
from benchmarks import runner
from benchmarks import suite_spec as spec
from tf_codistill.launch import gin_config as config

SUITES = registry.suites()


def test_the_issue_suites_are_all_there():
  assert {"quick", "sync_scaling", "codistill_vs_sync", "baselines", "churn", "staleness",
          "data_split", "sync_vs_async", "adult", "lm", "image"} <= set(SUITES)


@pytest.mark.parametrize("name", SUITES)
def test_suite_parses_and_its_goals_evaluate_on_its_arms(name):
  gin.clear_config()
  try:
    suite = spec.load_suite([os.path.join(registry.SUITES_DIR, f"{name}.gin")])
    # Goals are gin-bound partials: evaluate each on made-up arm summaries (while the suite's
    # bindings are in force, as in a run), so a goal naming an arm the suite does not have fails
    # here rather than after hours of training.
    fake = {a: {"runs": [{"final_val_loss": 0.5, "steps_to_target": 100,
                          "examples_per_sec": 10.0, "wall_time_to_target_s": 1.0,
                          "bytes_sent_per_step": 10.0, "trainable_parameter_bytes": 4000,
                          "ensemble_gain": 0.01}],
                "final_val_loss": runner._stat([0.5]), "steps_to_target": runner._stat([100]),
                "examples_per_sec": runner._stat([10.0]),
                "wall_time_to_target_s": runner._stat([1.0]),
                # Each arm a little better than the one before it (an ensemble after its
                # source arm gains something to capture).
                "seed_curves": {"0": [[100, 0.6], [200, 0.5 - 0.01 * i]],
                                "1": [[100, 0.55], [200, 0.5 - 0.01 * i]]},
                "config": {"kind": arm.kind}, "repeated_tokens": 0,
                "group_curves": {"0_0": [[100, 0.6], [200, 0.5]], "0_1": [[100, 0.5], [200, 0.5]]},
                "group_staleness": {"0_0": [[200, 100]], "0_1": [[200, 50]]},
                "churn": {"mean_abs_diff": {"mean": 0.1}, "pairs": [{"mean_abs_diff": 0.1}],
                          "independent": [{"mean_abs_diff": 0.1}],
                          "curves": [[{"step": 100, "loss": 0.5, "mean_abs_diff": 0.1}]]}}
            for i, (a, arm) in enumerate((arm.name, arm) for arm in suite.arms)}
    values = {goal_name: goal(fake)[0] for goal_name, goal in suite.goals.items()}
  finally:
    gin.clear_config()
  assert suite.name == name
  assert all(value is not None for value in values.values()), values
  for arm in suite.arms:
    for path in arm.gin_files:
      assert os.path.exists(os.path.join(config.REPO_GIN_DIR, path)), (name, arm.name, path)
