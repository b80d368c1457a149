"""The exchange directory: groups publish SavedModels of their model; peers find complete ones.

Layout (a public interface; see docs/design.md)::

    exchange_dir/
      group_<i>/
        step_<n>/               one SavedModel per published step (saved_model.pb, variables/)
          COMPLETE              JSON marker written last: group, step, time, file sizes
        .tmp-step_<n>-<uuid>/   a version being written; never read

A *lean* version (``lean_versions``: weights in bfloat16 or int8, or only the rows changed since
the group's previous version) holds ``weights.index`` + ``weights.data-*`` (a TF tensor bundle)
instead of a SavedModel; its marker's ``format`` says how to read it and, for a row delta, which
version (``base``: step and id) it applies to. Garbage collection keeps every version from the
newest whole one on, so a reader can always rebuild the newest version.

A version is written under a temporary name, renamed to ``step_<n>`` and only then gets its
``COMPLETE`` marker (itself written to a temporary name and renamed), so on filesystems whose
directory rename is not atomic (object stores) a reader still never sees a marker before the files.
Readers accept a version only if the marker exists and every file it lists has the listed size.
On a local filesystem they also refuse a version that holds a symbolic link or resolves outside
the exchange directory (``check_contained``): peers' files are only read from the configured path.
A publish that fails (disk full, permission denied) removes what it wrote and leaves the previous
versions as they were. All I/O goes through ``tf.io.gfile``, so local paths, ``gs://`` and
``s3://`` work alike.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
import uuid
from typing import Callable, Dict, List, Optional, Tuple, Union

import tensorflow as tf
import tf_keras as keras
from absl import logging
from tensorflow.core.protobuf import saved_model_pb2

from tf_codistill.errors import ConfigurationError

MARKER = "COMPLETE"
SIGNATURE_KEY = "serving_default"
OUTPUT_KEY = "logits"
_VERSION_RE = re.compile(r"^step_(\d+)$")
_TMP_PREFIX = ".tmp-"


class InvalidVersionError(Exception):
  """A published version that must not be loaded (partial, corrupt, or mismatched)."""


@dataclasses.dataclass(frozen=True)
class Version:
  """One complete published model of one group."""
  group: int
  step: int
  path: str


class ProbeForward:
  """Whether models predict finite values on a probe batch of real inputs (None: no probe).

  A version must pass this to be published or taught from. Each model's forward pass runs as its
  own tf.function, never eagerly: TF's eager kernel cache hands one oneDNN kernel to every thread
  running the same op, and the publisher's and the teacher pool's threads running one
  architecture at once corrupt the heap (a ResNet's Conv2D under TF 2.17 aborts within a second;
  tests/tf_codistill/exchange/test_directory.py).
  """

  def __init__(self, batch=None):
    self.batch = batch
    self._forward: Dict[int, tuple] = {}  # id(model) -> (model, its tf.function)
    self._lock = threading.Lock()

  def finite(self, model: keras.Model) -> bool:
    """True without a probe batch, else whether every prediction of ``model`` on it is finite."""
    if self.batch is None:
      return True
    with self._lock:
      if id(model) not in self._forward:
        self._forward[id(model)] = (model, tf.function(lambda x: model(x, training=False)))
      forward = self._forward[id(model)][1]
    predictions = tf.nest.flatten(forward(self.batch))
    return all(bool(tf.reduce_all(tf.math.is_finite(t))) for t in predictions)


def group_dir(exchange_dir: str, group: int) -> str:
  return os.path.join(exchange_dir, f"group_{group}")


def version_dir(exchange_dir: str, group: int, step: int) -> str:
  return os.path.join(group_dir(exchange_dir, group), f"step_{step}")


def _list_files(root: str) -> Dict[str, int]:
  sizes = {}
  for dirpath, _, filenames in tf.io.gfile.walk(root):
    for name in filenames:
      path = os.path.join(dirpath, name)
      sizes[os.path.relpath(path, root)] = tf.io.gfile.stat(path).length
  return sizes


def write_atomically(path: str, data: Union[str, bytes]) -> None:
  """Writes ``data`` to ``path`` through tf.io.gfile via a temporary file and a rename, so a
  reader sees the old file or the whole new one, never a part."""
  tmp = f"{path}{_TMP_PREFIX}{uuid.uuid4().hex}"
  with tf.io.gfile.GFile(tmp, "wb" if isinstance(data, bytes) else "w") as f:
    f.write(data)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def serving_function(model: keras.Model, input_spec) -> tf.types.experimental.ConcreteFunction:
  """The ``serving_default`` signature: batched ``input_spec`` -> ``{'logits': model(x)}``."""

  @tf.function(input_signature=[named_input_spec(input_spec)])
  def serve(inputs):
    return {OUTPUT_KEY: model(inputs, training=False)}

  return serve.get_concrete_function()


def remove_quietly(path: str) -> None:
  """Best-effort removal of a directory or file (a partly written one, an old round's)."""
  try:
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)
    elif tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)
  except (tf.errors.OpError, OSError) as e:
    logging.warning("exchange: could not remove %s: %s", path, e)


