"""Lean published versions: weights in bfloat16 or int8, and only the rows that changed.

A SavedModel version re-publishes every parameter in float32. ``PublishFormat`` makes a group's
versions leaner: ``encoding`` stores the weights in bfloat16 or int8 (``weight_codecs``), and
``row_deltas`` stores, for every array of which at most ``delta_max_fraction`` of the rows changed
since the group's previous version (an embedding table whose ids were not all looked up), only
those rows and their indices, with a whole version every ``whole_every`` publishes. A row
"changed" when its stored form did: a reader that applies the delta holds exactly what a whole
version would have given it. With ``row_tolerance`` > 0 a delta is error-bounded instead: it
sends only the rows that drifted from what readers hold by more than that fraction of the row's
largest magnitude, so every row a reader holds stays within it (plus the encoding's rounding).

Files of a lean version, beside ``COMPLETE`` (exchange.py)::

    weights.index, weights.data-00000-of-00001   a TF tensor bundle: for array i of the model's
                                                 weights, "<i>/values" [rows, width], "<i>/scales"
                                                 (int8: one bfloat16 per row; float32 from
                                                 older writers), "<i>/rows" (a delta's indices:
                                                 uint16 for tables of up to 65536 rows, else int32)

and the marker's ``format``: ``kind: 'lean'``, ``encoding``, a random ``id``, ``base`` (null for a
whole version, else the ``step`` and ``id`` of the version the delta applies to), ``arrays``
(name, shape, dtype, ``stored``: ``whole`` or ``rows``) and the serving ``signature``. A reader
(``LeanReader``) applies a delta only to the very version it names (by id, so a step published
again after a restart is not mistaken for it), walking back through the chain to the version it
holds or to a whole one; it rebuilds every array before anything is used, and rejects a version
whose chain it cannot read, like any bad version. Peers' graphs are never needed or run.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin
import numpy as np
import tensorflow as tf

from tf_codistill.errors import ConfigurationError
from tf_codistill.exchange import directory as exchange
from tf_codistill.exchange import weight_codecs

SAVED_MODEL = "saved_model"
BUNDLE = "weights"
KIND = "lean"
_MAX_CHAIN = 1000


@gin.configurable(module="tfc")
@dataclasses.dataclass(frozen=True)
class PublishFormat:
  """How a group publishes its versions.

  Attributes:
    encoding: ``saved_model`` (a whole float32 SavedModel, servable), or a lean version's weights
      in ``float32``, ``bfloat16`` or ``int8`` (per-row symmetric scales).
    row_deltas: lean versions store only the rows changed since the previous version (for
      arrays where at most ``delta_max_fraction`` of the rows changed).
    whole_every: with ``row_deltas``, every this many publishes a whole version is written (a
      new base for readers that fell behind or restarted).
    delta_max_fraction: above this fraction of changed rows an array is stored whole.
    row_tolerance: 0 (exact deltas: every row whose stored form changed), or error-bounded
      deltas: a row is sent only once ``max|row - held row| > row_tolerance * max|row|``, where
      ``held row`` is what readers hold (lossy: the staleness suite measures its effect).
  """
  encoding: str = SAVED_MODEL
  row_deltas: bool = False
  whole_every: int = 10
  delta_max_fraction: float = 0.5
  row_tolerance: float = 0.0

  def __post_init__(self):
    choices = (SAVED_MODEL,) + weight_codecs.ENCODINGS
    if self.encoding not in choices:
      raise ConfigurationError(f"tfc.PublishFormat.encoding={self.encoding!r} is not one of "
                               f"{list(choices)}")
    if self.row_deltas and self.encoding == SAVED_MODEL:
      raise ConfigurationError("tfc.PublishFormat.row_deltas=True needs a lean encoding "
                               f"({list(weight_codecs.ENCODINGS)}), not {SAVED_MODEL!r}")
    if self.whole_every < 1:
      raise ConfigurationError(f"tfc.PublishFormat.whole_every={self.whole_every} must be >= 1")
    if not 0 <= self.delta_max_fraction <= 1:
      raise ConfigurationError(
          f"tfc.PublishFormat.delta_max_fraction={self.delta_max_fraction} must be in [0, 1]")
    if not 0 <= self.row_tolerance < 1:
      raise ConfigurationError(
          f"tfc.PublishFormat.row_tolerance={self.row_tolerance} must be in [0, 1)")
    if self.row_tolerance and not self.row_deltas:
      raise ConfigurationError(f"tfc.PublishFormat.row_tolerance={self.row_tolerance} needs "
                               "row_deltas=True (it bounds the error of row deltas)")

  @property
  def lean(self) -> bool:
    return self.encoding != SAVED_MODEL


def save_bundle(directory: str, tensors: Dict[str, np.ndarray]) -> None:
  """Writes ``tensors`` as a TF tensor bundle ``<directory>/weights.*`` (through TF's
  filesystems, like any checkpoint)."""
  names = sorted(tensors)
  tf.raw_ops.SaveV2(prefix=os.path.join(directory, BUNDLE), tensor_names=names,
                    shape_and_slices=[""] * len(names), tensors=[tensors[n] for n in names])


class LeanWriter:
  """Writes one group's lean versions; remembers what it last published, the base of its next
  row delta (forgotten on restart: a new writer starts with a whole version)."""

  def __init__(self, publish_format: PublishFormat, names: Sequence[str],
               signature: Dict[str, Dict[str, tf.TensorSpec]]):
    if not publish_format.lean:
      raise ValueError(f"LeanWriter needs a lean encoding, not {publish_format.encoding!r}")
    self.format = publish_format
    self.names = list(names)
    self.signature = exchange.signature_to_json(signature)
    self.last_bytes = 0  # tensor bytes of the newest version written
    self._last: Optional[List[weight_codecs.Encoded]] = None
    self._last_id: Optional[str] = None
    self._last_step: Optional[int] = None
    self._deltas_since_whole = 0

  def _delta_now(self) -> bool:
    return (self.format.row_deltas and self._last is not None
            and self._deltas_since_whole + 1 < self.format.whole_every)

  def _rows_to_send(self, i: int, weight: np.ndarray, enc: weight_codecs.Encoded
                    ) -> Optional[np.ndarray]:
    """The rows of array ``i`` a delta stores, or None to store it whole."""
    assert self._last is not None  # a delta follows a version
    held = self._last[i]
    if self.format.row_tolerance and np.issubdtype(np.asarray(weight).dtype, np.floating):
      rows = weight_codecs.drifted_rows(weight, held, self.format.row_tolerance)
    else:
      rows = weight_codecs.changed_rows(enc, held)
    return None if len(rows) > self.format.delta_max_fraction * enc.num_rows else rows

  def _arrays(self, weights: Sequence[np.ndarray], encoded: Sequence[weight_codecs.Encoded],
              delta: bool) -> Tuple[Dict[str, np.ndarray], List[dict], list]:
    """The bundle's tensors, the marker's arrays, and what a reader holds once it applied them."""
    tensors, arrays, held = {}, [], []
    last = self._last or []
    for i, (weight, enc) in enumerate(zip(weights, encoded)):
      rows = self._rows_to_send(i, weight, enc) if delta else None
      part = enc if rows is None else enc.take(rows)
      held.append(enc if rows is None else last[i].with_rows(rows, enc))
      tensors[f"{i}/values"] = part.values
      if part.scales is not None:
        tensors[f"{i}/scales"] = weight_codecs.stored_scales(part.scales)
      if rows is not None:
        tensors[f"{i}/rows"] = weight_codecs.compact_indices(rows, enc.num_rows)
      arrays.append({"name": self.names[i], "shape": list(np.shape(weight)),
                     "dtype": np.asarray(weight).dtype.name,
                     "stored": "whole" if rows is None else "rows"})
    return tensors, arrays, held

  def publish(self, weights: Sequence[np.ndarray], exchange_dir: str, group: int, step: int, *,
              keep_last: int = 2) -> str:
    """Publishes ``weights`` (the model's, in ``model.weights`` order) as ``group_<group>/
    step_<step>``, whole or as a row delta against this writer's previous version."""
    if len(weights) != len(self.names):
      raise ValueError(f"{len(weights)} arrays for a model with {len(self.names)} weights")
    encoded = [weight_codecs.encode(w, self.format.encoding) for w in weights]
    delta = self._delta_now()
    tensors, arrays, held = self._arrays(weights, encoded, delta)
    version_id = uuid.uuid4().hex
    base = {"step": self._last_step, "id": self._last_id} if delta else None
    marker = {"format": {"kind": KIND, "encoding": self.format.encoding, "id": version_id,
                         "base": base, "arrays": arrays, "signature": self.signature}}
    path = exchange.write_version(exchange_dir, group, step,
                                  lambda tmp: save_bundle(tmp, tensors), marker,
                                  keep_last=keep_last)
    # Only a version that exists becomes the base of the next delta.
    self._last, self._last_id, self._last_step = held, version_id, int(step)
    self._deltas_since_whole = self._deltas_since_whole + 1 if delta else 0
    self.last_bytes = sum(t.nbytes for t in tensors.values())
    return path


def is_lean(marker: dict) -> bool:
  """Whether a version's marker describes a lean version (else it is a SavedModel)."""
  return isinstance(marker.get("format"), dict)


def _format(version: exchange.Version, marker: dict) -> dict:
  """The marker's ``format``, checked for the fields a reader relies on."""
  fmt: Any = marker.get("format")
  where = os.path.join(version.path, exchange.MARKER)
  try:
    ok = (fmt["kind"] == KIND and fmt["encoding"] in weight_codecs.ENCODINGS
          and isinstance(fmt["id"], str) and isinstance(fmt["arrays"], list)
          and all(a["stored"] in ("whole", "rows") and isinstance(a["shape"], list)
                  and isinstance(a["dtype"], str) for a in fmt["arrays"])
          and isinstance(fmt["signature"], dict)
          and (fmt["base"] is None or (isinstance(fmt["base"]["step"], int)
                                       and isinstance(fmt["base"]["id"], str))))
  except (KeyError, TypeError) as e:
    raise exchange.InvalidVersionError(f"{where}: malformed lean format ({e!r})") from e
  if not ok:
    raise exchange.InvalidVersionError(f"{where}: malformed lean format {fmt!r:.300}")
  return fmt


def _array(reader, version: exchange.Version, i: int, spec: dict,
           base: Optional[np.ndarray]) -> np.ndarray:
  """Array ``i`` of ``version``, rebuilt from the bundle (and ``base`` for stored rows)."""
  where = f"{version.path}: array {i} ({spec.get('name')})"
  shape = tuple(spec["shape"])
  num_rows, width = weight_codecs.rows_shape(shape)
  values = reader.get_tensor(f"{i}/values")
  scales = reader.get_tensor(f"{i}/scales") if reader.has_tensor(f"{i}/scales") else None
  rows = reader.get_tensor(f"{i}/rows") if spec["stored"] == "rows" else None
  count = num_rows if rows is None else len(rows)
  if values.shape != (count, width) or (
      scales is not None and (scales.shape != (count,) or values.dtype != np.int8)):
    raise exchange.InvalidVersionError(f"{where}: stored {values.dtype}{values.shape} does not "
                                       f"fit shape {list(shape)}")
  decoded = weight_codecs.decode(weight_codecs.Encoded(values, scales), np.dtype(spec["dtype"]))
  if rows is None:
    return decoded.reshape(shape)
  if base is None or base.shape != shape:
    raise exchange.InvalidVersionError(f"{where}: a row delta without a base array of its shape")
  if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer) or (
      len(rows) and (rows.min() < 0 or rows.max() >= num_rows)):
    raise exchange.InvalidVersionError(f"{where}: row indices out of [0, {num_rows})")
  out = np.array(base, copy=True)
  weight_codecs.as_rows(out)[rows] = decoded
  return out


