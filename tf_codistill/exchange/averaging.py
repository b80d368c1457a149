"""``ParameterAveraging`` (DiLoCo, local SGD across groups) and its rounds on the exchange.

Every ``every_steps`` optimizer steps (H) each group's chief publishes its *outer change* (the
anchor minus its local parameters, in float32, bfloat16 or int8: ``weight_codecs``); one decision
per round fixes which groups' changes count; every training process of every group reads exactly
those changes, averages them in order and takes the same outer step (``optim.outer``), so all
groups hold the same bits afterwards. Layout (under the exchange directory)::

    averaging/
      group_<g>/step_<r>/         group g's change for round r: weights.index, weights.data-*
                                  ("<i>/values", "<i>/scales" for int8) and COMPLETE (round,
                                  group, encoding, anchor_digest, arrays, bytes)
      decisions/round_<r>.json    the decision: members, excluded {group: reason}, failed
      shared/step_<r>/            the parameters (and outer momentum) after round r, written by
                                  the round's decider; step_0 is the start every group takes

A change is written like a published version (temporary directory, rename, marker last) and never
rewritten. A reader refuses, naming the peer and round, a change with a wrong round, computed from
another anchor, of other shapes, with NaN/Inf values, or whose files are incomplete or links;
a refused change counts as missing. With ``on_missing='continue'`` any chief decides once every
peer's change is valid, or ``peer_timeout_s`` after it arrived with the valid ones, by creating the
decision file exclusively (a hard link, atomic on POSIX filesystems, so exactly one decision
exists); with ``'fail'`` only ``seed_group`` decides, and only with every group.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from typing import Dict, List, Optional, Sequence, Tuple

import gin
import numpy as np
import tensorflow as tf

from tf_codistill.errors import ConfigurationError
from tf_codistill.exchange import directory
from tf_codistill.exchange import lean_versions
from tf_codistill.exchange import weight_codecs
from tf_codistill.optim import outer

ROOT = "averaging"
KIND = "outer_change"
BUNDLE = lean_versions.BUNDLE  # the same TF tensor bundle as a lean version's
POLICIES = ("continue", "fail")


class AveragingError(RuntimeError):
  """A round that cannot be applied (fewer than ``min_groups`` valid changes, a peer missing
  under ``on_missing='fail'``, non-finite results, no way to catch up); nothing of it was
  applied."""


class RejectedChange(Exception):
  """A peer's change for a round that must not be averaged; the message names peer and round."""


