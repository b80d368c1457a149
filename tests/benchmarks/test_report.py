"""A suite's report and a registered benchmark's page: goals, churn at matched loss, CPUs, plots."""

import os

from benchmarks import report


def test_report_shows_churn_at_matched_loss_and_plots_churn_vs_loss(tmp_path):
  pair = [{"step": 100, "loss": 0.5, "mean_abs_diff": 0.1, "disagreement": 0.2},
          {"step": 200, "loss": 0.4, "mean_abs_diff": 0.05, "disagreement": 0.1}]
  summary = {"suite": "s", "output": "softmax",
             "arms": {"sync_b": {"churn": {"curves": [pair]}}, "ensemble": {"churn": {}}},
             "churn_at_matched_loss": {"loss": 0.4, "arms": {"sync_b": {
                 "pairs": 1, "mean_abs_diff": 0.05, "mean_abs_diff_interval": [0.05, 0.05],
                 "disagreement": 0.1, "disagreement_interval": [0.1, 0.1]}}}}
  lines = report._matched_churn_lines(summary, True, "cross-entropy")
  assert "### Churn at matched validation cross-entropy (0.4000)" in lines[0]
  assert "| `sync_b` | 1 | 0.05000 [0.0500, 0.0500] | 0.10000 [0.1000, 0.1000] |" in lines
  [path] = report.plot_churn_vs_loss(summary, str(tmp_path))
  assert (path.endswith("churn_vs_loss.png")
          and (tmp_path / "churn_vs_loss.png").stat().st_size > 1000)


def test_goal_rows_show_a_standalone_scripts_verdict_interval():
  summary = {"goals": {"ratio": 0.96, "plain": 2.0},
             "goal_verdicts": {"ratio": {"threshold": [">=", 0.95], "interval90": [0.948, 0.97],
                                         "met": True}}}
  rows = {row[0]: row for row in report.goal_rows(summary)}
  assert rows["ratio"][2] == "[0.9480, 0.9700]" and rows["ratio"][5] == "yes"
  assert rows["plain"][2] == ""


def test_report_names_the_cpu_and_flags_runs_resumed_on_another_cpu_model():
  run = lambda model: {"load_avg_1m_before": 0.5, "cpu_model": model}
  same = {"arms": {"a": {"runs": [run("CPU X")]}, "b": {"runs": [run("CPU X")]}}}
  arms = lambda *runs: {"arms": {"a": {"runs": list(runs)}}}
  assert report._cpu_lines(same) == ["- CPU: CPU X"]
  line, = report._cpu_lines(arms(run("CPU X"), run("CPU X"), run("CPU Y")))
  assert "2 CPU models: CPU X (2 runs), CPU Y (1 runs)" in line
  assert "comparable only between runs on the same one" in line
  assert report._cpu_lines({"arms": {}, "machine": {"cpu_model": "CPU Z"}}) == ["- CPU: CPU Z"]
  assert report._cpu_lines(arms({"load_avg_1m_before": 0.5})) == []
  # One run whose parts ran on two CPU models is flagged though every run's last part agrees.
  moved = dict(run("CPU X"), parts=[{"cpu_model": "CPU Y"}, {"cpu_model": "CPU X"}])
  line, = report._cpu_lines(arms(run("CPU X"), moved))
  assert "2 CPU models: CPU X (1 runs), CPU X + CPU Y (1 runs)" in line


def test_the_report_names_the_runs_resumed_after_a_stop_and_from_which_steps():
  whole = {"seed": 0, "group": 0, "load_avg_1m_before": 0.5}
  parts = [{"from_step": {}}, {"from_step": {"0": 1500, "1": 1350}}, {"from_step": {"0": 3000}}]
  resumed = {"seed": 11, "group": 1, "load_avg_1m_before": 1.2, "parts": parts}
  lines = report._load_lines({"arms": {"a": {"runs": [whole]}, "b": {"runs": [resumed]}}})
  line, = [x for x in lines if "resumed" in x]
  assert line.endswith("`b` seed 11 group 1 (from step 1350, 0)")
  assert not [x for x in report._load_lines({"arms": {"a": {"runs": [whole]}}}) if "resumed" in x]


def test_a_registered_benchmarks_report_has_its_command_machine_goals_body_and_settings(tmp_path):
  summary = {"command": "python -m benchmarks.run x", "config": {"steps": 10},
             "goals": {"ratio": 0.9}, "goal_verdicts": {"ratio": {"threshold": [">=", 0.95],
                                                                    "met": False}},
             "machine": {"cpu_model": "CPU Z", "cores": 2, "tensorflow": "2.21.0",
                         "load_avg_1m_before": 0.5, "load_avg_1m_after": 1.5,
                         "foreign_cpu_share": 0.01, "above_nproc_load": True}}
  path = report.write_benchmark_report(summary, str(tmp_path / "x"), "X", ["| a | b |"])
  text = open(path).read()
  assert text.startswith("# X\n\n`python -m benchmarks.run x`")
  assert "CPU Z, 2 cores; TensorFlow 2.21.0" in text and "0.50 / 1.50" in text
  assert "**taken on a loaded machine**" in text
  assert "| `ratio` | 0.9000 |  | n/a | >= 0.95 | **no** |" in text
  assert "| a | b |" in text and "| steps | `10` |" in text
  # A benchmark that runs others (each holding the machine) says where their loads are.
  runs_others = {"command": "python -m benchmarks.run y"}
  text = open(report.write_benchmark_report(runs_others, str(tmp_path / "y"), "Y",
                                            holds_machine=False)).read()
  assert "- machine: each benchmark it ran held the machine alone" in text
  assert "machine load not recorded" not in text


def test_a_summary_written_from_the_records_so_far_says_it_is_in_progress(tmp_path):
  summary = {"command": "python -m benchmarks.run x", "complete": False,
             "missing": ["m_none", "m_1gbit"]}
  text = open(report.write_benchmark_report(summary, str(tmp_path / "x"), "X", ["| a |"])).read()
  assert "- **in progress**: 2 run(s) not recorded yet (m_none, m_1gbit);" in text
  assert "machine load not recorded" not in text and "| a |" in text
  many = {**summary, "missing": [f"t_{k}" for k in range(20)]}
  text = open(report.write_benchmark_report(many, str(tmp_path / "y"), "Y")).read()
  assert "20 run(s) not recorded yet (summary.json's `missing` lists them)" in text
  assert report.in_progress_lines({"complete": True}) == report.in_progress_lines({}) == []


def test_loss_against_bytes_plots_measured_arms_and_counted_all_reduce(tmp_path):
  def arm(loss, sent, params=4000):
    return {"best_val_loss": {"mean": loss}, "bytes_sent_per_step": sent and {"mean": sent},
            "runs": [{"trainable_parameter_bytes": params}]}
  summary = {"suite": "s", "sync_arms": ["sync_2b"],
             "arms": {"sync_2b": arm(2.0, None), "diloco": arm(2.1, 40.0),
                      "sync_b": arm(2.2, None)}}
  [path] = report.plot_loss_vs_bytes(summary, str(tmp_path))
  assert path.endswith("loss_vs_bytes.png") and os.path.getsize(path) > 0
  summary["arms"].pop("diloco")  # nothing measured: no plot
  assert report.plot_loss_vs_bytes(summary, str(tmp_path / "none")) == []
