"""tfc.Group: a group's shape, checked when it is made, and what the launcher hands its tasks."""

import gin
import pytest

from tf_codistill.errors import ConfigurationError
from tf_codistill.launch import gin_config
from tf_codistill.optim import comm
from tf_codistill.training import group as group_lib
from tf_codistill.training import train_config


@pytest.mark.parametrize("strategy,workers,ps,message", [
    ("one_device", 1, 0, r"\(--workers_per_group, --ps_per_group\) must be 0"),
    ("mirrored", 0, 1, r"\(--workers_per_group, --ps_per_group\) must be 0"),
    ("multi_worker_mirrored", 1, 1, r"tfc.Group.ps_per_group \(--ps_per_group\) must be 0"),
    ("parameter_server", -1, 1, r"\(--workers_per_group, --ps_per_group\) must be >= 0"),
    ("horovod", 0, 0, r"tfc.Group.strategy='horovod' \(--strategy\) is not one of"),
])
def test_impossible_clusters_are_refused_naming_the_setting_and_flag(strategy, workers, ps,
                                                                     message):
  with pytest.raises(ConfigurationError, match=message):
    group_lib.Group(strategy, workers, ps)


@pytest.mark.parametrize("workers,ps", [(0, 1), (2, 0), (0, 0)])
def test_a_parameter_server_group_a_launcher_starts_needs_workers_and_ps(workers, ps):
  # Under a cluster manager the tasks come from TF_CONFIG: the counts need not be bound.
  shape = group_lib.Group("parameter_server", workers, ps)
  with pytest.raises(ConfigurationError, match="needs tfc.Group.workers_per_group >= 1 and "
                                               "ps_per_group >= 1"):
    shape.check_startable()
  group_lib.Group("parameter_server", 1, 1).check_startable()


@pytest.mark.parametrize("strategy,dtype,message", [
    ("multi_worker_mirrored", "int8", r"tfc.Group.allreduce_dtype='int8' is not one of"),
    ("parameter_server", "bfloat16", "needs a synchronous group"),
    ("one_device", "float16", "needs a synchronous group"),
])
def test_an_allreduce_precision_needs_a_synchronous_group(strategy, dtype, message):
  shape = (1, 1) if strategy == "parameter_server" else (0, 0)
  with pytest.raises(ConfigurationError, match=message):
    group_lib.Group(strategy, *shape, allreduce_dtype=dtype)
  assert group_lib.Group("mirrored", allreduce_dtype="bfloat16").allreduce_dtype == "bfloat16"


@pytest.mark.parametrize("seconds", [-1, 2**31])
def test_a_connection_timeout_outside_what_tcp_holds_is_refused(seconds):
  with pytest.raises(ConfigurationError, match=rf"tfc.Group.connection_timeout_s={seconds} must "
                                               r"be in \[0, 2147483\] seconds"):
    group_lib.Group("parameter_server", 1, 1, connection_timeout_s=seconds)
  assert group_lib.Group("parameter_server", 1, 1, connection_timeout_s=0).connection_timeout_s == 0


def test_the_precisions_are_the_ones_the_reducer_knows():
  assert sorted(group_lib.ALLREDUCE_DTYPES) == sorted(comm.DTYPES)


def test_tasks_and_the_shape_handed_to_each_task():
  shape = group_lib.Group("parameter_server", 2, 1)
  assert shape.tasks() == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
  assert shape.is_cluster and shape.asynchronous
  assert not group_lib.Group().is_cluster
  gin.clear_config()
  try:
    gin_config.parse_gin([], shape.shape_bindings())
    assert train_config.TrainConfig().shape == shape
  finally:
    gin.clear_config()


@pytest.mark.parametrize("binding,new", [
    ("trainer.train.strategy = 'mirrored'", "tfc.Group.strategy"),
    ("trainer.train.allreduce_dtype = 'bfloat16'", "tfc.Group.allreduce_dtype"),
    ("launcher.group_shape.workers_per_group = 2", "tfc.Group.workers_per_group"),
])
def test_the_old_names_are_errors_naming_the_new_one(binding, new):
  gin.clear_config()
  try:
    with pytest.raises(ConfigurationError, match=f"(is|are) now {new}"):
      gin_config.parse_gin([], [binding])
  finally:
    gin.clear_config()
