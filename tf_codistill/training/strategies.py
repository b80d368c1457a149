"""Picks a group's tf.distribute strategy and its role in the group's cluster from TF_CONFIG.

Inside a codistillation group training is ordinary distributed SGD:

- ``one_device`` / ``mirrored``: one process (no cluster in TF_CONFIG);
- ``multi_worker_mirrored``: synchronous all-reduce SGD; every task (chief and workers) trains;
- ``parameter_server``: asynchronous SGD; the chief coordinates, workers and ps tasks only serve.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import gin
import tensorflow as tf
from absl import logging

from tf_codistill import errors
from tf_codistill.training import group as group_lib

KINDS = group_lib.KINDS
IMPLEMENTATIONS = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
                   "ring": tf.distribute.experimental.CommunicationImplementation.RING,
                   "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}


class StrategyConfigError(errors.ConfigurationError):
  """The requested strategy does not match TF_CONFIG (or its own options)."""


@dataclasses.dataclass(frozen=True)
class TaskInfo:
  """This process's place in its group's cluster."""
  kind: str
  task_type: Optional[str]  # None without a cluster
  task_id: int
  num_workers: int  # tasks computing gradients (chief included for multi_worker_mirrored)
  num_ps: int
  has_chief: bool = True

  @property
  def is_chief(self) -> bool:
    """The task that publishes and writes summaries/results (worker 0 if there is no chief)."""
    if self.task_type is None:
      return True
    if not self.has_chief:
      return self.task_type == "worker" and self.task_id == 0
    return self.task_type == "chief"

  @property
  def serves_only(self) -> bool:
    """Workers and ps tasks of a parameter-server group run a tf.distribute.Server and wait."""
    return self.kind == "parameter_server" and self.task_type in ("worker", "ps")


# A serving task's inter-op pool runs the coordinator's remote functions; one that blocks on a
# tensor from another task holds its thread, so with a single thread (TF's default on a 1-CPU
# task) a parameter-server group hangs after its first step.
MIN_SERVER_INTER_OP_THREADS = 2


def server_config(inter_op_threads: int = 0, intra_op_threads: int = 0
                  ) -> tf.compat.v1.ConfigProto:
  """Thread pools of a serving task: the trainer's thread bindings (0: TF's default, one per
  CPU the task may run on), with at least MIN_SERVER_INTER_OP_THREADS inter-op threads."""
  inter = inter_op_threads or len(os.sched_getaffinity(0))
  return tf.compat.v1.ConfigProto(
      inter_op_parallelism_threads=max(MIN_SERVER_INTER_OP_THREADS, inter),
      intra_op_parallelism_threads=intra_op_threads)


def serve(info: TaskInfo, config: Optional[tf.compat.v1.ConfigProto] = None) -> None:
  """Runs this task's tf.distribute.Server from TF_CONFIG until the process is stopped."""
  # Lets the coordinator see a lost worker at once and reschedule its closures.
  os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc",
                                config=config or server_config(), start=True)
  logging.info("serving %s:%d of %s", info.task_type, info.task_id, info.kind)
  server.join()


def read_tf_config() -> dict:
  """TF_CONFIG as a dict ({} when unset); a malformed value is an error naming the variable."""
  raw = os.environ.get("TF_CONFIG", "")
  if not raw.strip():
    return {}
  try:
    config = json.loads(raw)
  except ValueError as e:
    raise StrategyConfigError(f"TF_CONFIG is not valid JSON ({e}): {raw[:200]}") from e
  if not isinstance(config, dict):
    raise StrategyConfigError(f"TF_CONFIG must be a JSON object, got {raw[:200]}")
  return config


def task_info(kind: str, tf_config: Optional[dict] = None) -> TaskInfo:
  """Checks that ``kind`` fits TF_CONFIG's cluster and returns this task's role."""
  if kind not in KINDS:
    raise StrategyConfigError(f"tfc.Group.strategy={kind!r} is not one of {KINDS}")
  tf_config = read_tf_config() if tf_config is None else tf_config
  cluster = tf_config.get("cluster") or {}
  task = tf_config.get("task") or {}
  n_chief = len(cluster.get("chief", []))
  n_workers = len(cluster.get("worker", []))
  n_ps = len(cluster.get("ps", []))
  if kind in ("one_device", "mirrored"):
    if n_chief + n_workers + n_ps > 1:
      raise StrategyConfigError(
          f"tfc.Group.strategy={kind!r} runs in one process, but TF_CONFIG describes a cluster "
          f"of {n_chief} chief, {n_workers} worker, {n_ps} ps tasks: use "
          "'multi_worker_mirrored' or 'parameter_server', or unset TF_CONFIG")
    return TaskInfo(kind, None, 0, 1, 0)
  if not cluster:
    raise StrategyConfigError(
        f"tfc.Group.strategy={kind!r} needs TF_CONFIG with a 'cluster' (and 'task')")
  task_type, task_id = task.get("type"), int(task.get("index", 0))
  members = cluster.get(task_type, [])
  if task_type is None or task_id >= len(members):
    raise StrategyConfigError(f"TF_CONFIG task {task} is not in its cluster {sorted(cluster)}")
  if kind == "multi_worker_mirrored":
    if n_ps:
      raise StrategyConfigError("tfc.Group.strategy='multi_worker_mirrored' but TF_CONFIG has "
                                "ps tasks: use 'parameter_server'")
    return TaskInfo(kind, task_type, task_id, n_chief + n_workers, 0, has_chief=n_chief > 0)
  if not n_ps or not n_chief or not n_workers:
    raise StrategyConfigError(
        "tfc.Group.strategy='parameter_server' needs TF_CONFIG with a chief, >= 1 worker and "
        f">= 1 ps task; got {n_chief} chief, {n_workers} worker, {n_ps} ps")
  return TaskInfo(kind, task_type, task_id, n_workers, n_ps)


