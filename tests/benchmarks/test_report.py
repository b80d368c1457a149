"""The results index: every suite's goal figures, read from its summary.json."""

import json

from benchmarks import report


def test_index_lists_each_suites_goals_with_verdicts_and_links(tmp_path):
  (tmp_path / "churn").mkdir()
  (tmp_path / "churn" / "report.md").write_text("# churn\n")
  (tmp_path / "churn" / "summary.json").write_text(json.dumps({
      "goals": {"churn_reduction": 0.41, "ensemble_churn_reduction": None},
      "goal_verdicts": {"churn_reduction": {"threshold": [">=", 0.3], "met": True}},
      "goal_spreads": {"churn_reduction": {"mean": 0.41, "std": 0.02, "min": 0.39, "max": 0.43,
                                           "n": 3}}}))
  (tmp_path / "cluster").mkdir()
  (tmp_path / "cluster" / "summary.json").write_text("{}")
  (tmp_path / "notes.txt").write_text("not a suite")
  path = report.write_index(str(tmp_path))
  text = open(path).read()
  assert ("| [`churn`](churn/report.md) | `churn_reduction` | 0.4100 | "
          "0.4100 ± 0.0200 [0.3900, 0.4300] | >= 0.3 | yes |") in text
  assert "| [`churn`](churn/report.md) | `ensemble_churn_reduction` | not reached |" in text
  assert "| `cluster` | (no goal figures) |" in text
  assert "notes" not in text


def test_a_run_written_outside_the_committed_results_leaves_their_index_alone(tmp_path):
  (tmp_path / "fusion").mkdir()
  (tmp_path / "fusion" / "summary.json").write_text(json.dumps({"goals": {"x": 1.0}}))
  assert report.update_index_for(str(tmp_path / "fusion" / "summary.json")) is None
  assert not (tmp_path / "README.md").exists()
