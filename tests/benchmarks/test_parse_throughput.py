"""The input-throughput benchmark's code path at a toy size (the benchmark is not run in CI)."""

from benchmarks import parse_throughput


def test_both_formats_are_generated_and_read_back_whole_with_rates_per_core():
  results = parse_throughput.measure(num_rows=3000, num_files=2, batch_size=512,
                                     formats=["tsv", "parquet"])
  assert set(results) == {"tsv", "parquet"}
  for figures in results.values():
    assert figures["examples"] == 3000  # every row read, in every pass
    assert figures["examples_per_sec"] > 0 and figures["examples_per_cpu_second"] > 0
    assert figures["bytes"] > 0
