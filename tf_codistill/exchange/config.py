"""``Exchange``: where and how one group exchanges models with its peers.

The settings a ``CodistillModel`` needs for codistillation (directory, own group, peers, publish
interval and format, versions kept, poll interval, parameter averaging), checked when they are
made; ``training.codistill_hooks`` turns them into the work ``fit`` does between steps.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, List, Optional, Sequence

import gin

from tf_codistill.errors import ConfigurationError
from tf_codistill.exchange import averaging as averaging_lib
from tf_codistill.exchange import lean_versions
from tf_codistill.exchange import topology

# The nice increments a loading thread may take (Linux's range of nice values above 0).
LOADER_NICE_RANGE = (0, 19)


@gin.configurable(module="tfc")
@dataclasses.dataclass(frozen=True)
class Exchange:
  """Where and how one group of a codistillation job exchanges models with its peers.

  Attributes:
    directory: the exchange directory every group of the job shares (local, ``gs://``, ...).
    group: this group's index, in ``[0, num_groups)``.
    num_groups: how many groups train side by side (>= 2).
    teacher_graph: ``all_to_all`` (distill from every other group) or ``ring`` (from the
      predecessor only); ignored when ``peers`` is given.
    peers: the groups to distill from, if not given by ``teacher_graph``.
    publish_every_steps: the chief publishes the student every this many optimizer steps (K).
    keep_last: published versions of this group kept in the directory (older ones are removed).
    poll_interval_s: how often the background thread looks for newer peer versions.
    loader_nice: how much lower than training that thread runs (a Linux nice increment, 0 to
      19). 0 by default: 10 saved no throughput in a 2-core parameter-server group and made
      loads slower (the thread shares the Python GIL with the training loop).
    publish_format: how versions are published: whole SavedModels (the default), or lean
      versions with bfloat16/int8 weights and row deltas (``tfc.PublishFormat``); readers
      accept every format.
    wait_for_first_teachers_s: at the first step where a teacher can count (the later of
      ``tfc.Distillation.burn_in_steps`` and ``publish_every_steps``, when the peers' first
      versions are due), hold training up to this many seconds until every peer's first
      version is loaded (0: never wait; not under ParameterServerStrategy, whose steps are not
      held by hooks).
      Every training process waits on its own: in a MultiWorkerMirrored group keep it below the
      collectives' timeout (``strategies.make_strategy.timeout_seconds``).
    input_spec: the student's input spec (a ``tf.TensorSpec`` or a dict of them), needed only
      when ``fit`` is not given a ``tf.data.Dataset`` and the model was never called.
    averaging: parameter averaging between the groups every ``averaging.every_steps`` steps
      (``tfc.ParameterAveraging``: DiLoCo, local SGD), beside or instead of distillation.
    distill: whether to distill from peers (publish the student, load teachers); False with
      ``averaging`` averages parameters only.

  Raises:
    ConfigurationError: a value that cannot work, named by its field.
  """
  directory: str
  group: int
  num_groups: int = 2
  teacher_graph: str = "all_to_all"
  peers: Optional[Sequence[int]] = None
  publish_every_steps: int = 100
  keep_last: int = 2
  poll_interval_s: float = 2.0
  loader_nice: int = 0
  publish_format: lean_versions.PublishFormat = lean_versions.PublishFormat()
  wait_for_first_teachers_s: float = 0.0
  input_spec: Any = None
  averaging: Optional[averaging_lib.ParameterAveraging] = None
  distill: bool = True

  def __post_init__(self):
    if not self.directory:
      raise ConfigurationError("tfc.Exchange.directory is empty: give the shared exchange "
                               "directory")
    if not self.distill and self.averaging is None:
      raise ConfigurationError("tfc.Exchange.distill=False and no tfc.Exchange.averaging: the "
                               "groups would exchange nothing")
    if self.averaging is not None:
      self.averaging.check_job(self.directory, self.num_groups)
    for name in ("publish_every_steps", "keep_last"):
      if getattr(self, name) < 1:
        raise ConfigurationError(f"tfc.Exchange.{name}={getattr(self, name)} must be >= 1")
    if self.poll_interval_s <= 0:
      raise ConfigurationError(f"tfc.Exchange.poll_interval_s={self.poll_interval_s} must be "
                               "> 0")
    low, high = LOADER_NICE_RANGE
    if not low <= self.loader_nice <= high:
      raise ConfigurationError(f"tfc.Exchange.loader_nice={self.loader_nice} must be in "
                               f"[{low}, {high}]")
    if not 0 <= self.wait_for_first_teachers_s <= threading.TIMEOUT_MAX:
      raise ConfigurationError(f"tfc.Exchange.wait_for_first_teachers_s="
                               f"{self.wait_for_first_teachers_s} must be >= 0 and finite")
    try:
      peers = topology.teacher_groups(self.group, self.num_groups, self.teacher_graph)
      peers = self.peer_groups()
    except ValueError as e:
      raise ConfigurationError(f"tfc.Exchange: {e}") from None
    if (self.group in peers or any(not 0 <= p < self.num_groups for p in peers) or not peers
            or len(set(peers)) < len(peers)):
      raise ConfigurationError(f"tfc.Exchange.peers={list(peers)} must be distinct other groups "
                               f"of range({self.num_groups}) than group {self.group}")

  def check_strategy(self, parameter_server: bool) -> None:
    """Raises ConfigurationError if this exchange cannot work under the group's strategy."""
    if parameter_server and self.wait_for_first_teachers_s > 0:
      raise ConfigurationError(
          "tfc.Exchange.wait_for_first_teachers_s cannot hold a ParameterServerStrategy group "
          "(its steps are scheduled regardless of hooks): set it to 0")

  def peer_groups(self) -> List[int]:
    """The groups this group distills from, in ascending order."""
    if self.peers is not None:
      return sorted(int(p) for p in self.peers)
    return topology.teacher_groups(self.group, self.num_groups, self.teacher_graph)

  @property
  def num_teachers(self) -> int:
    """How many teachers a CodistillModel of this exchange averages (0 without distillation)."""
    return len(self.peer_groups()) if self.distill else 0
