"""JSON files that readers in other processes poll: written atomically, read as missing while
they are not whole (the fault tools' control files, and the benchmarks' records)."""

from __future__ import annotations

import json
import os
from typing import Any


def write_json(path: str, value: object, indent: int = 2) -> None:
  """Writes ``value`` as JSON to ``path`` atomically, making its directory."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  temp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(temp, "w") as f:
      json.dump(value, f, indent=indent, sort_keys=True)
    os.replace(temp, path)
  finally:
    if os.path.exists(temp):  # a value JSON cannot hold: nothing half-written is left
      os.remove(temp)


def read_json(path: str) -> Any:
  """The JSON value in the file at ``path``."""
  with open(path) as f:
    return json.load(f)


def read_json_or(path: str, default: Any = None) -> Any:
  """The JSON value at ``path``, or ``default`` while it is missing or not whole JSON (not yet
  written, or being replaced)."""
  try:
    return read_json(path)
  except (OSError, ValueError):
    return default
