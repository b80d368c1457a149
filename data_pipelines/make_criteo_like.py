"""Writes Criteo-format data (TSV or Parquet) drawn from a planted ground-truth model.

The data have learnable signal at any size: labels are Bernoulli(sigmoid(logit)) of a fixed model
with per-id weights on heavy-tailed (Zipf) categorical ids, weights on log1p of heavy-tailed counts,
and a few pairwise categorical interactions (so an MLP can beat a linear model).

The ground truth depends only on ``model_seed`` (and the shape parameters vocab_size, zipf_a,
missing_rate, base_rate); the rows depend on ``seed``. Train and validation sets written with
different ``seed`` and the same ``model_seed`` therefore share one ground truth.

    python -m data_pipelines.make_criteo_like --output_dir=/tmp/criteo --num_rows=1000000
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import time
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import tensorflow as tf
from absl import app
from absl import flags
from absl import logging

from data_pipelines import records
from data_pipelines.criteo import CAT_COLUMNS
from data_pipelines.criteo import INT_COLUMNS
from data_pipelines.criteo import LABEL_COLUMN
from data_pipelines.criteo import NUM_CAT
from data_pipelines.criteo import NUM_INT

FILE_FORMATS = ("tsv", "parquet")

_CHUNK_ROWS = 1 << 16  # keeps numpy temporaries small enough to be reused instead of page-faulted
_CALIBRATION_ROWS = 2 * _CHUNK_ROWS
_NUM_STRONG_CAT = 4
_STRONG_CAT_STD = 0.6
_WEAK_CAT_STD = 0.15
_INT_WEIGHT_STD = 0.2
_NUM_INTERACTIONS = 3
_INTERACTION_MOD = 50
_INTERACTION_STD = 0.5
_NEGATIVE_INT_FEATURE = 1  # I2 takes small negative values in real Criteo data
_NEGATIVE_RATE = 0.03


@dataclasses.dataclass(frozen=True)
class Sample:
  """Rows drawn from a planted model; a missing categorical id equals vocab_size."""

  ints: np.ndarray         # int64 [n, 13], 0 where missing
  int_missing: np.ndarray  # bool [n, 13]
  cat_ids: np.ndarray      # int64 [n, 26]
  logits: np.ndarray       # float64 [n]
  labels: np.ndarray       # int64 [n]


@dataclasses.dataclass(frozen=True, eq=False)
class PlantedModel:
  """Ground truth: Zipf id distribution, per-id and per-count weights, interaction tables, bias."""

  vocab_size: int
  missing_rate: float
  alias_accept: np.ndarray   # [V], alias table for drawing Zipf ids (id 0 most frequent) in O(1)
  alias_other: np.ndarray    # [V]
  cat_weights: np.ndarray    # [26, V + 1]; column V (missing) is 0
  cat_hex: np.ndarray        # object [26, V + 1]; unique 8-char hex per feature, column V is ''
  int_log_mu: np.ndarray     # [13]
  int_log_sigma: np.ndarray  # [13]
  int_weights: np.ndarray    # [13], on log1p(max(x, 0))
  interactions: tuple[tuple[int, int, np.ndarray], ...]  # (feature a, feature b, table [50, 50])
  bias: float

  def logit(self, ints: np.ndarray, cat_ids: np.ndarray, *,
            interactions: bool = True) -> np.ndarray:
    """Planted logit of rows given integer values (missing as 0) and ids (missing as vocab_size)."""
    z = self.bias + np.log1p(np.maximum(ints, 0)) @ self.int_weights
    flat_ids = cat_ids + np.arange(NUM_CAT) * (self.vocab_size + 1)
    z += np.take(self.cat_weights, flat_ids).sum(axis=1)
    if interactions:
      missing = self.vocab_size
      for a, b, table in self.interactions:
        ia, ib = cat_ids[:, a], cat_ids[:, b]
        present = (ia != missing) & (ib != missing)
        z += present * table[ia % _INTERACTION_MOD, ib % _INTERACTION_MOD]
    return z

  def sample(self, rng: np.random.Generator, n: int) -> Sample:
    """Draws n rows with labels."""
    scaled = rng.random((n, NUM_CAT)) * self.vocab_size
    cat_ids = scaled.astype(np.int64)
    cat_ids = np.where(scaled - cat_ids < self.alias_accept[cat_ids], cat_ids,
                       self.alias_other[cat_ids])
    cat_ids[rng.random((n, NUM_CAT)) < self.missing_rate] = self.vocab_size

    normal = rng.standard_normal((n, NUM_INT))
    ints = np.maximum(np.exp(self.int_log_mu + self.int_log_sigma * normal).astype(np.int64) - 1, 0)
    negative = rng.random(n) < _NEGATIVE_RATE
    ints[negative, _NEGATIVE_INT_FEATURE] = -rng.integers(1, 3, size=int(negative.sum()))
    int_missing = rng.random((n, NUM_INT)) < self.missing_rate
    ints[int_missing] = 0

    logits = self.logit(ints, cat_ids)
    labels = (rng.random(n) < _sigmoid(logits)).astype(np.int64)
    return Sample(ints, int_missing, cat_ids, logits, labels)


@functools.lru_cache(maxsize=8)
def planted_model(model_seed: int = 1234, vocab_size: int = 10_000, zipf_a: float = 1.2,
                  missing_rate: float = 0.02, base_rate: float = 0.25) -> PlantedModel:
  """The ground-truth model for these parameters, with its bias calibrated to base_rate."""
  if vocab_size < 2:
    raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
  if not 0 < base_rate < 1:
    raise ValueError(f"base_rate must be in (0, 1), got {base_rate}")
  rng = np.random.default_rng(model_seed)
  probs = 1.0 / np.arange(1, vocab_size + 1)**zipf_a
  probs /= probs.sum()
  alias_accept, alias_other = _alias_table(probs)

  stds = np.full(NUM_CAT, _WEAK_CAT_STD)
  stds[rng.choice(NUM_CAT, _NUM_STRONG_CAT, replace=False)] = _STRONG_CAT_STD
  cat_weights = np.zeros((NUM_CAT, vocab_size + 1))
  cat_weights[:, :vocab_size] = rng.standard_normal((NUM_CAT, vocab_size)) * stds[:, None]

  # id -> (id * odd + offset) mod 2^32 is a bijection, so the hex strings are unique per feature.
  multipliers = rng.integers(0, 1 << 31, size=NUM_CAT) * 2 + 1
  offsets = rng.integers(0, 1 << 32, size=NUM_CAT)
  ids = np.arange(vocab_size, dtype=np.uint64)
  cat_hex = np.empty((NUM_CAT, vocab_size + 1), dtype=object)
  for k in range(NUM_CAT):
    codes = (ids * np.uint64(multipliers[k]) + np.uint64(offsets[k])) % np.uint64(1 << 32)
    cat_hex[k, :vocab_size] = [f"{c:08x}" for c in codes.tolist()]
    cat_hex[k, vocab_size] = ""

  pairs = rng.choice(NUM_CAT, size=(_NUM_INTERACTIONS, 2), replace=False)
  interactions = tuple(
      (int(a), int(b), rng.standard_normal((_INTERACTION_MOD, _INTERACTION_MOD)) * _INTERACTION_STD)
      for a, b in pairs)

  model = PlantedModel(
      vocab_size=vocab_size,
      missing_rate=missing_rate,
      alias_accept=alias_accept,
      alias_other=alias_other,
      cat_weights=cat_weights,
      cat_hex=cat_hex,
      int_log_mu=rng.uniform(0.0, 3.0, NUM_INT),
      int_log_sigma=rng.uniform(0.5, 1.5, NUM_INT),
      int_weights=rng.standard_normal(NUM_INT) * _INT_WEIGHT_STD,
      interactions=interactions,
      bias=0.0,
  )
  logits = np.concatenate(
      [model.sample(rng, _CHUNK_ROWS).logits for _ in range(_CALIBRATION_ROWS // _CHUNK_ROWS)])
  return dataclasses.replace(model, bias=_calibrated_bias(logits, base_rate))


def generate(output_dir: str, num_rows: int, num_files: int = 1, *, seed: int = 0,
             model_seed: int = 1234, vocab_size: int = 10_000, zipf_a: float = 1.2,
             missing_rate: float = 0.02, file_format: str = "tsv", prefix: str = "part",
             base_rate: float = 0.25) -> list[str]:
  """Writes num_rows rows into files {prefix}-00000-of-0000N.{tsv,parquet}; returns their paths."""
  if file_format not in FILE_FORMATS:
    raise ValueError(f"file_format={file_format!r} is not one of "
                     f'{", ".join(map(repr, FILE_FORMATS))}')
  if num_files < 1 or num_rows < 0:
    raise ValueError(f"need num_files >= 1 and num_rows >= 0, got {num_files} and {num_rows}")
  model = planted_model(model_seed, vocab_size, zipf_a, missing_rate, base_rate)
  dictionaries = [pa.array(model.cat_hex[k], pa.string()) for k in range(NUM_CAT)]
  tf.io.gfile.makedirs(output_dir)
  paths = []
  for index in range(num_files):
    rows = num_rows // num_files + (index < num_rows % num_files)
    path = os.path.join(output_dir, f"{prefix}-{index:05d}-of-{num_files:05d}.{file_format}")
    rng = np.random.default_rng([seed, index])
    tables = (_arrow_table(model.sample(rng, min(_CHUNK_ROWS, rows - start)), dictionaries,
                           file_format)
              for start in range(0, rows, _CHUNK_ROWS))
    with records.written_atomically(path) as tmp, tf.io.gfile.GFile(tmp, "wb") as f:
      (_write_tsv if file_format == "tsv" else _write_parquet)(f, tables)
    paths.append(path)
  return paths


def _arrow_table(sample: Sample, dictionaries: list[pa.Array], file_format: str) -> pa.Table:
  """One chunk's columns. Missing: in TSV a null int and a '' categorical (both written empty), in
  Parquet 0 and ''."""
  tsv = file_format == "tsv"
  columns = [pa.array(sample.labels)]
  for j in range(NUM_INT):
    columns.append(pa.array(sample.ints[:, j], mask=sample.int_missing[:, j] if tsv else None))
  for k in range(NUM_CAT):
    cats = pa.DictionaryArray.from_arrays(sample.cat_ids[:, k].astype(np.int32), dictionaries[k])
    columns.append(cats if tsv else cats.dictionary_decode())
  return pa.Table.from_arrays(columns, names=[LABEL_COLUMN, *INT_COLUMNS, *CAT_COLUMNS])


def _write_tsv(f: tf.io.gfile.GFile, tables: Iterable[pa.Table]) -> None:
  """Tab-separated lines without header or quotes; nulls come out as empty fields."""
  options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
  for table in tables:
    buffer = pa.BufferOutputStream()
    pacsv.write_csv(table, buffer, options)
    f.write(buffer.getvalue().to_pybytes())


def _write_parquet(f: tf.io.gfile.GFile, tables: Iterable[pa.Table]) -> None:
  """One Parquet file, a row group per chunk, in the schema data_pipelines.criteo reads."""
  schema = pa.schema([(LABEL_COLUMN, pa.int64())] + [(name, pa.int64()) for name in INT_COLUMNS] +
                     [(name, pa.string()) for name in CAT_COLUMNS])
  with pq.ParquetWriter(_GFileSink(f), schema) as writer:
    for table in tables:
      writer.write_table(table)


class _GFileSink(io.RawIOBase):
  """Write-only file object over a GFile, which lacks the `closed` and position pyarrow needs."""

  def __init__(self, f: tf.io.gfile.GFile) -> None:
    super().__init__()
    self._file = f
    self._position = 0

  def writable(self) -> bool:
    return True

  def tell(self) -> int:
    return self._position

  def write(self, data) -> int:
    self._file.write(bytes(data))
    self._position += len(data)
    return len(data)


def _alias_table(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Walker/Vose alias table: draw i uniformly, keep it with prob accept[i], else take other[i]."""
  n = len(probs)
  scaled = (probs * n).tolist()
  accept, other = [1.0] * n, list(range(n))
  small = [i for i, p in enumerate(scaled) if p < 1.0]
  large = [i for i, p in enumerate(scaled) if p >= 1.0]
  while small and large:
    s, big = small.pop(), large.pop()
    accept[s], other[s] = scaled[s], big
    scaled[big] += scaled[s] - 1.0
    (small if scaled[big] < 1.0 else large).append(big)
  return np.array(accept), np.array(other, dtype=np.int64)


