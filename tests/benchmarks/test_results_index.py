"""The results index: each suite's goals with verdicts and links, and "Does codistillation help?"
per real data set (in progress, missing, run)."""

import json

from benchmarks import results_index


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
  path = results_index.write_index(str(tmp_path))
  text = open(path).read()
  assert ("| [`churn`](churn/report.md) | `churn_reduction` | 0.4100 |  | "
          "0.4100 ± 0.0200 [0.3900, 0.4300] | >= 0.3 | yes |") in text
  assert "| [`churn`](churn/report.md) | `ensemble_churn_reduction` | not reached |" in text
  assert "| `cluster` | (no goal figures) |" in text
  assert "notes" not in text


def _protocol_summary(data, minus_sync, interval, ratio, churn):
  goals = {"codistill_minus_best_sync_loss": minus_sync,
           "codistill_minus_best_sync_loss_interval": interval,
           "codistill_steps_ratio": ratio, "codistill_steps_ratio_interval": [None, None],
           "churn_reduction": churn, "churn_reduction_interval": [0.1, 0.5]}
  thresholds = {"codistill_steps_ratio": ("<=", 0.7, 1.0),
                "codistill_minus_best_sync_loss": ("<", 0.0, 0.0),
                "churn_reduction": (">=", 0.3, 0.0)}
  from benchmarks import verdicts
  return {"data": data, "target_rule": "best_sync", "goals": goals,
          "goal_verdicts": verdicts.judge(goals, thresholds),
          "protocol": {"scaling": {"b_star": 256}}}


def test_index_opens_with_what_codistillation_reached_per_real_data_set(tmp_path):
  for name, summary in {
      "fashion_mlp": _protocol_summary("fashion_mnist", -0.01, [-0.02, -0.005], None, 0.35),
      "adult_protocol": _protocol_summary("adult", -0.01, [-0.02, 0.001], None, 0.31),
      "old_image": {"data": "fashion_mnist", "goals": {"codistill_minus_baseline_loss": 0.07}},
  }.items():
    (tmp_path / name).mkdir()
    (tmp_path / name / "summary.json").write_text(json.dumps(summary))
  text = results_index.index_markdown(str(tmp_path))
  section = text[text.index("## Does codistillation help?"):text.index("## Every suite")]
  assert "| Fashion-MNIST | [`fashion_mlp`](fashion_mlp/report.md) | 256 | -0.0100 " \
         "[-0.0200, -0.0050] met | not reached [not reached, not reached] **missed** |" in section
  # Adult's interval crosses 0: not met. Only one data set meets it, two are needed.
  assert "-0.0100 [-0.0200, 0.0010] **not met**" in section
  assert "`codistill_minus_best_sync_loss` met on 1 real data set(s): Fashion-MNIST " \
         "(needed: 2): **missed**" in section
  assert "`churn_reduction` met on 2 real data set(s): Adult census, Fashion-MNIST " \
         "(needed: 2): **met**" in section
  assert "`codistill_steps_ratio` met on 0 real data set(s) (needed: 1): **missed**" in section
  assert ("not yet run under the protocol: English text from Debian (16M words), King James "
          "Bible, Linux kernel C source") in section
  # A suite whose runs are recorded but whose arms are not all run yet is in progress.
  (tmp_path / "english_lm").mkdir()
  (tmp_path / "english_lm" / "report.md").write_text("# english_lm (in progress)\n")
  text = results_index.index_markdown(str(tmp_path))
  assert ("in progress under the protocol (runs recorded, figures once every arm has run): "
          "English text from Debian (16M words) ([`english_lm`](english_lm/report.md))") in text
  assert "not yet run under the protocol: King James Bible, Linux kernel C source" in text
  assert "old_image" not in section  # suites from before the protocol are not counted
  # Same-data codistillation has its own column; n/a where a suite did not run it.
  # ... and so has the share of the ensemble's gain codistillation captured.
  assert " | n/a | n/a | [loss vs steps](adult_protocol/" in section


