"""Gin parsing: includes resolve without error noise; a missing include still fails clearly."""

import logging

import gin
import pytest

from tf_codistill.launch import gin_config as config


def test_includes_resolve_without_path_not_found_errors(tmp_path, caplog):
  suite = tmp_path / "suite.gin"
  (tmp_path / "_shared.gin").write_text("tfc.Data.batch_size = 64\n")
  suite.write_text("include '_shared.gin'\ninclude 'criteo/common.gin'\n")
  gin.clear_config()
  try:
    with caplog.at_level(logging.INFO):
      config.parse_gin([str(suite)])
    assert gin.query_parameter("tfc.Data.batch_size") == 512  # common.gin came last
  finally:
    gin.clear_config()
  assert not [r for r in caplog.records if "Path not found" in r.getMessage()]


def test_an_include_resolves_next_to_its_own_file_not_an_earlier_parses(tmp_path):
  for name, batch in (("first", 32), ("second", 96)):  # same include name, two directories
    (tmp_path / name).mkdir()
    (tmp_path / name / "_shared.gin").write_text(f"tfc.Data.batch_size = {batch}\n")
    (tmp_path / name / "suite.gin").write_text("include '_shared.gin'\n")
  try:
    for name, batch in (("first", 32), ("second", 96)):
      gin.clear_config()
      config.parse_gin([str(tmp_path / name / "suite.gin")])
      assert gin.query_parameter("tfc.Data.batch_size") == batch
    gin.clear_config()  # and the first's directory is not searched once its parse is done
    (tmp_path / "third.gin").write_text("include '_shared.gin'\n")
    with pytest.raises(config.ConfigError, match="_shared.gin"):
      config.parse_gin([str(tmp_path / "third.gin")])
  finally:
    gin.clear_config()


def test_a_missing_include_is_a_config_error_naming_it(tmp_path):
  suite = tmp_path / "suite.gin"
  suite.write_text("include 'no_such_file.gin'\n")
  gin.clear_config()
  try:
    with pytest.raises(config.ConfigError, match="no_such_file.gin"):
      config.parse_gin([str(suite)])
  finally:
    gin.clear_config()


def test_the_exchanges_old_teacher_precision_names_the_models_teacher_spec():
  gin.clear_config()
  try:
    with pytest.raises(config.errors.ConfigurationError,
                       match=r"tfc.Exchange.teacher_precision is now tfc.TeacherSpec.precision"):
      config.parse_gin([], ["tfc.Exchange.teacher_precision = 'bfloat16'"])
    gin.clear_config()
    config.parse_gin([], ["tfc.TeacherSpec.precision = 'bfloat16'"])
    assert gin.query_parameter("tfc.TeacherSpec.precision") == "bfloat16"
  finally:
    gin.clear_config()


def test_a_renamed_setting_names_its_new_name_in_gin_files_and_bindings(tmp_path):
  suite = tmp_path / "old.gin"
  suite.write_text("tfc.Data.batch_size = 64\ntrainer.train.exchange_every_steps = 50\n")
  message = (r"trainer.train.exchange_every_steps is now tfc.Exchange.publish_every_steps "
             r"\(bind trainer.train.exchange = @tfc.Exchange\): rename the binding")
  gin.clear_config()
  try:
    with pytest.raises(config.errors.ConfigurationError, match=message):
      config.parse_gin([str(suite)])
    gin.clear_config()
    with pytest.raises(config.errors.ConfigurationError, match=message):
      config.parse_gin([], ["trainer.train.exchange_every_steps = 50"])
    gin.clear_config()
    config.parse_gin([], ["tfc.Exchange.publish_every_steps = 50"])
    assert gin.query_parameter("tfc.Exchange.publish_every_steps") == 50
  finally:
    gin.clear_config()


def test_gin_value_reads_a_binding_unwraps_references_and_is_none_when_unbound():
  from data_pipelines import adult  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    config.parse_gin([], ["tfc.Data.batch_size = 32",
                          "tfc.Data.dataset_fn = @adult.make_dataset"])
    assert config.gin_value("tfc.Data.batch_size") == 32
    assert config.gin_value("tfc.Data.dataset_fn") is adult.make_dataset
    assert config.gin_value("tfc.Data.eval_files") is None
  finally:
    gin.clear_config()
