"""Throughput of the Criteo input path: the generator's rows/sec, then make_dataset's examples/sec.

For each format (TSV and Parquet) the same rows are generated into a temporary directory and read
twice with ``data_pipelines.criteo.make_dataset``; the second pass is the reported rate (the first
includes graph building and cold caches). Prints a table and writes JSON.

  .venv/bin/python -m benchmarks.parse_throughput [--num_rows=200000]
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from typing import Dict, List

import tensorflow as tf
from absl import flags

from benchmarks import machine
from benchmarks import standalone
from data_pipelines import criteo
from data_pipelines import make_criteo_like

flags.DEFINE_integer("num_rows", 200_000, "Rows generated per format.")
flags.DEFINE_integer("num_files", 2, "Files the rows are split over.")
flags.DEFINE_integer("batch_size", 4096, "make_dataset batch size.")
flags.DEFINE_list("formats", list(criteo.FILE_FORMATS), "File formats to measure.")
standalone.define_flags("parse_throughput", work_dir=False)
FLAGS = flags.FLAGS


def _examples_per_sec(paths: List[str], file_format: str, batch_size: int) -> Dict[str, float]:
  """Reads every file twice; returns both passes' examples/sec and the example count."""
  dataset = criteo.make_dataset(paths, batch_size, file_format=file_format)
  rates = []
  for _ in range(2):
    start = time.perf_counter()
    examples = sum(int(label.shape[0]) for _, label in dataset)
    rates.append(examples / (time.perf_counter() - start))
  return {"first_pass_examples_per_sec": rates[0], "examples_per_sec": rates[1], "examples": examples}


def measure(num_rows: int, num_files: int, batch_size: int, formats: List[str]) -> Dict[str, Dict]:
  """Generates and parses num_rows rows per format; returns the numbers per format."""
  results = {}
  with tempfile.TemporaryDirectory() as directory:
    make_criteo_like.planted_model()  # built once and cached; not part of the generation rate
    for file_format in formats:
      start = time.perf_counter()
      paths = make_criteo_like.generate(directory, num_rows, num_files, file_format=file_format)
      generate_seconds = time.perf_counter() - start
      results[file_format] = {
          "generator_rows_per_sec": num_rows / generate_seconds,
          "bytes": sum(os.path.getsize(p) for p in paths),
          **_examples_per_sec(paths, file_format, batch_size),
      }
  return results


def main(argv: List[str]) -> None:
  del argv
  results = measure(FLAGS.num_rows, FLAGS.num_files, FLAGS.batch_size, FLAGS.formats)
  print(f"{'format':8} {'generator rows/s':>17} {'parse ex/s':>11} {'(1st pass)':>11} {'MB':>7}")
  for file_format, r in results.items():
    print(f"{file_format:8} {r['generator_rows_per_sec']:17,.0f} {r['examples_per_sec']:11,.0f} "
          f"{r['first_pass_examples_per_sec']:11,.0f} {r['bytes'] / 1e6:7.1f}")
  summary = {
      "num_rows": FLAGS.num_rows,
      "num_files": FLAGS.num_files,
      "batch_size": FLAGS.batch_size,
      "results": results,
      "environment": {
          "tensorflow": tf.__version__,
          "tensorflow_io": getattr(sys.modules.get("tensorflow_io"), "__version__", None),
          "python": platform.python_version(),
          "cpu_count": os.cpu_count(),
          # The machine may be shared; a high load average means the rates are pessimistic.
          "load_average_1min_at_end": os.getloadavg()[0],
      },
  }
  standalone.write_json(FLAGS.out, summary)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  machine.run_script(main, "benchmarks.parse_throughput")