def test_index_shows_same_data_codistillation_and_a_b_star_taken_from_elsewhere(tmp_path):
  summary = _protocol_summary("fashion_mnist", 0.01, [0.005, 0.02], None, 0.1)
  summary["goals"].update({"codistill_same_minus_best_sync_loss": -0.0074,
                           "codistill_same_minus_best_sync_loss_interval": [-0.0098, -0.0049]})
  del summary["protocol"]
  (tmp_path / "fashion_mlp_long").mkdir()
  (tmp_path / "fashion_mlp_long" / "summary.json").write_text(json.dumps(summary))
  section = results_index.index_markdown(str(tmp_path)).split("## Every suite")[0]
  assert "| [`fashion_mlp_long`](fashion_mlp_long/report.md) | (set) | 0.0100 " in section
  assert ("| -0.0074 [-0.0098, -0.0049] | n/a | n/a | n/a | n/a | [loss vs steps]"
          "(fashion_mlp_long/") in section
  summary["goals"].update({"ensemble_gain_captured": 0.25,
                           "ensemble_gain_captured_interval": [0.1, 0.4]})
  (tmp_path / "fashion_mlp_long" / "summary.json").write_text(json.dumps(summary))
  section = results_index.index_markdown(str(tmp_path)).split("## Every suite")[0]
  assert "| -0.0074 [-0.0098, -0.0049] | 0.2500 [0.1000, 0.4000] | n/a | n/a | n/a |" in section
  summary["goals"].update({"diloco_h500_minus_best_sync_loss": -0.002,
                           "best_cross_group_steps_ratio": None})
  summary["goal_verdicts"] = {"best_cross_group_steps_ratio": {
      "threshold": ["<=", 0.7], "met": False, "missing": True}}
  (tmp_path / "fashion_mlp_long" / "summary.json").write_text(json.dumps(summary))
  section = results_index.index_markdown(str(tmp_path)).split("## Every suite")[0]
  assert "| 0.2500 [0.1000, 0.4000] | -0.0020 | n/a | not reached  **missed** | [loss" in section


def test_index_shows_each_suites_cpu_and_tensorflow(tmp_path):
  (tmp_path / "step").mkdir()
  (tmp_path / "step" / "summary.json").write_text(json.dumps({
      "goals": {"ratio": 0.96},
      "machine": {"cpu_model": "CPU Z", "cores": 2, "tensorflow": "2.21.0"}}))
  text = results_index.index_markdown(str(tmp_path))
  assert "| met | CPU | TensorFlow |" in text
  assert "| `step` | `ratio` | 0.9600 |  |" in text
  assert text.rstrip().endswith("| CPU Z | 2.21.0 |")
  runs = {"arms": {"a": {"runs": [{"load_avg_1m_before": 0.5, "cpu_model": "CPU X",
                                   "tensorflow": "2.17.1"}]},
                   "b": {"runs": [{"cpu_model": "CPU X", "tensorflow": "2.21.0"}]}}}
  assert results_index._cpu_cell(runs) == "CPU X"
  assert results_index._tensorflow_cell(runs) == "2.17.1 / 2.21.0"
  assert results_index._cpu_cell({"goals": {}}) == "not recorded"
  assert results_index._tensorflow_cell({"goals": {}}) == "not recorded"


def test_index_reads_each_folders_summary_and_leaves_history_and_partial_files_out(tmp_path):
  (tmp_path / "teacher_overhead" / "history").mkdir(parents=True)
  for path, ratio in (("summary.json", 0.913), ("history/adagrad.json", 0.818)):
    (tmp_path / "teacher_overhead" / path).write_text(json.dumps({
        "goals": {"teacher_throughput_ratio": ratio},
        "goal_verdicts": {"teacher_throughput_ratio": {
            "threshold": [">=", 0.95], "interval90": [ratio - 0.01, ratio + 0.01], "met": False}},
        "machine": {"cpu_model": "CPU Z"}}))
  (tmp_path / "teacher_overhead" / "summary.json.tmp").write_text("{")
  text = results_index.index_markdown(str(tmp_path))
  assert ("| `teacher_overhead` | `teacher_throughput_ratio` | 0.9130 | [0.9030, 0.9230] |"
          in text)
  assert "0.8180" not in text and "tmp" not in text