@gin.configurable(module="tfc")
@dataclasses.dataclass(frozen=True)
class ParameterAveraging:
  """Parameter averaging between groups every ``every_steps`` steps: DiLoCo or local SGD.

  Attributes:
    every_steps: H, the optimizer steps of each group between two rounds.
    outer_optimizer: ``nesterov`` (DiLoCo), ``momentum`` or ``average`` (local SGD: the mean of
      the groups' parameters); optim/outer.py.
    outer_learning_rate, outer_momentum: of ``nesterov`` and ``momentum`` (default DiLoCo's:
      0.7, 0.9); ``average`` has none (1.0 and 0.0, and refuses others).
    encoding: how changes are stored: ``float32``, ``bfloat16`` or ``int8`` (per-row scales).
    peer_timeout_s: how long a round waits for a peer's change before it goes on without it
      (``on_missing='continue'``) or fails (``'fail'``).
    on_missing: ``continue`` (average the changes that arrived, renormalised; needs a local or
      other POSIX exchange directory) or ``fail`` (AveragingError; the launcher restarts).
    min_groups: fewest groups a round may average; fewer fail the round.
    keep_rounds: rounds of changes, decisions and shared states kept in the directory.
    seed_group: the group whose initial parameters every group starts from, and that decides
      under ``on_missing='fail'``.
    poll_interval_s: how often a process waiting at a round looks at the directory.
  """
  every_steps: int = 500
  outer_optimizer: str = "nesterov"
  outer_learning_rate: Optional[float] = None
  outer_momentum: Optional[float] = None
  encoding: str = "float32"
  peer_timeout_s: float = 600.0
  on_missing: str = "continue"
  min_groups: int = 1
  keep_rounds: int = 4
  seed_group: int = 0
  poll_interval_s: float = 0.05

  def __post_init__(self):
    for name in ("every_steps", "min_groups", "keep_rounds"):
      if getattr(self, name) < 1:
        raise ConfigurationError(f"tfc.ParameterAveraging.{name}={getattr(self, name)} must be "
                                 ">= 1")
    choices = (("outer_optimizer", outer.KINDS), ("encoding", weight_codecs.ENCODINGS),
               ("on_missing", POLICIES))
    for name, allowed in choices:
      if getattr(self, name) not in allowed:
        raise ConfigurationError(f"tfc.ParameterAveraging.{name}={getattr(self, name)!r} is not "
                                 f"one of {list(allowed)}")
    self._resolve_outer_step()
    for name in ("peer_timeout_s", "poll_interval_s", "outer_learning_rate"):
      if not 0 < getattr(self, name) < float("inf"):
        raise ConfigurationError(f"tfc.ParameterAveraging.{name}={getattr(self, name)} must be "
                                 "> 0 and finite")
    if not 0 <= self.outer_momentum < 1:
      raise ConfigurationError(f"tfc.ParameterAveraging.outer_momentum={self.outer_momentum} must "
                               "be in [0, 1)")

  def _resolve_outer_step(self) -> None:
    """Fills the outer learning rate and momentum left unset with the outer optimizer's own."""
    defaults = (1.0, 0.0) if self.outer_optimizer == "average" else (0.7, 0.9)
    names = ("outer_learning_rate", "outer_momentum")
    for name, default in zip(names, defaults):
      if getattr(self, name) is None:
        object.__setattr__(self, name, default)
    given = (self.outer_learning_rate, self.outer_momentum)
    if self.outer_optimizer == "average" and given != defaults:
      raise ConfigurationError(
          f"tfc.ParameterAveraging.outer_optimizer='average' replaces the parameters by the "
          f"groups' mean: it takes no outer_learning_rate/outer_momentum (given {given}); use "
          "'momentum' or 'nesterov' for an outer step")

  @classmethod
  def diloco(cls, every_steps: int = 500, **kwargs) -> "ParameterAveraging":
    """DiLoCo's outer step: Nesterov momentum 0.9, learning rate 0.7."""
    return cls(every_steps, "nesterov", 0.7, 0.9, **kwargs)

  @classmethod
  def local_sgd(cls, every_steps: int = 500, **kwargs) -> "ParameterAveraging":
    """Local SGD / federated averaging: the groups' parameters replaced by their mean."""
    return cls(every_steps, "average", 1.0, 0.0, **kwargs)

  def check_job(self, directory_path: str, num_groups: int) -> None:
    """Raises ConfigurationError if this averaging cannot run for ``num_groups`` groups
    sharing ``directory_path``."""
    if num_groups < 2:
      raise ConfigurationError(f"tfc.ParameterAveraging needs >= 2 groups, not {num_groups}")
    if not 0 <= self.seed_group < num_groups:
      raise ConfigurationError(f"tfc.ParameterAveraging.seed_group={self.seed_group} is not a "
                               f"group of range({num_groups})")
    if self.min_groups > num_groups:
      raise ConfigurationError(f"tfc.ParameterAveraging.min_groups={self.min_groups} is more "
                               f"than the {num_groups} groups")
    if self.on_missing == "continue" and "://" in directory_path:
      raise ConfigurationError(
          f"tfc.ParameterAveraging.on_missing='continue' needs a POSIX exchange directory (its "
          f"decisions are created exclusively); {directory_path} is not one: use 'fail'")

  def optimizer(self) -> outer.OuterOptimizer:
    assert self.outer_learning_rate is not None and self.outer_momentum is not None  # resolved
    return outer.OuterOptimizer(self.outer_optimizer, self.outer_learning_rate,
                                self.outer_momentum)


@dataclasses.dataclass(frozen=True)
class Decision:
  """Which groups' changes round ``round`` averages (``members``, ascending), who was left out
  and why, and whether the round failed (fewer than ``min_groups`` members)."""
  round: int
  members: Tuple[int, ...]
  excluded: Dict[int, str]
  decided_by: int
  failed: bool = False

  def to_json(self) -> str:
    return json.dumps({"round": self.round, "members": list(self.members),
                       "excluded": {str(g): why for g, why in self.excluded.items()},
                       "decided_by": self.decided_by, "failed": self.failed, "time": time.time()},
                      sort_keys=True)

  @classmethod
  def from_json(cls, text: str, where: str) -> "Decision":
    try:
      value = json.loads(text)
      return cls(int(value["round"]), tuple(int(g) for g in value["members"]),
                 {int(g): str(why) for g, why in value["excluded"].items()},
                 int(value["decided_by"]), bool(value["failed"]))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise AveragingError(f"{where}: malformed decision ({e})") from None

  def check(self, round_: int, num_groups: int, where: str) -> None:
    """Raises AveragingError unless this is a decision of round ``round_`` among ``num_groups``
    groups: members ascending, distinct, groups of the job, and some unless the round failed."""
    members = list(self.members)
    if self.round != round_:
      raise AveragingError(f"{where}: a decision of round {self.round} in round {round_}'s file")
    if (members != sorted(set(members)) or not set(members) <= set(range(num_groups))
            or not (members or self.failed)):
      raise AveragingError(f"{where}: malformed decision (members {members} are not distinct "
                           f"ascending groups of range({num_groups}))")


