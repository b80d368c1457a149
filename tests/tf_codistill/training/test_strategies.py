"""Strategy choice and TF_CONFIG: each mismatch is an error that says what to change."""

import json
import os

import pytest
import tensorflow as tf

from tf_codistill.training import strategies

PS_CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"],
              "ps": ["127.0.0.1:4"]}
SYNC_CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}


def _config(cluster, task_type, index=0):
  return {"cluster": cluster, "task": {"type": task_type, "index": index}}


def test_no_cluster_means_one_process():
  info = strategies.task_info("one_device", {})
  assert (info.task_type, info.is_chief, info.serves_only, info.num_workers) == (None, True,
                                                                               False, 1)


def test_parameter_server_roles():
  chief = strategies.task_info("parameter_server", _config(PS_CLUSTER, "chief"))
  worker = strategies.task_info("parameter_server", _config(PS_CLUSTER, "worker", 1))
  ps = strategies.task_info("parameter_server", _config(PS_CLUSTER, "ps"))
  assert chief.is_chief and not chief.serves_only
  assert worker.serves_only and not worker.is_chief and ps.serves_only
  assert (chief.num_workers, chief.num_ps) == (2, 1)


def test_sync_roles_count_the_chief_as_a_replica():
  chief = strategies.task_info("multi_worker_mirrored", _config(SYNC_CLUSTER, "chief"))
  worker = strategies.task_info("multi_worker_mirrored", _config(SYNC_CLUSTER, "worker", 1))
  assert chief.is_chief and not worker.is_chief and not worker.serves_only
  assert chief.num_workers == 3
  # Without a chief, worker 0 publishes and writes results.
  no_chief = {"worker": ["127.0.0.1:2", "127.0.0.1:3"]}
  assert strategies.task_info("multi_worker_mirrored", _config(no_chief, "worker", 0)).is_chief
  assert not strategies.task_info("multi_worker_mirrored",
                                  _config(no_chief, "worker", 1)).is_chief


@pytest.mark.parametrize("kind,config,message", [
    ("tpu", {}, r"strategy='tpu' is not one of"),
    ("one_device", _config(SYNC_CLUSTER, "chief"), "use 'multi_worker_mirrored' or"),
    ("multi_worker_mirrored", {}, "needs TF_CONFIG with a 'cluster'"),
    ("multi_worker_mirrored", _config(PS_CLUSTER, "chief"), "has ps tasks: use 'parameter_server'"),
    ("parameter_server", _config(SYNC_CLUSTER, "chief"), "got 1 chief, 2 worker, 0 ps"),
    ("parameter_server", _config(PS_CLUSTER, "worker", 2), "is not in its cluster"),
    ("parameter_server", _config(PS_CLUSTER, "evaluator"), "is not in its cluster"),
])
def test_mismatches_are_errors_that_say_what_to_change(kind, config, message):
  with pytest.raises(strategies.StrategyConfigError, match=message):
    strategies.task_info(kind, config)


def test_malformed_tf_config_names_the_variable(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", "{cluster: oops")
  with pytest.raises(strategies.StrategyConfigError, match="TF_CONFIG is not valid JSON"):
    strategies.task_info("parameter_server")
  monkeypatch.setenv("TF_CONFIG", json.dumps([1, 2]))
  with pytest.raises(strategies.StrategyConfigError, match="must be a JSON object"):
    strategies.read_tf_config()


def test_single_process_strategies(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  assert strategies.make_strategy("one_device") is tf.distribute.get_strategy()
  assert isinstance(strategies.make_strategy("mirrored"), tf.distribute.MirroredStrategy)


def test_bad_sync_implementation_names_the_binding(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", json.dumps(_config({"chief": ["127.0.0.1:1"]}, "chief")))
  with pytest.raises(strategies.StrategyConfigError,
                     match=r"strategies.make_strategy.implementation='fast'"):
    strategies.make_strategy("multi_worker_mirrored", implementation="fast")


def test_a_heartbeat_timeout_that_is_not_positive_names_the_binding(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", json.dumps(_config({"chief": ["127.0.0.1:1"]}, "chief")))
  with pytest.raises(strategies.StrategyConfigError,
                     match=r"strategies.make_strategy.heartbeat_timeout_s=0 must be > 0"):
    strategies.make_strategy("multi_worker_mirrored", heartbeat_timeout_s=0)


def test_serving_tasks_get_at_least_two_inter_op_threads():
  # One inter-op thread (TF's default on a 1-CPU task, or inter_op_threads = 1) deadlocks a
  # parameter-server group; tests/cluster/test_clusters.py trains one whose tasks see one CPU.
  config = strategies.server_config(inter_op_threads=1, intra_op_threads=1)
  assert config.inter_op_parallelism_threads == strategies.MIN_SERVER_INTER_OP_THREADS == 2
  assert config.intra_op_parallelism_threads == 1
  assert strategies.server_config(inter_op_threads=6).inter_op_parallelism_threads == 6
  # Unbound: one per CPU this task may run on, but never fewer than 2.
  expected = max(2, len(os.sched_getaffinity(0)))
  assert strategies.server_config().inter_op_parallelism_threads == expected