def save_model(model: keras.Model, path: str, input_spec,
               signatures: Optional[Dict[str, tf.types.experimental.ConcreteFunction]] = None
               ) -> None:
  """Writes ``model`` as a SavedModel with a serving signature (and ``signatures`` besides, e.g.
  serving.raw_signatures), atomically (temp dir + rename).

  If writing fails (disk full, permission denied), the temporary directory is removed and an
  existing ``path`` is left as it was.
  """
  _write_directory(path, lambda tmp: _save(model, tmp, input_spec, signatures))


def _write_directory(path: str, write: Callable[[str], None]) -> None:
  """``write(tmp)`` fills a temporary sibling of ``path``, which then replaces ``path`` by a
  rename; on failure the temporary directory is removed and ``path`` left as it was."""
  parent = os.path.dirname(path.rstrip("/"))
  tf.io.gfile.makedirs(parent)
  tmp = os.path.join(parent, f"{_TMP_PREFIX}{os.path.basename(path)}-{uuid.uuid4().hex}")
  try:
    write(tmp)
  except BaseException:
    remove_quietly(tmp)
    raise
  if tf.io.gfile.exists(path):
    tf.io.gfile.rmtree(path)
  tf.io.gfile.rename(tmp, path)


def _save(model: keras.Model, path: str, input_spec,
          signatures: Optional[Dict[str, tf.types.experimental.ConcreteFunction]] = None) -> None:
  model.save(path, save_format="tf", include_optimizer=False, save_traces=False,
             signatures={SIGNATURE_KEY: serving_function(model, input_spec), **(signatures or {})})


def publish(model: keras.Model, exchange_dir: str, group: int, step: int, input_spec, *,
            keep_last: int = 2) -> str:
  """Publishes ``model`` as ``group_<group>/step_<step>`` and garbage-collects old versions."""
  return write_version(exchange_dir, group, step,
                       lambda tmp: _save(model, tmp, input_spec), {}, keep_last=keep_last)


def write_version(exchange_dir: str, group: int, step: int, write: Callable[[str], None],
                  marker: dict, *, keep_last: int = 2) -> str:
  """Publishes ``group_<group>/step_<step>``: ``write(tmp_dir)`` fills a temporary directory,
  which is renamed into place and then gets its COMPLETE marker (``marker`` plus group, step,
  time and file sizes); old versions are then garbage-collected. On failure nothing is left."""
  if keep_last < 1:
    raise ValueError(f"keep_last={keep_last} must be >= 1")
  final = version_dir(exchange_dir, group, step)
  # Leftovers of an interrupted or failed publish hold space a full disk needs back.
  _remove_stale_tmp(exchange_dir, group)
  write_complete(final, write, dict(marker, group=group, step=int(step)))
  collect_garbage(exchange_dir, group, keep_last)
  return final


def write_complete(final: str, write: Callable[[str], None], marker: dict) -> None:
  """``write(tmp_dir)`` fills a temporary sibling of ``final``, renamed into place, which then
  gets its COMPLETE marker (``marker`` plus time and file sizes); on failure nothing is left."""
  _write_directory(final, write)
  _write_marker(final, dict(marker, time=time.time()))


