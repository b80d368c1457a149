"""Parquet files as tf.data blocks of columns, read with pyarrow (or tensorflow-io's kernels).

``open_blocks(groups)`` is the ``open_file`` of ``records.read_tagged_files(..., blocks=True)``:
a file as blocks of ``records.READ_BLOCK`` rows, each a dict of ``groups``: ``name: (dtype,
column)`` gives the column as a vector ``[rows]``, ``name: (dtype, [columns])`` those columns
stacked as ``[rows, columns]`` (stacked once per read, so a row travels through unbatch, shuffle
and batch as one tensor per group and reaches the parser as the matrix it needs).

``reader='pyarrow'`` (the default, any TensorFlow version): pyarrow reads the needed columns of
``CHUNK`` rows at a time (through ``tf.io.gfile``, so every TF filesystem works); integer columns
reach TensorFlow as one array per chunk and string columns as their Arrow buffers (one data
string and its offsets per column, cut into values by one ``tf.strings.substr``), so no Python
runs per row. A null counts as missing: 0 in an integer column, '' in a string column; in a
``required`` group (a label) it is no value at all and reads as ``NULL`` (int64's least), which
the pipeline's check refuses naming the row (``shown_value``).
``reader='tensorflow_io'``: tensorflow-io's Parquet kernels (only where it loads: TF 2.17), which
return garbage for nulls; files for it must hold none.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import tensorflow as tf

from data_pipelines import records

READERS = ("pyarrow", "tensorflow_io")
# Rows per read (a multiple of READ_BLOCK): tensorflow-io's read calls each cost about as much as
# decoding 10k rows (1024-row reads ran at 10k rows/s, 65536-row reads at 260k).
CHUNK = 64 * records.READ_BLOCK
Groups = Mapping[str, tuple[tf.DType, "str | Sequence[str]"]]
NULL = np.iinfo(np.int64).min  # a null in a required integer group


def shown_value(value: tf.Tensor) -> tf.Tensor:
  """`` (got: <value>)`` of an integer read from a required group (``null`` for a null)."""
  return records.shown(tf.where(value == NULL, "null", tf.strings.as_string(value)))


class GFileReader(io.RawIOBase):
  """Seekable read-only file object over a GFile, which lacks the `closed` pyarrow needs."""

  def __init__(self, f: tf.io.gfile.GFile) -> None:
    super().__init__()
    self._file = f

  def readable(self) -> bool:
    return True

  def seekable(self) -> bool:
    return True

  def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
    self._file.seek(offset, whence)
    return self._file.tell()

  def tell(self) -> int:
    return self._file.tell()

  def readinto(self, buffer) -> int:
    data = self._file.read(len(buffer))
    buffer[:len(data)] = data
    return len(data)


def open_blocks(groups: Groups, reader: str = "pyarrow", required: Sequence[str] = ()
                ) -> Callable[[tf.Tensor], tf.data.Dataset]:
  """``open_file`` for ``read_tagged_files(..., blocks=True)`` (module docstring); nulls of the
  integer groups named in ``required`` read as ``NULL``."""
  records.check_choice("Parquet reader", reader, READERS)
  chunks = (_pyarrow_chunks(groups, required) if reader == "pyarrow"
            else _tensorflow_io_chunks(groups))

  def blocks(chunk: dict) -> tf.data.Dataset:
    size = tf.shape(next(iter(chunk.values())), out_type=tf.int64)[0]
    return tf.data.Dataset.range(0, size, records.READ_BLOCK).map(
        lambda start: {name: value[start:start + records.READ_BLOCK]
                       for name, value in chunk.items()})

  return lambda path: chunks(path).flat_map(blocks)


def _columns(spec: "str | Sequence[str]") -> list[str]:
  return [spec] if isinstance(spec, str) else list(spec)


def _pyarrow_chunks(groups: Groups, required: Sequence[str] = ()
                    ) -> Callable[[tf.Tensor], tf.data.Dataset]:
  """Chunks of CHUNK rows as dicts of ``groups``, from pyarrow record batches."""
  signature = {}
  for name, (dtype, spec) in groups.items():
    if dtype == tf.string:
      signature[f"{name}/data"] = tf.TensorSpec([len(_columns(spec))], tf.string)
      signature[f"{name}/offsets"] = tf.TensorSpec([len(_columns(spec)), None], tf.int64)
    else:
      signature[name] = tf.TensorSpec([None, len(_columns(spec))], dtype)

  def read(path: bytes) -> Iterator[dict]:
    path = path.decode()
    names = [c for _, spec in groups.values() for c in _columns(spec)]
    with tf.io.gfile.GFile(path, "rb") as f:
      try:
        parquet = pq.ParquetFile(GFileReader(f))
        missing = sorted(set(names) - set(parquet.schema_arrow.names))
        if missing:
          raise ValueError(f"no Parquet column {', '.join(missing)}")
        for batch in parquet.iter_batches(batch_size=CHUNK, columns=names):
          yield _chunk(batch, groups, required)
      except (pa.ArrowException, OSError, ValueError) as e:  # named: TF's error will not be
        raise ValueError(f"{path}: unreadable Parquet file ({e})") from None

  def assemble(chunk: dict) -> dict:
    out = {}
    for name, (dtype, spec) in groups.items():
      if dtype == tf.string:
        offsets = chunk[f"{name}/offsets"]
        starts, lengths = offsets[:, :-1], offsets[:, 1:] - offsets[:, :-1]
        values = tf.transpose(tf.strings.substr(chunk[f"{name}/data"][:, tf.newaxis], starts,
                                                lengths))
      else:
        values = chunk[name]
      out[name] = values[:, 0] if isinstance(spec, str) else values
    return out

  return lambda path: tf.data.Dataset.from_generator(
      read, args=(path,), output_signature=signature).map(assemble)


def _chunk(batch: pa.RecordBatch, groups: Groups, required: Sequence[str] = ()) -> dict:
  """One record batch as the generator's arrays: numbers stacked, strings as Arrow buffers."""
  out = {}
  for name, (dtype, spec) in groups.items():
    columns = [batch.column(c) for c in _columns(spec)]
    if dtype == tf.string:
      data, offsets = zip(*(_string_buffers(c) for c in columns))
      out[f"{name}/data"] = np.array(data, dtype=object)
      out[f"{name}/offsets"] = np.stack(offsets)
    else:
      missing = NULL if name in required else 0
      out[name] = np.stack([pc.fill_null(c.cast(pa.int64()), missing).to_numpy().astype(
          dtype.as_numpy_dtype) for c in columns], axis=1)
  return out


