"""Makes tensorflow-io's filesystems (s3://, hdfs://, az://, http(s)://) usable through tf.io.gfile.

TensorFlow 2.17 itself knows local paths and gs://; the others are plugins that tensorflow-io
registers when it is imported. Importing it is slow, so it happens only when a path needs it.
"""

from __future__ import annotations

from typing import Iterable, Optional

from tensorflow.python.lib.io import file_io


def scheme(path: str) -> str:
  """The URL scheme of ``path`` ('' for a local path)."""
  return path.split("://", 1)[0] if "://" in path else ""


def ensure_filesystems(paths: Iterable[Optional[str]]) -> None:
  """Registers the filesystem of every path's scheme, or raises naming the path it cannot serve."""
  for path in paths:
    if not path or scheme(path) in file_io.get_registered_schemes():
      continue
    import tensorflow_io  # noqa: F401  (registers s3, hdfs, az, http, ...)
    if scheme(path) not in file_io.get_registered_schemes():
      raise ValueError(f"{path}: no filesystem for scheme {scheme(path)!r}; known schemes: "
                       f"{sorted(s for s in file_io.get_registered_schemes() if s)}")