def _write_marker(final: str, marker: dict) -> None:
  """Writes ``final``'s COMPLETE marker last; if that fails, removes the markerless version."""
  try:
    marker = dict(marker, files=_list_files(final))
    write_atomically(os.path.join(final, MARKER), json.dumps(marker, sort_keys=True))
  except BaseException:
    remove_quietly(final)
    raise


def _remove_stale_tmp(exchange_dir: str, group: int) -> None:
  remove_stale_tmp(group_dir(exchange_dir, group))


def remove_stale_tmp(root: str) -> None:
  """Removes what interrupted writes under ``root`` left (call only as ``root``'s one writer)."""
  if not tf.io.gfile.isdir(root):
    return
  for name in tf.io.gfile.listdir(root):
    if name.rstrip("/").startswith(_TMP_PREFIX):
      remove_quietly(os.path.join(root, name.rstrip("/")))


def publish_saved_model(saved_model_path: str, exchange_dir: str, group: int, step: int, *,
                        keep_last: int = 2) -> str:
  """Publishes an existing SavedModel (e.g. a trained model's export) as
  ``group_<group>/step_<step>``.

  Peers distill from it like from any published version: a frozen teacher for two-phase
  (offline) distillation is a "group" that published once.
  """
  def copy(tmp: str) -> None:
    for dirpath, _, filenames in tf.io.gfile.walk(saved_model_path):
      target = os.path.join(tmp, os.path.relpath(dirpath, saved_model_path))
      tf.io.gfile.makedirs(target)
      for name in filenames:
        if name != MARKER:
          tf.io.gfile.copy(os.path.join(dirpath, name), os.path.join(target, name),
                           overwrite=True)

  return write_version(exchange_dir, group, step, copy, {"source": saved_model_path},
                       keep_last=keep_last)


def collect_garbage(exchange_dir: str, group: int, keep_last: int) -> None:
  """Deletes all but the newest ``keep_last`` complete versions, leftover temporary dirs and
  versions older than the newest complete one that never got their marker.

  Versions from the newest whole (not row-delta) one on are kept too. Only the group's own
  (single) publisher calls this, so any temporary dir found is a leftover of an interrupted
  publish.
  """
  root = group_dir(exchange_dir, group)
  complete = list_versions(exchange_dir, group)
  keep = {v.path for v in complete[:keep_last]}
  # Row deltas need their chain: keep every version from the newest whole one on.
  for version in complete:
    keep.add(version.path)
    if delta_base(version) is None:
      break
  marked = {v.path for v in complete}
  for name in tf.io.gfile.listdir(root):
    name = name.rstrip("/")
    path = os.path.join(root, name)
    stale_tmp = name.startswith(_TMP_PREFIX)
    match = _VERSION_RE.match(name)
    old_version = match and path in marked and path not in keep
    # A version older than the newest complete one that never got its marker (its publisher
    # died between the rename and the marker): no reader takes it, nothing else removes it.
    unmarked = (match and path not in marked and complete
                and int(match.group(1)) < complete[0].step)
    if stale_tmp or old_version or unmarked:
      try:
        tf.io.gfile.rmtree(path)
      except tf.errors.OpError as e:  # Another cleaner got there first; harmless.
        logging.warning("exchange: could not delete %s: %s", path, e)


def list_versions(exchange_dir: str, group: int) -> List[Version]:
  """Published versions of ``group`` that carry a completeness marker, newest first."""
  return [Version(group, step, path) for step, path in complete_steps(group_dir(exchange_dir,
                                                                               group))]


def complete_steps(root: str) -> List[Tuple[int, str]]:
  """(step, path) of every ``root/step_<n>`` that carries a completeness marker, newest first."""
  if not tf.io.gfile.isdir(root):
    return []
  steps = []
  for name in tf.io.gfile.listdir(root):
    match = _VERSION_RE.match(name.rstrip("/"))
    path = os.path.join(root, name.rstrip("/"))
    if match and tf.io.gfile.exists(os.path.join(path, MARKER)):
      steps.append((int(match.group(1)), path))
  return sorted(steps, reverse=True)


