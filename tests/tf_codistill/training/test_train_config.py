"""TrainConfig's one check: each setting that cannot work is named before anything runs."""

import dataclasses
import functools

import gin
import pytest

from tf_codistill import errors
from tf_codistill import losses
from tf_codistill.exchange import config as exchange_config
from tf_codistill.launch import gin_config
from tf_codistill.teachers import spec as teacher_spec
from tf_codistill.training import checkpointing
from tf_codistill.training import group as group_lib
from tf_codistill.training import inputs
from tf_codistill.training import train_config

DATA = inputs.Data(train_files=["x"], eval_files=["y"])
FILES = dict(data=DATA)


def _data(**settings):
  return {"data": dataclasses.replace(DATA, **settings)}


def _group(strategy):
  """A group of ``strategy`` with the fewest tasks it can have."""
  return group_lib.Group(strategy, *((1, 1) if strategy == "parameter_server" else (0, 0)))


def _exchange(**settings):
  """``trainer.train.exchange`` as a script passes it: a factory of tfc.Exchange."""
  return {"exchange": functools.partial(exchange_config.Exchange, **settings)}


@pytest.mark.parametrize("settings, where, message", [
    ({}, dict(group=0, num_groups=0), r"--num_groups=0 must be >= 1"),
    ({}, dict(group=2, num_groups=2), r"--group=2 is out of range for --num_groups=2"),
    (_exchange(), dict(group=0, num_groups=1),
     r"trainer.train.exchange \(codistillation, parameter averaging\) needs --num_groups >= 2"),
    (_exchange(), dict(group=0, num_groups=2, exchange_dir=None),
     r"trainer.train.exchange .* needs --exchange_dir"),
    (_data(split="half"), {}, r"tfc.Data.split='half' is not one of"),
    (_data(batch_size=0), {}, r"tfc.Data.batch_size=0 must be >= 1"),
    ({"data": "x"}, {}, r"trainer.train.data='x' is not a tfc.Data: bind @tfc.Data\(\)"),
    ({"optimizer": "lamb"}, {}, r"trainer.train.optimizer='lamb' is not one of"),
    ({"train_steps": 0}, {}, r"trainer.train.train_steps=0 must be >= 1"),
    (_exchange(publish_every_steps=0), {}, r"tfc.Exchange.publish_every_steps=0 must be >= 1"),
    (_exchange(keep_last=0), {}, r"tfc.Exchange.keep_last=0 must be >= 1"),
    (_exchange(poll_interval_s=0.0), {}, r"tfc.Exchange.poll_interval_s=0.0 must be"),
    ({**_exchange(wait_for_first_teachers_s=5.0), "shape": _group("parameter_server")}, {},
     r"tfc.Exchange.wait_for_first_teachers_s cannot hold a ParameterServerStrategy group .* "
     r"set it to 0"),
    ({"shape": _group("multi_worker_mirrored"), "max_wall_seconds": 60.0}, {},
     r"max_wall_seconds cannot end a multi_worker_mirrored group"),
    (_exchange(teacher_graph="star"), {}, r"tfc.Exchange: teacher_graph='star'"),
    ({"exchange": exchange_config.Exchange("/tmp/exchange", 0)}, {},
     r"trainer.train.exchange=.* must make the exchange of each group: bind @tfc.Exchange"),
    ({"fusion": "fast"}, {}, r"trainer.train.fusion='fast'"),
    ({"shape": "mirrored"}, {}, r"trainer.train.shape='mirrored' is not a tfc.Group"),
    ({"checkpoints": 500}, {}, r"trainer.train.checkpoints=500 is not a tfc.Checkpoints"),
    (_data(train_files=[]), {}, r"tfc.Data.train_files is empty: bind it"),
    (_data(eval_files=[]), {}, r"tfc.Data.eval_files is empty: bind it"),
])
def test_validate_names_the_setting_that_cannot_work(settings, where, message):
  config = train_config.TrainConfig(**{**FILES, **settings})
  where = {"group": 0, "num_groups": 2, "exchange_dir": "/tmp/exchange", **where}
  with pytest.raises(train_config.ConfigurationError, match=message):
    train_config.validate(config, **where)


@pytest.mark.parametrize("strategy", ["one_device", "mirrored", "multi_worker_mirrored",
                                      "parameter_server"])
def test_the_defaults_with_files_are_valid_under_every_strategy(strategy):
  config = train_config.TrainConfig(shape=_group(strategy), **FILES)
  train_config.validate(config, group=0, num_groups=1, exchange_dir=None)
  codistilling = train_config.TrainConfig(shape=_group(strategy), **_exchange(), **FILES)
  train_config.validate(codistilling, group=1, num_groups=2, exchange_dir="/tmp/exchange")


def test_every_optimizer_name_builds_its_keras_optimizer():
  for name, make in train_config.OPTIMIZERS.items():
    assert make(learning_rate=0.1).learning_rate.numpy() == pytest.approx(0.1), name