@dataclasses.dataclass(frozen=True)
class SharedState:
  """The parameters every group holds after round ``round``, and the outer momentum."""
  round: int
  parameters: List[np.ndarray]
  momentum: Optional[List[np.ndarray]]
  digest: str


def root(exchange_dir: str) -> str:
  return os.path.join(exchange_dir, ROOT)


def change_dir(exchange_dir: str, group: int, round_: int) -> str:
  return directory.version_dir(root(exchange_dir), group, round_)


def decision_path(exchange_dir: str, round_: int) -> str:
  return os.path.join(root(exchange_dir), "decisions", f"round_{round_}.json")


def shared_dir(exchange_dir: str) -> str:
  return os.path.join(root(exchange_dir), "shared")


def _encoded_tensors(arrays: Sequence[np.ndarray], encoding: str) -> Dict[str, np.ndarray]:
  tensors = {}
  for i, array in enumerate(arrays):
    encoded = weight_codecs.encode(np.asarray(array, np.float32), encoding)
    tensors[f"{i}/values"] = encoded.values
    if encoded.scales is not None:
      tensors[f"{i}/scales"] = weight_codecs.stored_scales(encoded.scales)
  return tensors


def has_change(exchange_dir: str, group: int, round_: int) -> bool:
  return tf.io.gfile.exists(os.path.join(change_dir(exchange_dir, group, round_),
                                         directory.MARKER))


def write_change(exchange_dir: str, group: int, round_: int, change: Sequence[np.ndarray],
                 encoding: str, anchor_digest: str, keep_rounds: int) -> int:
  """Publishes group ``group``'s change for round ``round_`` (once: a change already there, from
  before a restart, is kept as it is); returns the bytes of its tensors."""
  tensors = _encoded_tensors(change, encoding)
  nbytes = int(sum(t.nbytes for t in tensors.values()))
  if has_change(exchange_dir, group, round_):
    return nbytes
  marker = {"format": {"kind": KIND, "encoding": encoding,
                       "arrays": [{"shape": list(np.shape(a))} for a in change]},
            "round": round_, "anchor_digest": anchor_digest, "bytes": nbytes}
  directory.write_version(root(exchange_dir), group, round_,
                          lambda tmp: lean_versions.save_bundle(tmp, tensors), marker,
                          keep_last=keep_rounds)
  return nbytes


def read_change(exchange_dir: str, group: int, round_: int, shapes: Sequence[Tuple[int, ...]],
                anchor_digest: str) -> Tuple[List[np.ndarray], int]:
  """Group ``group``'s change for round ``round_``, decoded to float32, and its tensor bytes.

  Raises:
    RejectedChange: the change is not there, incomplete, a link, of another round or anchor,
      of other shapes, or not finite; the message names the group and round.
  """
  where = f"group {group}'s change for round {round_}"
  path = change_dir(exchange_dir, group, round_)
  version = directory.Version(group, round_, path)
  try:
    directory.check_contained(exchange_dir, version)
    marker = directory.verify(version)
  except directory.InvalidVersionError as e:
    raise RejectedChange(f"{where} is rejected: {e}") from None
  _check_marker(marker, where, round_, anchor_digest, shapes)
  try:
    reader = tf.train.load_checkpoint(os.path.join(path, BUNDLE))
    arrays = [_decoded(reader, i, shape, where) for i, shape in enumerate(shapes)]
  except (tf.errors.OpError, ValueError) as e:
    raise RejectedChange(f"{where} is rejected: unreadable ({e})") from None
  if not outer.all_finite(arrays):
    raise RejectedChange(f"{where} is rejected: it holds NaN or Inf values")
  return arrays, int(marker.get("bytes", 0))


def _check_marker(marker: dict, where: str, round_: int, anchor_digest: str,
                  shapes: Sequence[Tuple[int, ...]]) -> None:
  fmt = marker.get("format") or {}
  if not isinstance(fmt, dict) or fmt.get("kind") != KIND:
    raise RejectedChange(f"{where} is rejected: not an outer change ({fmt!r:.200})")
  if marker.get("round") != round_:
    raise RejectedChange(f"{where} is rejected: its marker says round {marker.get('round')} (a "
                         "change from another round)")
  if marker.get("anchor_digest") != anchor_digest:
    raise RejectedChange(f"{where} is rejected: computed from other parameters (anchor digest "
                         f"{marker.get('anchor_digest')}, here {anchor_digest})")
  stored = [tuple(a.get("shape", ())) for a in fmt.get("arrays", [])]
  if stored != [tuple(s) for s in shapes]:
    raise RejectedChange(f"{where} is rejected: its arrays have shapes {stored}, the model's "
                         f"are {[tuple(s) for s in shapes]}")