def read_marker(version: Version) -> dict:
  """The version's COMPLETE marker (a JSON object); InvalidVersionError if unreadable."""
  marker_path = os.path.join(version.path, MARKER)
  try:
    with tf.io.gfile.GFile(marker_path, "r") as f:
      marker = json.loads(f.read())
  except (tf.errors.OpError, ValueError) as e:
    raise InvalidVersionError(f"{marker_path}: unreadable completeness marker ({e})") from e
  if not isinstance(marker, dict):
    raise InvalidVersionError(f"{marker_path}: the marker is not a JSON object")
  return marker


def delta_base(version: Version) -> Optional[dict]:
  """The ``base`` (``{'step', 'id'}``) a row-delta version applies to; None for a whole version
  or an unreadable marker (garbage collection then treats it as whole)."""
  try:
    base = (read_marker(version).get("format") or {}).get("base")
  except (InvalidVersionError, AttributeError):
    return None
  return base if isinstance(base, dict) else None


def verify(version: Version) -> dict:
  """Checks the marker and that every listed file exists with its size; returns the marker."""
  marker_path = os.path.join(version.path, MARKER)
  marker = read_marker(version)
  files = marker.get("files")
  if marker.get("step") != version.step:
    raise InvalidVersionError(f"{marker_path}: marker says step {marker.get('step')}, "
                              f"directory says {version.step}")
  if not isinstance(files, dict):
    raise InvalidVersionError(f"{marker_path}: 'files' is not a mapping of paths to sizes")
  for rel, size in files.items():
    parts = str(rel).replace("\\", "/").split("/")
    if os.path.isabs(str(rel)) or "://" in str(rel) or ".." in parts:
      raise InvalidVersionError(f"{marker_path}: lists {rel!r}, a path outside the version")
    path = os.path.join(version.path, rel)
    try:
      actual = tf.io.gfile.stat(path).length
    except tf.errors.NotFoundError as e:
      raise InvalidVersionError(f"{path}: listed in the marker but missing") from e
    if actual != size:
      raise InvalidVersionError(f"{path}: size {actual} != {size} in the marker (corrupt)")
  return marker


def check_contained(exchange_dir: str, version: Version) -> None:
  """Raises InvalidVersionError if ``version`` holds a symbolic link or resolves outside
  ``exchange_dir`` (local paths; object stores have no links).

  A publisher never writes links, so a link there was put by someone else: reading through it
  would load files from wherever it points.
  """
  if "://" in exchange_dir:
    return
  root = os.path.realpath(exchange_dir)
  real = os.path.realpath(version.path)
  if os.path.commonpath([root, real]) != root:
    raise InvalidVersionError(f"{version.path}: resolves to {real}, outside the exchange "
                              f"directory {root}; links out of it are not followed")
  if os.path.islink(version.path):
    raise InvalidVersionError(f"{version.path}: a symbolic link (to {os.readlink(version.path)}); "
                              "published versions are real directories")
  for dirpath, dirnames, filenames in os.walk(version.path, followlinks=False):
    for name in dirnames + filenames:
      path = os.path.join(dirpath, name)
      if os.path.islink(path):
        raise InvalidVersionError(f"{path}: a symbolic link (to {os.readlink(path)}); links in "
                                  "the exchange directory are not followed")


def check_writable(directory: str, setting: str) -> None:
  """Creates ``directory`` if needed and writes and deletes a probe file in it.

  Raises:
    ConfigurationError: that is not possible, naming ``setting`` (the flag or field that gave
      the directory) and the reason.
  """
  try:
    tf.io.gfile.makedirs(directory)
    probe = os.path.join(directory, f"{_TMP_PREFIX}probe-{uuid.uuid4().hex}")
    with tf.io.gfile.GFile(probe, "w") as f:
      f.write("probe")
    tf.io.gfile.remove(probe)
  except (tf.errors.OpError, OSError) as e:
    reason = getattr(e, "message", None) or getattr(e, "strerror", None) or str(e)
    raise ConfigurationError(f"{setting}: cannot write to {directory} ({reason}): make it "
                             "writable by this job or pass another directory") from None


