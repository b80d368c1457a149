"""What the tabular pipelines (Criteo, Adult) share: finding files, shards, and bad records.

Each pipeline opens its files and parses its own records; this module turns a list of files into
batches of records tagged with their file and 1-based record (line/row) number, sharded disjointly
between the workers that read them, and applies the bad-record policy to a parsed batch:
``'error'`` fails naming file, record and reason; ``'skip'`` drops the record and counts it.
Every pipeline's data files are written through ``written_atomically``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any, Iterator, Tuple

import tensorflow as tf
from absl import logging


@contextlib.contextmanager
def written_atomically(path: str) -> Iterator[str]:
  """Yields where to write ``path``; renames it into place when the block ends without error.

  The temporary file is a hidden sibling (``.tmp-<uuid>-<name>``) that no pattern of the data's
  own files (``train-*``, ``eval-*``) matches, so a writer killed mid-file never leaves a partial
  file that a reader's glob would pick up.
  """
  directory, name = os.path.split(path)
  tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{name}")
  yield tmp
  tf.io.gfile.rename(tmp, path, overwrite=True)


BAD_LINE_POLICIES = ("error", "skip")

_MAX_SHOWN_CHARS = 32
_MAX_CYCLE_LENGTH = 4
# Files are read and interleaved in blocks of records: tf.data's parallel interleave costs ~10 us
# per element, which per record would cap throughput near 80k records/s.
READ_BLOCK = 1024  # records per block read from a file (and numbered together)

Tensors = list[tf.Tensor]


class DataError(ValueError):
  """Input data that cannot be used (an empty file, a malformed line under bad_lines='error');
  the message names the file (and line) and what to do."""


class BadLineCounter:
  """Counts the distinct records dropped under bad_lines='skip': a record read again (the next
  epoch, the next evaluation) counts once. Records are told apart by ``"<file>:<number>"``.

  A lookup table, so dataset functions can add to it; create it outside any distribution strategy
  scope (it lives on the host).
  """

  def __init__(self) -> None:
    self._seen = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=0,
                                                         name="skipped_records")

  @property
  def count(self) -> int:
    """Distinct records dropped so far."""
    return int(self._seen.size().numpy())

  def add(self, places: tf.Tensor) -> tf.Operation:
    """Records the dropped records named by ``places`` ([N] ``"<file>:<number>"``); usable
    inside Dataset.map."""
    return self._seen.insert(places, tf.ones(tf.shape(places), tf.int64))

  def reset(self) -> None:
    """Forgets every record counted so far."""
    keys, _ = self._seen.export()
    self._seen.remove(keys)


def check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
  """ValueError naming ``name`` unless ``value`` is one of ``allowed``."""
  if value not in allowed:
    raise ValueError(f'{name}={value!r} is not one of {", ".join(map(repr, allowed))}')


def resolve_files(file_pattern: str | os.PathLike | Sequence[str | os.PathLike],
                  what: str) -> list[str]:
  """Sorted files matching a glob or a list of globs/paths; FileNotFoundError names any glob that
  matches nothing (``what``: the kind of file, for the message)."""
  single = isinstance(file_pattern, (str, bytes, os.PathLike))
  patterns = [os.fsdecode(p) for p in ([file_pattern] if single else file_pattern)]
  if not patterns:
    raise FileNotFoundError(f"no {what} file pattern given")
  matches = {pattern: tf.io.gfile.glob(pattern) for pattern in patterns}
  unmatched = [pattern for pattern, files in matches.items() if not files]
  if unmatched:
    raise FileNotFoundError(f'no {what} files match {", ".join(map(repr, unmatched))}')
  return sorted({f for files in matches.values() for f in files})


def drop_empty_files(files: Sequence[str], bad_lines: str, pattern,
                     binding: str = "criteo.make_dataset.bad_lines") -> list[str]:
  """``files`` without empty (0-byte) ones: an error naming the file under bad_lines='error', a
  warning under 'skip'; an error if nothing is left. ``binding``: the gin parameter to name."""
  kept = []
  for path in files:
    if tf.io.gfile.stat(path).length > 0:
      kept.append(path)
    elif bad_lines == "error":
      raise DataError(f"{path}: empty file (0 bytes); remove it, or bind "
                      f"{binding} = 'skip' to skip empty files and bad lines")
    else:
      logging.warning("%s: empty file (0 bytes), skipped (bad_lines='skip')", path)
  if not kept:
    raise DataError(f"every file matching {pattern!r} is empty")
  return kept


def read_tagged_files(files: Sequence[str], open_file: Callable[[tf.Tensor], tf.data.Dataset],
                      batch_size: int, *, shard_index: int = 0, num_shards: int = 1,
                      repeat: bool = False, shuffle_buffer: int = 0, seed: int | None = None,
                      deterministic: bool = True, drop_remainder: bool = False,
                      cache: bool = False, blocks: bool = False) -> tf.data.Dataset:
  """Batches of ``(file_ids, record_numbers, records)`` of shard ``shard_index`` of ``files``.

  ``open_file(path)`` yields one file's records, or with ``blocks`` its blocks of READ_BLOCK
  records (the last one may be shorter): a columnar reader reads a block of every column at
  once. Shards are disjoint: by file when there are at
  least ``num_shards`` files, else by record within every file (whatever order interleave
  produces). ``file_ids`` index ``files``; record numbers are 1-based within their file.
  ``cache`` keeps the shard's records in memory after the first pass, so later epochs read no
  file (for data that fits in memory); the files are then read in one fixed order, and records
  are still shuffled every epoch.
  """
  if not 0 <= shard_index < num_shards:
    raise ValueError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  shard_by_file = len(files) >= num_shards
  ids = list(range(len(files)))
  if shard_by_file:
    ids = ids[shard_index::num_shards]
  file_names = tf.constant(list(files))

  def read_file(file_id: tf.Tensor) -> tf.data.Dataset:
    opened = open_file(file_names[file_id])
    read = (opened if blocks else opened.batch(READ_BLOCK)).enumerate()
    return read.map(lambda index, records: _tag_block(
        file_id, index, records, None if shard_by_file else (num_shards, shard_index)))

  dataset = tf.data.Dataset.from_tensor_slices(tf.constant(ids, tf.int64))
  if shuffle_buffer > 0 and not cache:
    dataset = dataset.shuffle(len(ids), seed=seed)
  dataset = dataset.interleave(
      read_file,
      cycle_length=min(len(ids), _MAX_CYCLE_LENGTH),
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=deterministic,
  )
  dataset = dataset.unbatch()
  if cache:
    dataset = dataset.cache()
  if shuffle_buffer > 0:
    dataset = dataset.shuffle(shuffle_buffer, seed=seed)
  if repeat:
    dataset = dataset.repeat()
  return dataset.batch(batch_size, drop_remainder=drop_remainder)


def parsed_batches(files: Sequence[str], open_file: Callable[[tf.Tensor], tf.data.Dataset],
                   parse: Callable[..., Tuple[Any, tf.Tensor]], batch_size: int, *,
                   bad_lines: str, prefix: str, counter: BadLineCounter | None = None,
                   deterministic: bool = True, **read_options) -> tf.data.Dataset:
  """Batches of ``(features, label)``: ``parse(records, enforce)`` over each batch of the tagged
  records of ``files`` (``read_tagged_files`` with ``read_options``). ``enforce(ok, describe,
  tensors)`` applies the ``bad_lines`` policy (``enforce``), naming file and record number after
  ``prefix``. Under 'error' batches keep their static size; under 'skip' a batch that dropped
  every record is dropped.
  """
  dataset = read_tagged_files(files, open_file, batch_size, deterministic=deterministic,
                              **read_options)

  def parse_tagged(file_ids: tf.Tensor, numbers: tf.Tensor, batch):
    checked = functools.partial(enforce, where=locator(files, file_ids, numbers), prefix=prefix,
                                policy=bad_lines, counter=counter)
    features, label = parse(batch, checked)
    if bad_lines == "error":
      # Keep a static batch size (drop_remainder=True) through string splitting and masking.
      for tensor in tf.nest.flatten((features, label)):
        tensor.set_shape(file_ids.shape[:1].concatenate(tensor.shape[1:]))
    return features, label

  dataset = dataset.map(parse_tagged, num_parallel_calls=tf.data.AUTOTUNE,
                        deterministic=deterministic)
  if bad_lines == "skip":
    dataset = dataset.filter(lambda features, label: tf.shape(label)[0] > 0)
  return dataset.prefetch(tf.data.AUTOTUNE)


def locator(files: Sequence[str], file_ids: tf.Tensor,
            record_numbers: tf.Tensor) -> Callable[[tf.Tensor], tf.Tensor]:
  """``where(i)``: ``"<file>:<record number>"`` of record ``i`` (or of each of a vector of
  indices) of a tagged batch."""
  file_names = tf.constant(list(files))
  return lambda i: tf.strings.join([tf.gather(file_names, tf.gather(file_ids, i)), ":",
                                    tf.strings.as_string(tf.gather(record_numbers, i))])


def enforce(ok: tf.Tensor, describe: Callable[[tf.Tensor], tf.Tensor], tensors: Tensors, *,
            where: Callable[[tf.Tensor], tf.Tensor], prefix: str, policy: str,
            counter: BadLineCounter | None) -> Tensors:
  """Applies the bad-record policy to a batch: fail on the first bad record, or mask bad ones out.

  ``ok``: [B] bool; ``describe(i)``/``where(i)``: the reason and place of bad record ``i``, only
  built for a failing batch.
  """
  if policy == "skip":
    if counter is not None:
      with tf.control_dependencies([counter.add(where(tf.where(~ok)[:, 0]))]):
        return [tf.boolean_mask(t, ok) for t in tensors]
    return [tf.boolean_mask(t, ok) for t in tensors]

  all_ok = tf.reduce_all(ok)

  def fail() -> tf.Tensor:
    i = tf.argmin(tf.cast(ok, tf.int32))
    message = tf.strings.join([prefix, where(i), ": ", describe(i)])
    with tf.control_dependencies([tf.debugging.Assert(all_ok, [message])]):
      return tf.identity(all_ok)

  # The message is only built for a failing batch; parsing must wait for the check.
  checked = tf.cond(all_ok, lambda: tf.identity(all_ok), fail)
  with tf.control_dependencies([checked]):
    return [tf.identity(t) for t in tensors]


def valid_utf8(value: tf.Tensor) -> tf.Tensor:
  """``value`` with invalid UTF-8 bytes replaced by U+FFFD (equal to ``value`` iff it is valid)."""
  return tf.strings.unicode_transcode(value, "UTF-8", "UTF-8", errors="replace",
                                      replacement_char=0xFFFD)


def shown(value: tf.Tensor) -> tf.Tensor:
  """`` (got: <the first characters of value>)`` for an error message."""
  # No quotes: tf.debugging.Assert escapes them in its message. Invalid UTF-8 is replaced, or the
  # error message itself could not be decoded (a UnicodeDecodeError instead of the bad line).
  return tf.strings.join([" (got: ", valid_utf8(tf.strings.substr(value, 0, _MAX_SHOWN_CHARS)),
                          ")"])


def _tag_block(file_id: tf.Tensor, block_index: tf.Tensor, records,
               record_shard: tuple[int, int] | None):
  """Tags a block of one file's records with file and 1-based record numbers; keeps this shard's."""
  size = tf.shape(tf.nest.flatten(records)[0], out_type=tf.int64)[0]
  numbers = block_index * READ_BLOCK + tf.range(1, size + 1, dtype=tf.int64)
  block = (tf.fill([size], file_id), numbers, records)
  if record_shard is not None:
    num_shards, shard_index = record_shard
    keep = tf.equal((numbers - 1) % num_shards, shard_index)
    block = tf.nest.map_structure(lambda t: tf.boolean_mask(t, keep), block)
  return block
