"""tf_versions: the figures it reads from each benchmark's summary, and its per-version table."""

import json
import os

from benchmarks import tf_versions


def _summaries(scale):
  """Summaries shaped like the three benchmarks' (only the keys tf_versions reads)."""
  ratio = lambda value: {"median": value, "interval90": [value - 0.01, value + 0.01]}  # noqa
  return {
      "teacher_overhead": {
          "goals": {"teacher_throughput_ratio": 0.96 * scale},
          "ratios": {"no_teacher_again_vs_no_teacher": ratio(1.0)},
          "step_times": {"codistill_no_teacher": {"median_ms": 43.0 * scale}},
          "machine": {"load_avg_1m_before": 0.5, "load_avg_1m_after": 1.25}},
      "fusion": {
          "best_fusion_speedup_by_model": {"ctr_adam": 2.5 * scale},
          "step_time": {"ctr_adam/graph/none": {"ms_per_step_median": 12.0},
                        "ctr_adam/graph/kernels": {"ms_per_step_median": 5.0}}},
      "cluster_step_times": {"groups": {"parameter_server": {
          "step_times": {"no_teacher": {"median_ms": 39.0}},
          "ratios": {"teacher_vs_no_teacher": ratio(0.98 * scale)}}}},
      "parse_throughput": {
          "goals": {"parquet_over_tsv_per_core": 0.6},
          "results": {"tsv": {"examples_per_cpu_second": 1000.0},
                      "parquet": {"examples_per_cpu_second": 600.0}}},
  }


def test_each_benchmarks_figures_are_read_per_version_and_tabled(tmp_path):
  for version, scale in (("2.17.1", 1.0), ("2.21.0", 0.5)):
    for name, summary in _summaries(scale).items():
      path = tf_versions.part_path(str(tmp_path), name, version)
      os.makedirs(os.path.dirname(path))
      with open(path, "w") as f:
        json.dump(summary, f)
  result = tf_versions.collect(str(tmp_path), list(tf_versions.BENCHMARKS),
                               ["2.21.0", "2.17.1", "9.9"])
  assert result["teacher_overhead"]["2.17.1"]["figures"] == {
      "teacher_throughput_ratio": 0.96, "noise_floor (no_teacher_again_vs_no_teacher)": 1.0,
      "no_teacher_step_ms": 43.0}
  assert result["fusion"]["2.21.0"]["figures"] == {
      "best_fusion_speedup ctr_adam": 1.25, "unfused_step_ms ctr_adam/graph/none": 12.0}
  assert result["cluster_step_times"]["2.21.0"]["figures"] == {
      "parameter_server no_teacher_step_ms": 39.0, "parameter_server teacher_vs_no_teacher": 0.49}
  assert result["parse_throughput"]["2.17.1"]["figures"] == {
      "parquet_over_tsv_per_core": 0.6, "tsv examples_per_cpu_second": 1000.0,
      "parquet examples_per_cpu_second": 600.0}
  assert all("9.9" not in by_version for by_version in result.values())

  summary = {"versions": ["2.21.0", "2.17.1"], "benchmarks": result, "command": "python -m x"}
  tf_versions.BENCHMARK.write_report(summary, str(tmp_path))
  text = (tmp_path / "report.md").read_text()
  assert "| figure | TF 2.21.0 | TF 2.17.1 |" in text
  assert "| teacher_throughput_ratio | 0.48 | 0.96 |" in text
  assert "| load before / after | 0.50 / 1.25 | 0.50 / 1.25 |" in text
