"""Serving on raw input: a SavedModel signature that parses raw records inside the model.

``serving_default`` takes the pipeline's features (for Criteo: hashed ids and ``log1p`` floats),
so a server would have to re-implement the pipeline's parsing, which is how train/serve skew
happens. ``serving_raw`` takes the raw records instead (``lines``: a string per example) and
applies a data pipeline's raw parser inside the SavedModel: ``criteo.raw_parser`` (a Criteo TSV
line) or ``text_lm.raw_parser`` (a line of text, through the saved vocabulary); it returns
``logits`` and ``probabilities``. ``check_raw_parser`` verifies, before training, that the
parser computes exactly the pipeline's features on the first lines of a file.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from data_pipelines import records
from tf_codistill import losses
from tf_codistill.errors import ConfigurationError
from tf_codistill.exchange import directory as exchange

RAW_SIGNATURE_KEY = "serving_raw"
RAW_INPUT_KEY = "lines"
PROBABILITIES_KEY = "probabilities"
CHECKED_LINES = 64
_PARQUET_MAGIC = b"PAR1"  # a Parquet file is never read as lines, even when its bytes are UTF-8

RawParser = Callable[[tf.Tensor], Any]


def raw_signature(model: keras.Model, parser: RawParser,
                  output: str) -> tf.types.experimental.ConcreteFunction:
  """The ``serving_raw`` signature: ``lines`` [B] strings -> ``logits`` and ``probabilities``
  of ``model`` on ``parser(lines)``."""
  losses._check("output", output, losses.OUTPUTS)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=RAW_INPUT_KEY)])
  def serve_raw(lines):
    logits = model(parser(lines), training=False)
    return {exchange.OUTPUT_KEY: logits,
            PROBABILITIES_KEY: losses.probabilities(logits, output)}

  return serve_raw.get_concrete_function()


def raw_signatures(model: keras.Model, parser: Optional[RawParser],
                   output: str) -> Dict[str, tf.types.experimental.ConcreteFunction]:
  """``{'serving_raw': ...}`` for ``exchange.save_model``, or nothing without a parser."""
  return {} if parser is None else {RAW_SIGNATURE_KEY: raw_signature(model, parser, output)}


def check_raw_parser(parser: RawParser, dataset_fn: Callable[..., tf.data.Dataset], path: str,
                     num_lines: int = CHECKED_LINES) -> bool:
  """Raises ConfigurationError unless ``parser`` gives ``dataset_fn``'s features on the first
  ``num_lines`` lines of ``path`` (the lines both accept: the pipeline's ``bad_lines`` policy
  reports or skips a malformed one itself); False (checked nothing) when ``path`` is not UTF-8
  text lines (e.g. Parquet) or the pipeline fails on its first lines."""
  with tf.io.gfile.GFile(path, "rb") as f:
    parquet = f.read(len(_PARQUET_MAGIC)) == _PARQUET_MAGIC
  lines = None if parquet else next(iter(tf.data.TextLineDataset(path).batch(num_lines)), None)
  if lines is None or not _is_text(lines):
    logging.info("serving: raw parser not checked: %s holds no text lines", path)
    return False
  lines, raw = _parsed_lines(parser, lines, path)
  try:
    features = next(iter(dataset_fn([path], num_lines)))[0]
  except tf.errors.InvalidArgumentError:
    logging.info("serving: raw parser not checked: the pipeline rejects a line of %s", path)
    return False
  stream = getattr(parser, "token_stream", None)
  if stream is not None:  # token windows: compare the parser's token stream with the windows'
    raw, features = _aligned_streams(stream(lines), features)
  problem = _difference(raw, features)
  if problem:
    raise ConfigurationError(
        f"tfc.Data.raw_parser differs from tfc.Data.dataset_fn on the first "
        f"{lines.shape[0]} lines of {path}: {problem}; bind both to the same settings (e.g. "
        "NUM_BUCKETS), or a served model would see other features than it was trained on")
  return True


def _parsed_lines(parser: RawParser, lines: tf.Tensor, path: str) -> Tuple[tf.Tensor, Any]:
  """The lines ``parser`` accepts (all of them, usually) and its features of them;
  ConfigurationError if it accepts none."""
  try:
    return lines, parser(lines)
  except tf.errors.InvalidArgumentError as e:
    first = e
  accepted = []
  for line in tf.unstack(lines):
    try:
      parser(line[None])
      accepted.append(line)
    except tf.errors.InvalidArgumentError:
      pass
  if not accepted:
    raise ConfigurationError(f"tfc.Data.raw_parser cannot parse the first lines of {path}: "
                             f"{first.message.strip().splitlines()[0]}")
  kept = tf.stack(accepted)
  return kept, parser(kept)


def raw_lines(file_pattern: str | Sequence[str], batch_size: int) -> tf.data.Dataset:
  """Batches of the lines of the files matching ``file_pattern`` (sorted, in file order): the
  input of ``serving_raw``."""
  return tf.data.TextLineDataset(records.resolve_files(file_pattern, "raw")).batch(batch_size)


def _aligned_streams(stream: tf.Tensor, features: Any) -> Tuple[dict, dict]:
  """The first tokens of a parser's stream and of the pipeline's windows (``tokens`` [B, T]:
  unshuffled windows of one file are its token stream in order), as long as the shorter."""
  windows = tf.reshape(features["tokens"], [-1])
  length = min(int(tf.size(stream)), int(tf.size(windows)))
  return {"tokens": stream[None, :length]}, {"tokens": windows[None, :length]}


def _is_text(lines: tf.Tensor) -> bool:
  return bool(tf.reduce_all(tf.equal(records.valid_utf8(lines), lines)))


def _difference(raw: Any, features: Any) -> Optional[str]:
  """What differs between two feature structures (None if nothing)."""
  try:
    tf.nest.assert_same_structure(raw, features)
  except (ValueError, TypeError):
    return f"features {_keys(raw)} vs {_keys(features)}"
  if isinstance(features, dict):
    named = [(key, features[key], raw[key]) for key in sorted(features)]
  else:
    named = [(str(i), e, g) for i, (e, g) in enumerate(zip(tf.nest.flatten(features),
                                                            tf.nest.flatten(raw)))]
  for name, expected, got in named:
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape:
      return f"feature {name!r} has shape {got.shape}, the pipeline's {expected.shape}"
    close = np.isclose(got, expected, rtol=1e-6, atol=0)
    if not close.all():
      rows = np.flatnonzero(~np.all(close.reshape(len(got), -1), axis=1))
      return (f"feature {name!r} differs on {rows.size} of {len(got)} lines "
              f"(first: line {rows[0] + 1})")
  return None


def _keys(structure: Any) -> Any:
  return sorted(structure) if isinstance(structure, dict) else type(structure).__name__

