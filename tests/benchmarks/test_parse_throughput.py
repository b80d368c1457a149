"""The input-throughput benchmark's code path at a toy size (the benchmark is not run in CI)."""

import os

import pytest

from benchmarks import parse_throughput
from benchmarks import registry
from data_pipelines import parquet


def test_both_formats_are_generated_and_read_back_whole_with_rates_per_core():
  results = parse_throughput.measure(num_rows=3000, num_files=2, batch_size=512,
                                     formats=["tsv", "parquet"])
  assert set(results) == {"tsv", "parquet"}
  for figures in results.values():
    assert figures["examples"] == 3000  # every row read, in every pass
    assert figures["examples_per_sec"] > 0 and figures["examples_per_cpu_second"] > 0
    assert figures["bytes"] > 0


def test_parquet_is_read_by_each_reader_asked_for_on_the_same_files(tmp_path):
  readers = ["pyarrow"] + (["tensorflow_io"] if parquet.tensorflow_io_loads() else [])
  results = parse_throughput.measure(num_rows=2000, num_files=1, batch_size=512,
                                     formats=["parquet"], parquet_readers=readers,
                                     work_dir=str(tmp_path / "work"))
  assert set(results) == {"parquet"} | {f"parquet_{r}" for r in readers[1:]}
  assert all(r["examples"] == 2000 for r in results.values())
  assert len({r["bytes"] for r in results.values()}) == 1  # the same files
  assert os.listdir(tmp_path / "work") == []  # generated under work_dir, and removed


def test_the_summary_has_the_goals_and_the_report_its_tables(tmp_path):
  ctx = registry.Context(name="parse_throughput", results_dir=str(tmp_path / "results"),
                         work_dir=str(tmp_path / "work"), command="python -m benchmarks.run "
                         "parse_throughput", progress=lambda line: None)
  summary = parse_throughput.measure_throughput(ctx, num_rows=2000, num_files=1, batch_size=512)
  assert set(summary["results"]) >= {"tsv", "parquet"}
  goal = summary["goals"]["parquet_over_tsv_per_core"]
  assert summary["goal_verdicts"]["parquet_over_tsv_per_core"] == {
      "threshold": [">=", parse_throughput.GOAL], "met": goal >= parse_throughput.GOAL,
      "missing": False}
  parse_throughput.BENCHMARK.write_report({**summary, "command": ctx.command},
                                          ctx.results_dir)
  report = (tmp_path / "results" / "report.md").read_text()
  assert "`parquet_over_tsv_per_core`" in report and "| tsv |" in report
  with pytest.raises(ValueError, match="bench.parse_throughput.formats="):
    parse_throughput.measure_throughput(ctx, formats=["csv"])


def test_the_token_pipeline_is_measured_against_the_training_step(tmp_path):
  from data_pipelines import corpus  # pylint: disable=g-import-not-at-top
  from data_pipelines import debian_text  # pylint: disable=g-import-not-at-top

  import debian_fixtures  # pylint: disable=g-import-not-at-top
  debian_fixtures.make_deb(str(tmp_path), "fortunes", debian_fixtures.fortunes_package(20_000))
  sources = [s for s in debian_text.CORPORA["english"] if s.package == "fortunes"]
  corpus.build(str(tmp_path / "toy"), sources, vocab_size=400, debs_dir=str(tmp_path),
               train_shards=2, eval_shards=1)
  results = parse_throughput.measure_tokens(str(tmp_path / "toy"), batches=3, batch_size=4,
                                            sequence_length=16)
  for part in ("pipeline", "training"):
    assert results[part]["tokens"] == 3 * 4 * 16 and results[part]["tokens_per_cpu_second"] > 0
  assert results["pipeline_over_training_per_core"] == pytest.approx(
      results["pipeline"]["tokens_per_cpu_second"] / results["training"]["tokens_per_cpu_second"])