def test_a_renamed_setting_is_an_error_naming_its_new_name(tmp_path):
  from tf_codistill.training import trainer
  with pytest.raises(train_config.ConfigurationError,
                     match=r"trainer.train.exchange_every_steps is now "
                           r"tfc.Exchange.publish_every_steps"):
    trainer.train(str(tmp_path), exchange_every_steps=50, **FILES)
  with pytest.raises(train_config.ConfigurationError,
                     match=r"trainer.train.codistill is now trainer.train.exchange \(True: "):
    trainer.train(str(tmp_path), codistill=True, **FILES)
  with pytest.raises(train_config.ConfigurationError,
                     match=r"trainer.train.batch_size is now tfc.Data.batch_size"):
    trainer.train(str(tmp_path), batch_size=64, **FILES)
  for old, new in (("alpha", "alpha"), ("burn_in_steps", "burn_in_steps"),
                   ("distill_kind", "kind"), ("temperature", "temperature")):
    with pytest.raises(train_config.ConfigurationError,
                       match=rf"trainer.train.{old} is now tfc.Distillation.{new} "):
      trainer.train(str(tmp_path), **{old: 1}, **FILES)


@pytest.fixture
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.mark.parametrize("old, new", [
    ("trainer.train.codistill = True", "trainer.train.exchange .True: bind trainer.train.exchange "
                                       "= @tfc.Exchange; False: leave it unbound"),
    ("trainer.train.publish_every_steps = 50", "tfc.Exchange.publish_every_steps"),
    ("trainer.train.averaging = None", "tfc.Exchange.averaging .bind trainer.train.exchange = "
                                       "@tfc.Exchange, and tfc.Exchange.distill = False unless"),
    ("trainer.train.teacher_precision = 'int8'", "tfc.TeacherSpec.precision"),
    ("trainer.train.train_files = ['x']", "tfc.Data.train_files .the data is tfc.Data's"),
    ("trainer.train.data_split = 'same'", "tfc.Data.split"),
    ("trainer.train.checkpoint_every_steps = 100", "tfc.Checkpoints.every_steps"),
    ("trainer.train.distill_kind = 'xent'",
     "tfc.Distillation.kind .the distillation term is tfc.Distillation's"),
])
def test_a_moved_gin_setting_is_an_error_naming_where_it_went(_clean_gin, old, new):
  with pytest.raises(errors.ConfigurationError, match=f"is now {new}"):
    gin_config.parse_gin([], [old])


def test_every_new_name_of_a_moved_setting_exists():
  owners = {"trainer.train": train_config.TrainConfig, "tfc.Exchange": exchange_config.Exchange,
            "tfc.TeacherSpec": teacher_spec.TeacherSpec, "tfc.Data": inputs.Data,
            "tfc.Group": group_lib.Group, "tfc.Checkpoints": checkpointing.Checkpoints,
            "tfc.Distillation": losses.Distillation}
  for new, _ in train_config.RENAMED.values():
    owner, _, field = new.partition(" ")[0].rpartition(".")
    assert field in {f.name for f in dataclasses.fields(owners[owner])}, new


def test_the_nested_settings_come_from_their_own_bindings(_clean_gin):
  gin_config.parse_gin([], ["trainer.train.exchange = @tfc.Exchange",
                            "tfc.Exchange.publish_every_steps = 7",
                            "tfc.Exchange.teacher_graph = 'ring'",
                            "tfc.TeacherSpec.precision = 'bfloat16'",
                            "tfc.Data.train_files = ['t']", "tfc.Data.eval_files = ['e']",
                            "tfc.Data.batch_size = 96", "tfc.Data.split = 'same'",
                            "tfc.Group.strategy = 'mirrored'",
                            "tfc.Group.allreduce_dtype = 'bfloat16'",
                            "tfc.Checkpoints.every_steps = 70"])
  from_gin = train_config.from_bindings()
  assert from_gin.data == inputs.Data(train_files=["t"], eval_files=["e"], batch_size=96,
                                      split="same")
  assert from_gin.shape == group_lib.Group("mirrored", allreduce_dtype="bfloat16")
  assert from_gin.checkpoints == checkpointing.Checkpoints(every_steps=70, max_to_keep=2)
  assert from_gin.data.shard(1, 2) == (0, 1)  # 'same': every group reads all the files
  config = train_config.from_bindings(**FILES)
  exchange = train_config.exchange_for(config, "/tmp/exchange", 2, 3)
  assert (exchange.publish_every_steps, exchange.peer_groups(), exchange.group) == (7, [1], 2)
  assert config.teachers.precision == "bfloat16" and config.data.shard(1, 2) == (1, 2)
  alone = train_config.from_bindings(exchange=None, **FILES)
  assert train_config.exchange_for(alone, "/tmp/e", 0, 2) is None


def test_an_exchange_called_in_gin_is_an_error_saying_to_drop_the_parentheses(_clean_gin):
  gin_config.parse_gin([], ["trainer.train.exchange = @tfc.Exchange()"])
  with pytest.raises(errors.ConfigurationError, match=r"without parentheses"):
    train_config.from_bindings(**FILES)


def test_a_teacher_precision_that_cannot_work_is_named_when_the_config_is_made(_clean_gin):
  gin_config.parse_gin([], ["tfc.TeacherSpec.precision = 'int4'"])
  with pytest.raises(errors.ConfigurationError,
                     match=r"tfc.TeacherSpec.precision='int4' is not one of"):
    train_config.from_bindings(**FILES)