def _sigmoid(x: np.ndarray) -> np.ndarray:
  return 1.0 / (1.0 + np.exp(-x))


def _calibrated_bias(logits: np.ndarray, base_rate: float) -> float:
  """Bias b with mean(sigmoid(logits + b)) == base_rate, by bisection (the mean is monotone in
  b)."""
  low, high = -30.0, 30.0
  for _ in range(60):
    middle = (low + high) / 2
    if _sigmoid(logits + middle).mean() < base_rate:
      low = middle
    else:
      high = middle
  return (low + high) / 2


def _define_flags() -> None:
  """Command-line flags; defined only when run as a program so importers get no flags."""
  flags.DEFINE_string("output_dir", None, "Directory (any tf.io.gfile path) to write the files to.")
  flags.DEFINE_integer("num_rows", 1_000_000, "Rows in total.")
  flags.DEFINE_integer("num_files", 1, "Files to split the rows over.")
  flags.DEFINE_integer("seed", 0, "Seed of the rows.")
  flags.DEFINE_integer("model_seed", 1234, "Seed of the planted ground-truth model.")
  flags.DEFINE_integer("vocab_size", 10_000, "Ids per categorical feature.")
  flags.DEFINE_enum("format", "tsv", list(FILE_FORMATS), "File format.")
  flags.DEFINE_string("prefix", "part", "File name prefix.")


def main(argv: list[str]) -> None:
  """Writes the files and prints the generation speed."""
  del argv
  flag_values = flags.FLAGS
  if not flag_values.output_dir:
    raise app.UsageError("--output_dir is required")
  start = time.perf_counter()
  paths = generate(flag_values.output_dir, flag_values.num_rows, flag_values.num_files,
                   seed=flag_values.seed, model_seed=flag_values.model_seed,
                   vocab_size=flag_values.vocab_size, file_format=flag_values.format,
                   prefix=flag_values.prefix)
  seconds = time.perf_counter() - start
  logging.info("wrote %s", ", ".join(paths))
  print(f"wrote {flag_values.num_rows} rows in {len(paths)} file(s) to {flag_values.output_dir} "
        f"in {seconds:.2f} s ({flag_values.num_rows / seconds:,.0f} rows/s)")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
