"""Gin parsing shared by the binaries: search paths, and errors that say what to fix."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator, Sequence

import gin

# Importing these registers their configurables with gin.
from data_pipelines import adult  # noqa: F401
from data_pipelines import criteo  # noqa: F401
from tf_codistill import launcher  # noqa: F401
from tf_codistill import losses  # noqa: F401
from tf_codistill import trainer  # noqa: F401
from tf_codistill.models import ctr  # noqa: F401

REPO_GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin")


class ConfigError(ValueError):
  """A gin file or binding that cannot be applied."""


def _is_include_probe(record: logging.LogRecord) -> bool:
  """gin logs an ERROR for every search-path candidate of an `include` that is not there."""
  return (record.name == "root" and record.pathname.endswith(os.path.join("gin", "resource_reader.py"))
          and record.getMessage().startswith("Path not found"))


@contextlib.contextmanager
def _quiet_include_probes() -> Iterator[None]:
  """Drops gin's per-candidate 'Path not found' errors; a real missing include still raises."""
  log_filter = lambda record: not _is_include_probe(record)
  root = logging.getLogger()
  root.addFilter(log_filter)
  try:
    yield
  finally:
    root.removeFilter(log_filter)


def parse_gin(gin_files: Sequence[str] = (), gin_bindings: Sequence[str] = ()) -> None:
  """Parses gin files and bindings; `include`s resolve next to each file and under gin/."""
  for path in list(gin_files):
    if not os.path.exists(path) and os.path.exists(os.path.join(REPO_GIN_DIR, path)):
      continue
    if not os.path.exists(path):
      raise ConfigError(f"--gin_file={path}: no such file")
  search = {os.path.dirname(os.path.abspath(p)) for p in gin_files} | {REPO_GIN_DIR,
                                                                         os.path.dirname(REPO_GIN_DIR)}
  for directory in sorted(search):
    gin.add_config_file_search_path(directory)
  try:
    with _quiet_include_probes():
      gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings),
                                          finalize_config=False)
  except (ValueError, TypeError, SyntaxError, IOError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ConfigError(f"gin configuration error: {first}") from e