def _string_buffers(column: pa.Array) -> tuple[bytes, np.ndarray]:
  """A string column's values as (all their bytes, offsets [rows + 1]); nulls become ''."""
  column = pc.fill_null(column.cast(pa.large_binary()), b"")
  _, offsets, data = column.buffers()
  offsets = np.frombuffer(offsets, dtype=np.int64)[column.offset:column.offset + len(column) + 1]
  start = int(offsets[0]) if len(offsets) else 0
  stop = int(offsets[-1]) if len(offsets) else 0
  payload = data.to_pybytes()[start:stop] if data is not None else b""
  return payload, offsets - start


def tensorflow_io_loads() -> bool:
  """Whether tensorflow-io and its ops load here (the ``io`` extra, on TF 2.17): where
  ``reader='tensorflow_io'`` and its filesystems (s3, hdfs, az) work."""
  try:
    from tensorflow_io.python.ops import core_ops  # noqa: F401  pylint: disable=g-import-not-at-top
  except Exception:  # pylint: disable=broad-except  (not installed, or its ops fail to load)
    return False
  return True


def _tensorflow_io_chunks(groups: Groups) -> Callable[[tf.Tensor], tf.data.Dataset]:
  """Chunks of CHUNK rows as dicts of ``groups``, from tensorflow-io's Parquet kernels (its
  ``IODataset.from_parquet`` unbatches every column to single values and zips them back)."""
  from tensorflow_io.python.ops import core_ops  # slow to import: only when Parquet is read

  def chunks(path: tf.Tensor) -> tf.data.Dataset:
    names, shapes, _ = core_ops.io_parquet_readable_info(path, shared=path,
                                                         container="ParquetIODataset")

    def shape(name: str) -> tf.Tensor:
      found = tf.boolean_mask(shapes, tf.equal(names, name))
      tf.debugging.assert_equal(tf.shape(found)[0], 1, message=f"no Parquet column {name}")
      return tf.boolean_mask(found[0], found[0] >= 0)

    def column(name: str, dtype: tf.DType, start: tf.Tensor, stop: tf.Tensor) -> tf.Tensor:
      values = core_ops.io_parquet_readable_read(
          input=path, shared=path, component=name, shape=shape(name), start=start, stop=stop,
          dtype=dtype, container="ParquetIODataset")
      values.set_shape([None])  # one value per row (the kernel's output has no shape)
      return values

    _, first = next(iter(groups.values()))
    rows = shape(_columns(first)[0])[0]

    def read(start: tf.Tensor) -> dict:
      stop = tf.minimum(start + CHUNK, rows)
      return {group: (column(cols, dtype, start, stop) if isinstance(cols, str) else
                      tf.stack([column(c, dtype, start, stop) for c in cols], axis=1))
              for group, (dtype, cols) in groups.items()}

    return tf.data.Dataset.range(0, rows, CHUNK).map(read)

  return chunks
