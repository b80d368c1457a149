"""Throughput of the input paths: Criteo (the generator's rows/sec, then make_dataset's
examples/sec) and, given a built Debian corpus, the token pipeline against the training step.

For each format (TSV and Parquet) the same rows are generated into a temporary directory (under
the benchmark's work directory) and read three times with ``data_pipelines.criteo.make_dataset``;
the median of the last two passes is the reported rate (the first includes graph building and
cold caches), per wall second and per CPU second of this process (all its threads: the rate per
core). Parquet is read with pyarrow (the
default reader, the goal's), and also with tensorflow-io where its ops load
(``parquet_tensorflow_io``). The goal: Parquet within 2x of TSV per core
(``parquet_over_tsv_per_core`` >= 0.5).

With ``corpus_dir`` (a corpus built by data_pipelines.debian_text), the token pipeline
(token_lm.make_dataset, windows of 64 at batch 64) is read for ``token_batches`` batches and
the language model of gin/lm/debian.gin (an LSTM, embedding 128, 256 units, softmax over the
corpus's vocabulary, Adam) trains ``token_batches`` steps on it; both as tokens per CPU second
of this process. The goal: the pipeline >= 5x what training consumes per core
(``token_pipeline_over_training_per_core``). Prints a table; the summary and report go to the
results directory.

  python -m benchmarks.run parse_throughput
  python -m benchmarks.run parse_throughput \
      --gin_bindings='bench.parse_throughput.num_rows = 200000' \
      --gin_bindings="bench.parse_throughput.corpus_dir = 'data/english'"
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

import gin
import tensorflow as tf
import tf_keras as keras

from benchmarks import registry
from benchmarks import verdicts
from data_pipelines import corpus
from data_pipelines import criteo
from data_pipelines import make_criteo_like
from data_pipelines import parquet
from data_pipelines import token_lm
from tf_codistill.models import lm

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


def measure(num_rows: int, num_files: int, batch_size: int, formats: Sequence[str],
            parquet_readers: Sequence[str] = ("pyarrow",), work_dir: Optional[str] = None
            ) -> Dict[str, Dict]:
  """Generates and parses num_rows rows per format (in a temporary directory, under
  ``work_dir`` if given); returns the numbers per format (Parquet per reader: ``parquet`` is
  pyarrow's, ``parquet_<reader>`` another's, on the same files)."""
  results = {}
  if work_dir:
    os.makedirs(work_dir, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=work_dir) as directory:
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


def _goals(results: Dict[str, Dict]) -> tuple:
  """(goal figures, their thresholds): Parquet over TSV where both were read, and the token
  pipeline over training where it was measured."""
  goals = {}
  if {"tsv", "parquet"} <= set(results):
    goals["parquet_over_tsv_per_core"] = (results["parquet"]["examples_per_cpu_second"]
                                          / results["tsv"]["examples_per_cpu_second"])
    goals["parquet_over_tsv"] = (results["parquet"]["examples_per_sec"]
                                 / results["tsv"]["examples_per_sec"])
  thresholds = {"parquet_over_tsv_per_core": (">=", GOAL)}  # Parquet within 2x of TSV per core
  if "token_lm" in results:
    goals["token_pipeline_over_training_per_core"] = (
        results["token_lm"]["pipeline_over_training_per_core"])
    thresholds["token_pipeline_over_training_per_core"] = (">=", TOKEN_GOAL)
  return goals, thresholds


@gin.configurable("parse_throughput", module="bench", denylist=["ctx"])
def measure_throughput(ctx: registry.Context, num_rows: int = 200_000, num_files: int = 2,
                       batch_size: int = 4096, formats: Sequence[str] = criteo.FILE_FORMATS,
                       corpus_dir: Optional[str] = None, token_batches: int = 60) -> dict:
  """Every format's generation and parse rates, the token pipeline's (with ``corpus_dir``) and
  the goals.

  Args:
    ctx: the run's context (the generated files go to a temporary directory under its work_dir).
    num_rows: rows generated per format.
    num_files: files the rows are split over.
    batch_size: make_dataset batch size.
    formats: file formats to measure (``tsv``, ``parquet``).
    corpus_dir: a built Debian corpus: also measure its token pipeline against the training
      step.
    token_batches: batches of the token pipeline read, and steps trained, per measurement.
  """
  registry.check_choices("bench.parse_throughput.formats", formats, criteo.FILE_FORMATS)
  readers = ["pyarrow"] + (["tensorflow_io"] if parquet.tensorflow_io_loads() else [])
  results = measure(num_rows, num_files, batch_size, formats, readers, work_dir=ctx.work_dir)
  if corpus_dir:
    results["token_lm"] = measure_tokens(corpus_dir, token_batches)
  goals, thresholds = _goals(results)
  summary = {
      "suite": "parse_throughput",
      "goals": goals,
      "goal_verdicts": verdicts.judge(goals, thresholds),
      "num_rows": num_rows,
      "num_files": num_files,
      "batch_size": batch_size,
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
  ctx.progress("\n".join(_tables(summary)))
  return summary


def _tables(summary: dict) -> List[str]:
  """Each format's rates, the goal ratios and the token pipeline's rates, as Markdown."""
  results, goals = summary["results"], summary["goals"]
  lines = [f"{summary['num_rows']:,} rows per format in {summary['num_files']} files, batch "
           f"{summary['batch_size']}; rates per wall second and per CPU second of the process "
           "(median of the passes after the first).", "",
           "| format | generator rows/s | parse ex/s | ex/CPU s | (1st pass ex/s) | MB |",
           "| --- | --- | --- | --- | --- | --- |"]
  lines += [f"| {name} | {r['generator_rows_per_sec']:,.0f} | {r['examples_per_sec']:,.0f} | "
            f"{r['examples_per_cpu_second']:,.0f} | {r['first_pass_examples_per_sec']:,.0f} | "
            f"{r['bytes'] / 1e6:.1f} |"
            for name, r in results.items() if "generator_rows_per_sec" in r]
  if "parquet_over_tsv_per_core" in goals:
    lines += ["", f"Parquet / TSV examples per CPU second: "
              f"{goals['parquet_over_tsv_per_core']:.2f} (goal >= {GOAL}); per wall second: "
              f"{goals['parquet_over_tsv']:.2f}."]
  tokens = results.get("token_lm")
  if tokens:
    lines += ["", f"Token pipeline {tokens['pipeline']['tokens_per_cpu_second']:,.0f} tokens/CPU "
              f"s, training {tokens['training']['tokens_per_cpu_second']:,.0f}: "
              f"{tokens['pipeline_over_training_per_core']:.1f}x (goal >= {TOKEN_GOAL:g}x)."]
  return lines


BENCHMARK = registry.Benchmark(
    "parse_throughput", measure_throughput, tables=_tables,
    title="Input throughput: Criteo TSV and Parquet parsing, and the token pipeline")
