"""Tests of the teacher graphs: all-to-all and ring teacher selection for n = 2..8 groups."""

import functools

import gin
import pytest

from tf_codistill.exchange import config as exchange_config
from tf_codistill.exchange import topology


@pytest.mark.parametrize("n", range(2, 9))
def test_all_to_all_is_every_other_group(n):
  for group in range(n):
    assert topology.teacher_groups(group, n, "all_to_all") == [g for g in range(n) if g != group]


@pytest.mark.parametrize("n", range(2, 9))
def test_ring_is_the_predecessor_only_and_every_group_teaches_once(n):
  teachers = [topology.teacher_groups(group, n, "ring") for group in range(n)]
  assert teachers == [[(group - 1) % n] for group in range(n)]
  assert sorted(t for [t] in teachers) == list(range(n))


def test_four_groups_explicitly():
  assert topology.teacher_groups(0, 4, "ring") == [3]
  assert topology.teacher_groups(2, 4, "ring") == [1]
  assert topology.teacher_groups(2, 4, "all_to_all") == [0, 1, 3]


def test_two_groups_ring_equals_all_to_all():
  for group in range(2):
    assert topology.teacher_groups(group, 2, "ring") == topology.teacher_groups(group, 2)


def test_bad_arguments_fail():
  with pytest.raises(ValueError, match="teacher_graph='star'"):
    topology.teacher_groups(0, 3, "star")
  with pytest.raises(ValueError, match="num_groups >= 2"):
    topology.teacher_groups(0, 1)
  with pytest.raises(ValueError, match="group=3 is out of range"):
    topology.teacher_groups(3, 3)


def test_trainer_refuses_unknown_graph_and_precision_naming_the_binding(tmp_path):
  from tf_codistill.training import inputs
  from tf_codistill.training import trainer
  files = inputs.Data(train_files=["x"], eval_files=["y"])
  codistilling = dict(group=0, num_groups=2, exchange_dir=str(tmp_path / "exchange"), data=files)
  with pytest.raises(trainer.ConfigurationError, match="tfc.Exchange: teacher_graph='star'"):
    trainer.train(str(tmp_path), exchange=functools.partial(
        exchange_config.Exchange, teacher_graph="star"), **codistilling)
  gin.bind_parameter("tfc.TeacherSpec.precision", "int4")
  try:
    with pytest.raises(trainer.ConfigurationError, match="tfc.TeacherSpec.precision='int4'"):
      trainer.train(str(tmp_path), **codistilling)
  finally:
    gin.clear_config()