def read_signature(path: str) -> Dict[str, Dict[str, tf.TensorSpec]]:
  """Reads the serving signature's input/output specs from saved_model.pb without loading it."""
  pb_path = os.path.join(path, "saved_model.pb")
  proto = saved_model_pb2.SavedModel()
  try:
    with tf.io.gfile.GFile(pb_path, "rb") as f:
      proto.ParseFromString(f.read())
    signature = proto.meta_graphs[0].signature_def[SIGNATURE_KEY]
  except Exception as e:  # Any parse failure means the file is not a usable SavedModel.
    raise InvalidVersionError(f"{pb_path}: no readable '{SIGNATURE_KEY}' signature ({e})") from e

  def specs(infos) -> Dict[str, tf.TensorSpec]:
    return {
        name: tf.TensorSpec([None if d.size < 0 else d.size for d in info.tensor_shape.dim],
                            tf.dtypes.as_dtype(info.dtype), name)
        for name, info in infos.items()
    }

  return {"inputs": specs(signature.inputs), "outputs": specs(signature.outputs)}


def named_input_spec(input_spec):
  """Batched input spec with names set (a TensorSpec, or a dict of them named by their keys)."""
  if isinstance(input_spec, tf.TensorSpec):
    return tf.TensorSpec([None] + input_spec.shape.as_list()[1:], input_spec.dtype, "inputs")
  if (isinstance(input_spec, dict)
      and all(isinstance(s, tf.TensorSpec) for s in input_spec.values())):
    return {k: tf.TensorSpec([None] + s.shape.as_list()[1:], s.dtype, k)
            for k, s in input_spec.items()}
  raise TypeError(f"model inputs must be a tf.TensorSpec or a dict of them, got {input_spec!r}")


def expected_signature(input_spec, output_shape) -> Dict[str, Dict[str, tf.TensorSpec]]:
  """The signature a compatible peer must have, from the student's input spec and output shape."""
  named = named_input_spec(input_spec)
  inputs = {s.name: s for s in tf.nest.flatten(named)}
  outputs = {OUTPUT_KEY: tf.TensorSpec([None] + list(output_shape)[1:], tf.float32, OUTPUT_KEY)}
  return {"inputs": inputs, "outputs": outputs}


def signature_to_json(signature: Dict[str, Dict[str, tf.TensorSpec]]) -> dict:
  """A signature (``expected_signature``'s form) as JSON: name -> [dtype, shape]."""
  return {part: {name: [spec.dtype.name, spec.shape.as_list()] for name, spec in specs.items()}
          for part, specs in signature.items()}


def signature_from_json(value, where: str) -> Dict[str, Dict[str, tf.TensorSpec]]:
  """The inverse of ``signature_to_json``; InvalidVersionError naming ``where`` if malformed."""
  try:
    return {part: {name: tf.TensorSpec(shape, tf.dtypes.as_dtype(dtype), name)
                   for name, (dtype, shape) in value[part].items()}
            for part in ("inputs", "outputs")}
  except (KeyError, TypeError, ValueError) as e:
    raise InvalidVersionError(f"{where}: malformed signature in the marker ({e!r})") from e


def check_signature(path: str, expected: Dict[str, Dict[str, tf.TensorSpec]],
                    actual: Optional[Dict[str, Dict[str, tf.TensorSpec]]] = None) -> None:
  """Raises InvalidVersionError unless the version's signature (read from its SavedModel
  unless given) matches ``expected``."""
  actual = read_signature(path) if actual is None else actual
  for part in ("inputs", "outputs"):
    want, got = expected[part], actual[part]
    if set(want) != set(got):
      raise InvalidVersionError(
          f"{path}: signature {part} {sorted(got)} != expected {sorted(want)}")
    for name, spec in want.items():
      other = got[name]
      if spec.dtype != other.dtype or spec.shape.as_list() != other.shape.as_list():
        raise InvalidVersionError(
            f"{path}: signature {part[:-1]} '{name}' is {other.dtype.name}{other.shape} but the "
            f"student expects {spec.dtype.name}{spec.shape}")


def newest_step(exchange_dir: str, group: int) -> Optional[int]:
  versions = list_versions(exchange_dir, group)
  return versions[0].step if versions else None
