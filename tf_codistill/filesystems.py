"""Makes tensorflow-io's filesystems (s3://, hdfs://, az://, http(s)://) usable through tf.io.gfile.

TensorFlow itself knows local paths and gs://; the others are plugins that tensorflow-io
registers when it is imported (it loads on TensorFlow 2.17 only). Importing it is slow, so it
happens only when a path needs it, and only for a scheme it provides.
"""

from __future__ import annotations

from typing import Iterable, Optional

import tensorflow as tf
from tensorflow.python.lib.io import file_io

# The schemes tensorflow-io 0.37 registers.
TENSORFLOW_IO_SCHEMES = ("s3", "hdfs", "viewfs", "har", "az", "http", "https")


def scheme(path: str) -> str:
  """The URL scheme of ``path`` ('' for a local path)."""
  return path.split("://", 1)[0] if "://" in path else ""


def ensure_filesystems(paths: Iterable[Optional[str]]) -> None:
  """Registers the filesystem of every path's scheme, or raises ValueError naming the path and
  what it needs: an unknown scheme, or tensorflow-io (the ``io`` extra) where it is missing or
  does not load."""
  for path in paths:
    if not path or scheme(path) in file_io.get_registered_schemes():
      continue
    if scheme(path) not in TENSORFLOW_IO_SCHEMES:
      raise ValueError(f"{path}: no filesystem for scheme {scheme(path)!r}; known schemes: "
                       f"{sorted(set(file_io.get_registered_schemes()) - {''})} and, with "
                       f"tensorflow-io, {list(TENSORFLOW_IO_SCHEMES)}")
    try:
      import tensorflow_io  # noqa: F401  (registers s3, hdfs, az, http, ...)
    except (ImportError, tf.errors.NotFoundError) as e:
      raise ValueError(
          f"{path}: {scheme(path)}:// needs tensorflow-io (pip install 'tf-codistill[io]'), which "
          f"loads on TensorFlow 2.17 only; this is TensorFlow {tf.__version__} ({e})") from None
    if scheme(path) not in file_io.get_registered_schemes():
      raise ValueError(f"{path}: tensorflow-io registered no filesystem for scheme "
                       f"{scheme(path)!r}")
