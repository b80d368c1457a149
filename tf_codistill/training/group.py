"""A group's shape (``tfc.Group``): its strategy, its tasks and how a synchronous group sums
gradients, checked once, without importing TensorFlow (the launcher checks it before any task
starts)."""

from __future__ import annotations

import dataclasses
from typing import List, Tuple

import gin

from tf_codistill import errors

KINDS = ("one_device", "mirrored", "multi_worker_mirrored", "parameter_server")
ALLREDUCE_DTYPES = ("bfloat16", "float16", "float32")  # optim/comm.py's DTYPES
MAX_CONNECTION_TIMEOUT_S = 2**31 // 1000  # TCP_USER_TIMEOUT is an int of milliseconds


@gin.configurable(module="tfc")
@dataclasses.dataclass(frozen=True)
class Group:
  """How one group trains together (``tfc.Group.<field>``; the launcher's ``--strategy``,
  ``--workers_per_group`` and ``--ps_per_group`` override them).

  ``strategy`` is one of KINDS: ``one_device`` and ``mirrored`` run one process,
  ``multi_worker_mirrored`` (synchronous) and ``parameter_server`` (asynchronous) a local TF
  cluster. ``workers_per_group`` counts worker tasks besides the chief (a synchronous chief
  trains too: ``workers_per_group + 1`` replicas; a parameter-server chief only coordinates),
  ``ps_per_group`` the parameter servers: the tasks a launcher starts (under a cluster manager
  the tasks are its replicas, read from TF_CONFIG). ``allreduce_dtype`` is the precision of a
  synchronous group's gradient all-reduce (optim/comm.py). ``connection_timeout_s``: how long a
  connection between the tasks may go unanswered (a network partition) before it is dropped,
  which costs the group a restart (training/connections.py; gRPC's own is 20 s; 0 keeps it).
  Checked when made.
  """
  strategy: str = "one_device"
  workers_per_group: int = 0
  ps_per_group: int = 0
  allreduce_dtype: str = "float32"
  connection_timeout_s: float = 120.0

  def __post_init__(self):
    refuse = errors.ConfigurationError
    if self.strategy not in KINDS:
      raise refuse(f"tfc.Group.strategy={self.strategy!r} (--strategy) is not one of {KINDS}")
    if self.strategy in ("one_device", "mirrored") and (self.workers_per_group
                                                        or self.ps_per_group):
      raise refuse(f"tfc.Group.strategy={self.strategy!r} runs one process per group: "
                   "tfc.Group.workers_per_group and ps_per_group (--workers_per_group, "
                   "--ps_per_group) must be 0")
    if self.strategy == "multi_worker_mirrored" and self.ps_per_group:
      raise refuse("tfc.Group.strategy='multi_worker_mirrored' has no ps tasks: "
                   "tfc.Group.ps_per_group (--ps_per_group) must be 0")
    if self.workers_per_group < 0 or self.ps_per_group < 0:
      raise refuse("tfc.Group.workers_per_group and ps_per_group (--workers_per_group, "
                   "--ps_per_group) must be >= 0")
    if not 0 <= self.connection_timeout_s <= MAX_CONNECTION_TIMEOUT_S:
      raise refuse(f"tfc.Group.connection_timeout_s={self.connection_timeout_s} must be in [0, "
                   f"{MAX_CONNECTION_TIMEOUT_S}] seconds (0: gRPC's own 20 s)")
    if self.allreduce_dtype not in ALLREDUCE_DTYPES:
      raise refuse(f"tfc.Group.allreduce_dtype={self.allreduce_dtype!r} is not one of "
                   f"{list(ALLREDUCE_DTYPES)}")
    if self.allreduce_dtype != "float32" and self.strategy not in ("mirrored",
                                                                   "multi_worker_mirrored"):
      raise refuse(
          f"tfc.Group.allreduce_dtype={self.allreduce_dtype!r} needs a synchronous group "
          f"(strategy 'multi_worker_mirrored' or 'mirrored'); strategy={self.strategy!r} has no "
          "gradient all-reduce")

  def check_startable(self) -> None:
    """Raises ConfigurationError if a launcher cannot start this group's tasks. (A task started
    by a cluster manager reads its cluster from TF_CONFIG: these counts are the launcher's.)"""
    if self.strategy == "parameter_server" and (self.workers_per_group < 1
                                                or self.ps_per_group < 1):
      raise errors.ConfigurationError(
          "tfc.Group.strategy='parameter_server' needs tfc.Group.workers_per_group >= 1 and "
          "ps_per_group >= 1 (--workers_per_group, --ps_per_group)")

  def tasks(self) -> List[Tuple[str, int]]:
    """The group's tasks, chief first."""
    return ([("chief", 0)] + [("worker", k) for k in range(self.workers_per_group)]
            + [("ps", k) for k in range(self.ps_per_group)])

  @property
  def is_cluster(self) -> bool:
    """Whether the group runs as a TF cluster of several processes."""
    return self.strategy in ("multi_worker_mirrored", "parameter_server")

  @property
  def asynchronous(self) -> bool:
    """Whether the group trains under parameter servers (its workers only serve)."""
    return self.strategy == "parameter_server"

  def shape_bindings(self) -> List[str]:
    """The strategy and task counts as gin bindings, for the tasks a launcher starts
    (``allreduce_dtype`` comes with the job's gin configuration)."""
    return [f"tfc.Group.{name} = {getattr(self, name)!r}"
            for name in ("strategy", "workers_per_group", "ps_per_group")]
