"""TrainConfig's one check: each setting that cannot work is named before anything runs."""

import dataclasses

import pytest

from tf_codistill.training import train_config

FILES = dict(train_files=["x"], eval_files=["y"])


@pytest.mark.parametrize("settings, where, message", [
    ({}, dict(group=0, num_groups=0), r"--num_groups=0 must be >= 1"),
    ({}, dict(group=2, num_groups=2), r"--group=2 is out of range for --num_groups=2"),
    ({"codistill": True}, dict(group=0, num_groups=1), r"codistillation needs --num_groups >= 2"),
    ({"codistill": True}, dict(group=0, num_groups=2, exchange_dir=None),
     r"codistillation needs --exchange_dir"),
    ({"data_split": "half"}, {}, r"trainer.train.data_split='half' is not one of"),
    ({"optimizer": "lamb"}, {}, r"trainer.train.optimizer='lamb' is not one of"),
    ({"train_steps": 0}, {}, r"trainer.train.train_steps=0 must be >= 1"),
    ({"codistill": True, "publish_every_steps": 0}, {},
     r"trainer.train.publish_every_steps=0 must be >= 1"),
    ({"codistill": True, "keep_last": 0}, {}, r"trainer.train.keep_last=0 must be >= 1"),
    ({"codistill": True, "poll_interval_s": 0.0}, {}, r"trainer.train.poll_interval_s=0.0 must be"),
    ({"codistill": True, "strategy": "parameter_server", "wait_for_first_teachers_s": 5.0}, {},
     r"trainer.train.wait_for_first_teachers_s cannot hold a ParameterServerStrategy group .* "
     r"set it to 0"),
    ({"strategy": "multi_worker_mirrored", "max_wall_seconds": 60.0}, {},
     r"max_wall_seconds cannot end a multi_worker_mirrored group"),
    ({"codistill": True, "teacher_graph": "star"}, {}, r"trainer.train.teacher_graph='star'"),
    ({"codistill": True, "teacher_precision": "int4"}, {},
     r"trainer.train.teacher_precision='int4' is not one of"),
    ({"fusion": "fast"}, {}, r"trainer.train.fusion='fast'"),
    ({"allreduce_dtype": "float16"}, {}, r"allreduce_dtype='float16' needs a synchronous group"),
    ({"train_files": []}, {}, r"trainer.train.train_files is empty: bind it"),
    ({"eval_files": []}, {}, r"trainer.train.eval_files is empty: bind it"),
])
def test_validate_names_the_setting_that_cannot_work(settings, where, message):
  config = train_config.TrainConfig(**{**FILES, **settings})
  where = {"group": 0, "num_groups": 2, "exchange_dir": "/tmp/exchange", **where}
  with pytest.raises(train_config.ConfigurationError, match=message):
    train_config.validate(config, **where)


@pytest.mark.parametrize("strategy", ["one_device", "mirrored", "multi_worker_mirrored",
                                      "parameter_server"])
def test_the_defaults_with_files_are_valid_under_every_strategy(strategy):
  config = train_config.TrainConfig(strategy=strategy, **FILES)
  train_config.validate(config, group=0, num_groups=1, exchange_dir=None)
  codistilling = train_config.TrainConfig(strategy=strategy, codistill=True, **FILES)
  train_config.validate(codistilling, group=1, num_groups=2, exchange_dir="/tmp/exchange")


def test_every_optimizer_name_builds_its_keras_optimizer():
  for name, make in train_config.OPTIMIZERS.items():
    assert make(learning_rate=0.1).learning_rate.numpy() == pytest.approx(0.1), name


def test_a_renamed_setting_is_an_error_naming_its_new_name(tmp_path):
  from tf_codistill.training import trainer
  with pytest.raises(train_config.ConfigurationError,
                     match=r"trainer.train.exchange_every_steps is now "
                           r"trainer.train.publish_every_steps"):
    trainer.train(str(tmp_path), exchange_every_steps=50, **FILES)
  assert {new for new, _ in train_config.RENAMED.values()} <= {
      f.name for f in dataclasses.fields(train_config.TrainConfig)}
