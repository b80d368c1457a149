"""Throughput of the input paths: Criteo (the generator's rows/sec, then make_dataset's
examples/sec) and, given a built Debian corpus, the token pipeline against the training step.

For each format (TSV and Parquet) the same rows are generated into a temporary directory and read
three times with ``data_pipelines.criteo.make_dataset``; the median of the last two passes is the
reported rate (the first includes graph building and cold caches), per wall second and per CPU
second of this process (all its threads: the rate per core). Parquet is read with pyarrow (the
default reader, the goal's), and also with tensorflow-io where its ops load
(``parquet_tensorflow_io``). The goal: Parquet within 2x of TSV per core
(``parquet_over_tsv_per_core`` >= 0.5).

With ``--corpus_dir`` (a corpus built by data_pipelines.debian_text), the token pipeline
(token_lm.make_dataset, windows of 64 at batch 64) is read for ``--token_batches`` batches and
the language model of gin/lm/debian.gin (an LSTM, embedding 128, 256 units, softmax over the
corpus's vocabulary, Adam) trains ``--token_batches`` steps on it; both as tokens per CPU second
of this process. The goal: the pipeline >= 5x what training consumes per core
(``token_pipeline_over_training_per_core``). Prints a table and writes JSON.

  .venv/bin/python -m benchmarks.parse_throughput [--num_rows=200000] [--corpus_dir=data/english]
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Sequence

import tensorflow as tf
import tf_keras as keras
from absl import flags

from benchmarks import machine
from benchmarks import standalone
from data_pipelines import corpus
from data_pipelines import criteo
from data_pipelines import make_criteo_like
from data_pipelines import parquet
from data_pipelines import token_lm
from tf_codistill.models import lm

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line (defined only when run as a script, so that the module can be imported
  beside the other benchmarks)."""
  flags.DEFINE_integer("num_rows", 200_000, "Rows generated per format.")
  flags.DEFINE_integer("num_files", 2, "Files the rows are split over.")
  flags.DEFINE_integer("batch_size", 4096, "make_dataset batch size.")
  flags.DEFINE_list("formats", list(criteo.FILE_FORMATS), "File formats to measure.")
  flags.DEFINE_string("corpus_dir", None, "A built Debian corpus: also measure its token "
                      "pipeline against the training step.")
  flags.DEFINE_integer("token_batches", 60, "Batches of the token pipeline read, and steps "
                       "trained, per measurement.")
  standalone.define_flags("parse_throughput", work_dir=False)
GOAL = 0.5
TOKEN_GOAL = 5.0


def _examples_per_sec(paths: List[str], file_format: str, batch_size: int,
                      passes: int = 3, parquet_reader: str = "pyarrow") -> Dict[str, float]:
  """Reads every file ``passes`` times; the first pass's examples/sec, and the median of the
  later passes' examples per wall second and per CPU second (this process's CPU time over all
  its threads: the rate per core)."""
  dataset = criteo.make_dataset(paths, batch_size, file_format=file_format,
                                parquet_reader=parquet_reader)
  rates, per_cpu = [], []
  for _ in range(passes):
    start, cpu = time.perf_counter(), time.process_time()
    examples = sum(int(label.shape[0]) for _, label in dataset)
    rates.append(examples / (time.perf_counter() - start))
    per_cpu.append(examples / (time.process_time() - cpu))
  return {"first_pass_examples_per_sec": rates[0],
          "examples_per_sec": statistics.median(rates[1:]),
          "examples_per_cpu_second": statistics.median(per_cpu[1:]), "examples": examples}


def measure(num_rows: int, num_files: int, batch_size: int, formats: List[str],
            parquet_readers: Sequence[str] = ("pyarrow",)) -> Dict[str, Dict]:
  """Generates and parses num_rows rows per format; returns the numbers per format (Parquet per
  reader: ``parquet`` is pyarrow's, ``parquet_<reader>`` another's, on the same files)."""
  results = {}
  with tempfile.TemporaryDirectory() as directory:
    make_criteo_like.planted_model()  # built once and cached; not part of the generation rate
    for file_format in formats:
      start = time.perf_counter()
      paths = make_criteo_like.generate(directory, num_rows, num_files, file_format=file_format)
      generate_seconds = time.perf_counter() - start
      readers = parquet_readers if file_format == "parquet" else ("pyarrow",)
      for reader in readers:
        name = file_format if reader == "pyarrow" else f"{file_format}_{reader}"
        results[name] = {
            "generator_rows_per_sec": num_rows / generate_seconds,
            "bytes": sum(os.path.getsize(p) for p in paths),
            **_examples_per_sec(paths, file_format, batch_size, parquet_reader=reader),
        }
  return results