def _configure_coordination(cluster_spec: tf.train.ClusterSpec, heartbeat_timeout_s: float
                            ) -> None:
  """TF's coordination service for this MultiWorkerMirrored task, configured as the strategy
  would configure it (which it then leaves as it is), but with ``heartbeat_timeout_s``."""
  if heartbeat_timeout_s <= 0:
    raise StrategyConfigError(
        f"strategies.make_strategy.heartbeat_timeout_s={heartbeat_timeout_s} must be > 0")
  # TF has no public API for it (the protobuf module's path differs between TF versions).
  from tensorflow.python.distribute import collective_all_reduce_strategy as mwms  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import multi_worker_util  # pylint: disable=g-import-not-at-top
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  if context.context().coordination_service is not None:  # configured already
    return
  jobs = [mwms.coordination_config_pb2.CoordinatedJob(name=job,
                                                      num_tasks=cluster_spec.num_tasks(job))
          for job in ("chief", "worker") if job in cluster_spec.jobs]
  context.context().configure_coordination_service(
      service_type="standalone",
      service_leader=multi_worker_util.coordination_leader(cluster_spec),
      coordinated_jobs=jobs, heartbeat_timeout_in_ms=int(heartbeat_timeout_s * 1000))


@gin.configurable(module="strategies")
def make_strategy(kind: str = "one_device", *, bytes_per_pack: int = 0,
                  timeout_seconds: Optional[float] = None, implementation: str = "auto",
                  heartbeat_timeout_s: float = 120.0,
                  partitioner: str = "min_size", min_shard_bytes: int = 256 << 10,
                  max_shards: int = 1, fixed_shards: int = 1) -> tf.distribute.Strategy:
  """The strategy of kind ``kind`` for this process, with its communication/partitioning options.

  Sync (``multi_worker_mirrored``): ``bytes_per_pack`` (gradient packing, 0 = TF's default),
  ``timeout_seconds`` (collective timeout) and ``implementation`` ('auto', 'ring', 'nccl');
  ``heartbeat_timeout_s``: how long the group's coordination service waits for a silent task
  before it fails the group (TF's default, about 20 s here, took a worker cut off for 5 s for
  dead; a dead process is seen by the launcher at once, a hung one by its watchdog).
  Async (``parameter_server``): ``partitioner='min_size'`` (``MinSizePartitioner(min_shard_bytes,
  max_shards)``) or ``'fixed'`` (``FixedShardsPartitioner(fixed_shards)``) for large tables.
  """
  info = task_info(kind)
  if kind == "one_device":
    # The default strategy: one device, and the one tf_keras' BackupAndRestore accepts.
    return tf.distribute.get_strategy()
  if kind == "mirrored":
    return tf.distribute.MirroredStrategy()
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  if kind == "multi_worker_mirrored":
    if implementation not in IMPLEMENTATIONS:
      raise StrategyConfigError(
          f"strategies.make_strategy.implementation={implementation!r} is not one of "
          f"{sorted(IMPLEMENTATIONS)}")
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_seconds,
        implementation=IMPLEMENTATIONS[implementation])
    _configure_coordination(resolver.cluster_spec(), heartbeat_timeout_s)
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                     communication_options=options)
  if partitioner == "min_size":
    variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=min_shard_bytes, max_shards=max(max_shards, info.num_ps))
  elif partitioner == "fixed":
    variable_partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(
        fixed_shards)
  elif partitioner == "none":
    variable_partitioner = None
  else:
    raise StrategyConfigError(f"strategies.make_strategy.partitioner={partitioner!r} is not one "
                              "of ('min_size', 'fixed', 'none')")
  return tf.distribute.experimental.ParameterServerStrategy(
      resolver, variable_partitioner=variable_partitioner)