def _decoded(reader, i: int, shape: Tuple[int, ...], where: str) -> np.ndarray:
  values = reader.get_tensor(f"{i}/values")
  scales = reader.get_tensor(f"{i}/scales") if reader.has_tensor(f"{i}/scales") else None
  if values.shape != weight_codecs.rows_shape(shape):
    raise RejectedChange(f"{where} is rejected: array {i} is stored as {values.shape}, not as "
                         f"rows of {list(shape)}")
  return weight_codecs.decode(weight_codecs.Encoded(values, scales)).reshape(shape)


def read_decision(exchange_dir: str, round_: int, num_groups: Optional[int] = None
                  ) -> Optional[Decision]:
  """Round ``round_``'s decision, or None while there is none; with ``num_groups``, checked
  against the round and the job's groups (``Decision.check``)."""
  path = decision_path(exchange_dir, round_)
  try:
    with tf.io.gfile.GFile(path, "r") as f:
      text = f.read()
  except tf.errors.NotFoundError:
    return None
  decision = Decision.from_json(text, path)
  if num_groups is not None:
    decision.check(round_, num_groups, path)
  return decision


def create_decision(exchange_dir: str, decision: Decision, exclusive: bool) -> bool:
  """Writes ``decision`` unless one exists for its round; True if this call wrote it.
  ``exclusive``: by a hard link (POSIX; safe with many deciders), else by an atomic rename (one
  decider only)."""
  path = decision_path(exchange_dir, decision.round)
  tf.io.gfile.makedirs(os.path.dirname(path))
  if not exclusive:
    directory.write_atomically(path, decision.to_json())
    return True
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  with open(tmp, "w") as f:
    f.write(decision.to_json())
  try:
    os.link(tmp, path)
    return True
  except FileExistsError:
    return False
  finally:
    os.remove(tmp)


def write_shared_state(exchange_dir: str, state: SharedState, keep_rounds: int) -> None:
  """Writes the parameters and momentum after round ``state.round`` (the round's decider only)
  and removes shared states older than ``keep_rounds`` rounds. Decisions are kept (a few
  hundred bytes each): a round decided once is never decided again."""
  base = shared_dir(exchange_dir)
  tensors = {f"{i}/theta": a for i, a in enumerate(state.parameters)}
  for i, b in enumerate(state.momentum or []):
    tensors[f"{i}/momentum"] = b
  final = os.path.join(base, f"step_{state.round}")
  if not tf.io.gfile.exists(os.path.join(final, directory.MARKER)):
    # (No clean-up of temporary directories here: the decider changes from round to round, and
    # another one may be writing.)
    directory.write_complete(final, lambda tmp: lean_versions.save_bundle(tmp, tensors), {
        "round": state.round, "step": state.round, "arrays": len(state.parameters),
        "digest": state.digest,
        "momentum": state.momentum is not None})
  for _, path in directory.complete_steps(base)[keep_rounds:]:
    directory.remove_quietly(path)


def read_shared_state(exchange_dir: str, newest_at_most: Optional[int] = None
                      ) -> Optional[SharedState]:
  """The newest complete shared state (of a round <= ``newest_at_most`` if given), or None."""
  for round_, path in directory.complete_steps(shared_dir(exchange_dir)):
    if newest_at_most is not None and round_ > newest_at_most:
      continue
    try:
      marker = directory.verify(directory.Version(-1, round_, path))
      reader = tf.train.load_checkpoint(os.path.join(path, BUNDLE))
      count = int(marker["arrays"])
      theta = [reader.get_tensor(f"{i}/theta") for i in range(count)]
      momentum = ([reader.get_tensor(f"{i}/momentum") for i in range(count)]
                  if marker.get("momentum") else None)
    except (directory.InvalidVersionError, tf.errors.OpError, KeyError, ValueError) as e:
      if not tf.io.gfile.exists(path):  # removed meanwhile by a decider keeping keep_rounds
        continue
      raise AveragingError(f"{path}: unreadable shared state ({e})") from None
    if outer.digest(theta) != marker.get("digest"):
      raise AveragingError(f"{path}: its parameters do not match the digest in its marker")
    return SharedState(round_, theta, momentum, str(marker["digest"]))
  return None