def _tokens_per_cpu_second(run: Callable[[], int]) -> Dict[str, float]:
  start, cpu = time.perf_counter(), time.process_time()
  tokens = run()
  return {"tokens_per_sec": tokens / (time.perf_counter() - start),
          "tokens_per_cpu_second": tokens / (time.process_time() - cpu), "tokens": tokens}


def measure_tokens(corpus_dir: str, batches: int, batch_size: int = 64,
                   sequence_length: int = 64) -> Dict[str, Dict[str, float]]:
  """Tokens per CPU second the corpus's pipeline delivers and the LSTM LM's training consumes
  (after one warm-up pass of each: graph building and caches are not counted)."""
  vocab_size = corpus.read_manifest(corpus_dir)["tokenizer"]["vocab_size"]
  files = os.path.join(corpus_dir, "tokens", "train-*")
  data = token_lm.make_dataset(files, batch_size, sequence_length=sequence_length,
                               vocab_size=vocab_size, repeat=True, shuffle_buffer=20_000, seed=0)
  batch_tokens = batch_size * sequence_length
  read = lambda: sum(int(tf.size(y)) for _, y in data.take(batches))
  read()
  pipeline = _tokens_per_cpu_second(read)
  model = lm.lstm_lm(vocab_size, embedding_dim=128, lstm_units=(256,), seed=0)
  model.compile(keras.optimizers.Adam(2e-3),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  cached = data.take(batches).cache()
  list(cached)  # in memory: the training rate below excludes the pipeline

  def train() -> int:
    model.fit(cached, epochs=1, verbose=0)
    return batches * batch_tokens

  train()
  training = _tokens_per_cpu_second(train)
  return {"pipeline": pipeline, "training": training,
          "pipeline_over_training_per_core": (pipeline["tokens_per_cpu_second"]
                                              / training["tokens_per_cpu_second"])}


def main(argv: List[str]) -> None:
  del argv
  readers = ["pyarrow"] + (["tensorflow_io"] if parquet.tensorflow_io_loads() else [])
  results = measure(FLAGS.num_rows, FLAGS.num_files, FLAGS.batch_size, FLAGS.formats, readers)
  print(f"{'format':22} {'generator rows/s':>17} {'parse ex/s':>11} {'ex/CPU s':>11} "
        f"{'(1st pass)':>11} {'MB':>7}")
  for file_format, r in results.items():
    print(f"{file_format:22} {r['generator_rows_per_sec']:17,.0f} {r['examples_per_sec']:11,.0f} "
          f"{r['examples_per_cpu_second']:11,.0f} {r['first_pass_examples_per_sec']:11,.0f} "
          f"{r['bytes'] / 1e6:7.1f}")
  goals = {}
  if {"tsv", "parquet"} <= set(results):
    goals["parquet_over_tsv_per_core"] = (results["parquet"]["examples_per_cpu_second"]
                                          / results["tsv"]["examples_per_cpu_second"])
    goals["parquet_over_tsv"] = (results["parquet"]["examples_per_sec"]
                                 / results["tsv"]["examples_per_sec"])
    print(f"Parquet / TSV examples per CPU second: {goals['parquet_over_tsv_per_core']:.2f} "
          f"(goal >= {GOAL}); per wall second: {goals['parquet_over_tsv']:.2f}")
  thresholds = {"parquet_over_tsv_per_core": GOAL}  # Parquet within 2x of TSV per core
  if FLAGS.corpus_dir:
    tokens = measure_tokens(FLAGS.corpus_dir, FLAGS.token_batches)
    results["token_lm"] = tokens
    goals["token_pipeline_over_training_per_core"] = tokens["pipeline_over_training_per_core"]
    thresholds["token_pipeline_over_training_per_core"] = TOKEN_GOAL
    print(f"token pipeline {tokens['pipeline']['tokens_per_cpu_second']:,.0f} tokens/CPU s, "
          f"training {tokens['training']['tokens_per_cpu_second']:,.0f}: "
          f"{tokens['pipeline_over_training_per_core']:.1f}x (goal >= {TOKEN_GOAL:g}x)")
  summary = {
      "suite": "parse_throughput",
      "command": (f"python -m benchmarks.parse_throughput --num_rows={FLAGS.num_rows}"
                  + (f" --corpus_dir={FLAGS.corpus_dir}" if FLAGS.corpus_dir else "")),
      "goals": goals,
      "goal_verdicts": {name: {"threshold": [">=", thresholds[name]],
                               "met": value >= thresholds[name]}
                        for name, value in goals.items() if name in thresholds},
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
  machine.write_json(FLAGS.out, summary)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  define_flags()
  machine.run_script(main, "benchmarks.parse_throughput",
                     on_recorded=standalone.update_results_index)
