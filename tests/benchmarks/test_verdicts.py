"""Goal verdicts, as every benchmark's summary records them: met, missed, or missing."""

from benchmarks import verdicts


def test_a_goal_is_met_when_its_value_and_its_whole_interval_pass():
  thresholds = {"ratio": ("<=", 0.7, 1.0), "gain": (">=", 0.5), "loss": ("<", 0.0, 0.0)}
  goals = {"ratio": 0.6, "ratio_interval": [0.5, 0.9], "gain": 0.5,
           "loss": -0.01, "loss_interval": [-0.02, 0.001]}
  judged = verdicts.judge(goals, thresholds)
  assert judged["ratio"] == {"threshold": ["<=", 0.7, 1.0], "met": True, "missing": False}
  assert judged["gain"] == {"threshold": [">=", 0.5], "met": True, "missing": False}
  # The value passes but the interval reaches past its bound: missed.
  assert judged["loss"] == {"threshold": ["<", 0.0, 0.0], "met": False, "missing": False}


def test_a_goal_without_its_value_or_needed_interval_is_missed_and_says_so():
  judged = verdicts.judge({"ratio": 0.6, "gain": None},
                          {"ratio": ("<=", 0.7, 1.0), "gain": (">=", 0.5)})
  assert judged["ratio"] == {"threshold": ["<=", 0.7, 1.0], "met": False, "missing": True}
  assert judged["gain"] == {"threshold": [">=", 0.5], "met": False, "missing": True}
