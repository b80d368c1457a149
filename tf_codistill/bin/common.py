"""Flags and gin parsing shared by the binaries."""

from typing import Sequence

from absl import app
from absl import flags

from tf_codistill import config


def define_gin_flags() -> None:
  flags.DEFINE_multi_string("gin_file", [], "Gin config file(s); repeatable.")
  flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings, e.g. 'train.train_steps = 100'.")


def parse_gin_or_exit(gin_files: Sequence[str], gin_bindings: Sequence[str]) -> None:
  """Parses gin; a bad file or binding becomes a one-line usage error before any work starts."""
  try:
    config.parse_gin(gin_files, gin_bindings)
  except config.ConfigError as e:
    raise app.UsageError(str(e)) from None