class LeanReader:
  """Rebuilds one peer's lean versions, holding the arrays of the version last committed."""

  def __init__(self):
    self.held_id: Optional[str] = None
    self.held: Optional[List[np.ndarray]] = None

  def _chain(self, exchange_dir: str, version: exchange.Version, marker: dict
             ) -> List[Tuple[exchange.Version, dict]]:
    """``version`` and the versions it builds on, newest first, down to a whole one or to the
    one this reader holds."""
    chain = [(version, _format(version, marker))]
    while len(chain) < _MAX_CHAIN:
      current, fmt = chain[-1]
      base = fmt["base"]
      if base is None or base["id"] == self.held_id:
        return chain
      step = base["step"]
      older = exchange.Version(current.group, step,
                               exchange.version_dir(exchange_dir, current.group, step))
      if step >= current.step:
        raise exchange.InvalidVersionError(f"{current.path}: a row delta on step {step}, not older")
      try:
        exchange.check_contained(exchange_dir, older)
        older_fmt = _format(older, exchange.verify(older))
      except exchange.InvalidVersionError as e:
        raise exchange.InvalidVersionError(
            f"{version.path}: a row delta built on step {step}, which this reader does not hold "
            f"and cannot read ({e})") from e
      if older_fmt["id"] != base["id"]:
        raise exchange.InvalidVersionError(
            f"{current.path}: its base step {step} in the directory is another version (id "
            f"{older_fmt['id']}, not {base['id']}): the peer published that step again")
      chain.append((older, older_fmt))
    raise exchange.InvalidVersionError(f"{version.path}: a chain of over {_MAX_CHAIN} deltas")

  def read(self, exchange_dir: str, version: exchange.Version, marker: dict,
           expected_signature, shapes: Sequence[Sequence[int]]) -> Tuple[str, List[np.ndarray]]:
    """(id, arrays) of ``version`` (whose verified marker is ``marker``), rebuilt whole; commits
    nothing. Raises InvalidVersionError (or tf.errors.OpError from a corrupt bundle)."""
    chain = self._chain(exchange_dir, version, marker)
    fmt = chain[0][1]
    exchange.check_signature(version.path, expected_signature,
                             exchange.signature_from_json(fmt["signature"], version.path))
    got = [tuple(a["shape"]) for a in fmt["arrays"]]
    if got != [tuple(s) for s in shapes]:
      raise exchange.InvalidVersionError(
          f"{version.path}: its arrays {got} do not match the teacher's weights "
          f"{[tuple(s) for s in shapes]}")
    arrays = self.held if chain[-1][1]["base"] is not None else None
    for older, older_fmt in reversed(chain):
      if len(older_fmt["arrays"]) != len(fmt["arrays"]):
        raise exchange.InvalidVersionError(f"{older.path}: {len(older_fmt['arrays'])} arrays, "
                                           f"not {len(fmt['arrays'])}")
      reader = tf.train.load_checkpoint(os.path.join(older.path, BUNDLE))
      arrays = [_array(reader, older, i, spec, None if arrays is None else arrays[i])
                for i, spec in enumerate(older_fmt["arrays"])]
    assert arrays is not None  # the chain holds this version at least
    return fmt["id"], arrays

  def commit(self, version_id: str, arrays: List[np.ndarray]) -> None:
    """Remembers ``arrays`` (a version now in use) as the base for the peer's next deltas."""
    self.held_id, self.held = version_id, arrays
