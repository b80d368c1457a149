"""A job is checked once and its whole configuration written to one file its tasks parse."""

import dataclasses
import glob
import os

import gin
import pytest

from tf_codistill import errors
from tf_codistill import layout
from tf_codistill.launch import gin_config as config
from tf_codistill.launch import jobs
from tf_codistill.training import group as group_lib
from tf_codistill.training import train_config as train_config_lib


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _suite(tmp_path):
  """A user's gin file that includes a shared one by a relative path and uses its macro."""
  (tmp_path / "_shared.gin").write_text("LR = 0.004\ntrainer.train.learning_rate = %LR\n")
  suite = tmp_path / "suite.gin"
  suite.write_text("include 'criteo/codistill_2way.gin'\ninclude '_shared.gin'\n"
                   "tfc.Data.batch_size = 64\n"
                   "tfc.Data.train_files = ['data/train-*']\n"
                   "tfc.Data.eval_files = ['data/eval-*']\n")
  return str(suite)


def test_the_launchers_flags_override_the_group_bindings(tmp_path):
  bindings = ["tfc.Group.strategy = 'parameter_server'", "tfc.Group.workers_per_group = 2",
              "tfc.Group.ps_per_group = 1"]
  bound = jobs.prepare_job(str(tmp_path / "bound"), 2, gin_files=[_suite(tmp_path)],
                           gin_bindings=bindings)
  assert bound.shape == group_lib.Group("parameter_server", 2, 1)
  gin.clear_config()
  flagged = jobs.prepare_job(str(tmp_path / "flagged"), 2, gin_files=[_suite(tmp_path)],
                             gin_bindings=bindings, workers_per_group=3)
  assert flagged.shape == group_lib.Group("parameter_server", 3, 1)
  assert "Group.workers_per_group = 3" in open(flagged.config_file).read()


def test_the_job_config_alone_gives_every_task_the_checked_configuration(tmp_path, monkeypatch):
  job = jobs.prepare_job(str(tmp_path / "job"), 2, gin_files=[_suite(tmp_path)],
                         gin_bindings=["trainer.train.train_steps = 300"],
                         strategy="parameter_server", workers_per_group=1, ps_per_group=1,
                         teacher_graph="ring")
  assert job.config_file == os.path.abspath(layout.job_config(str(tmp_path / "job")))
  assert job.shape == group_lib.Group("parameter_server", workers_per_group=1, ps_per_group=1)
  text = open(job.config_file).read()
  assert "include" not in text  # self-contained: a task does not look for the user's files
  gin.clear_config()
  monkeypatch.chdir(tmp_path / "job")  # nothing in it resolves relative to where it was made
  config.parse_gin([job.config_file])
  parsed = train_config_lib.TrainConfig()
  # Equal in every setting; raw_parser is a parser built again from the same binding.
  assert parsed.data.raw_parser is not None and job.train_config.data.raw_parser is not None

  def without_parser(c):
    return dataclasses.replace(c, data=dataclasses.replace(c.data, raw_parser=None))
  assert without_parser(parsed) == without_parser(job.train_config)
  assert (parsed.learning_rate, parsed.data.batch_size, parsed.train_steps) == (0.004, 64, 300)
  exchange = train_config_lib.exchange_for(parsed, "/tmp/exchange", 0, 2)
  assert (parsed.shape.strategy, exchange.teacher_graph, exchange.distill) == ("parameter_server",
                                                                         "ring", True)


def test_a_refused_job_writes_no_config_file(tmp_path):
  with pytest.raises(errors.ConfigurationError, match="needs --num_groups >= 2"):
    jobs.prepare_job(str(tmp_path / "job"), 1, gin_files=[_suite(tmp_path)])
  assert not os.path.exists(layout.job_config(str(tmp_path / "job")))


def test_a_job_without_data_gets_sample_files_bound_in_its_config(tmp_path):
  data = tmp_path / "job" / "data"  # sample files already there are reused, not generated again
  data.mkdir(parents=True)
  (data / "train-00000.tsv").write_text("")
  (data / "eval-00000.tsv").write_text("")
  job = jobs.prepare_job(str(tmp_path / "job"), 1, gin_bindings=["trainer.train.train_steps = 5"])
  gin.clear_config()
  config.parse_gin([job.config_file])
  parsed = train_config_lib.TrainConfig()
  data = parsed.data
  assert data.train_files and data.eval_files
  assert all(path.startswith(str(tmp_path / "job" / "data")) for path in data.train_files)
  assert all(glob.glob(pattern) for pattern in list(data.train_files) + list(data.eval_files))


def test_a_binding_that_cannot_be_written_as_gin_text_is_refused_by_name():
  config.parse_gin([], ["tfc.Data.batch_size = 64"])
  gin.bind_parameter("trainer.train.learning_rate", object())
  with pytest.raises(config.ConfigError,
                     match=r"trainer\.train\.learning_rate = <object .*> cannot be written"):
    config.config_text()


def test_pinned_groups_need_a_cpu_for_each_group_run_here_not_for_each_of_the_job(tmp_path):
  # --num_groups=<CPUs + 1> --groups=0 --pin_groups: the one group run here gets its CPUs.
  num_groups = len(os.sched_getaffinity(0)) + 1
  jobs.prepare_job(str(tmp_path / "one"), num_groups, gin_files=[_suite(tmp_path)],
                   pin_groups=True, groups=[0])
  gin.clear_config()
  with pytest.raises(errors.ConfigurationError,
                     match=rf"--pin_groups needs a CPU per group: {num_groups} groups"):
    jobs.prepare_job(str(tmp_path / "all"), num_groups, gin_files=[_suite(tmp_path)],
                     pin_groups=True)


def test_a_heartbeat_too_rare_for_the_stall_timeout_is_refused_naming_both(tmp_path):
  with pytest.raises(errors.ConfigurationError,
                     match=r"trainer.train.heartbeat_every_s=40 is not at most half of "
                           r"--stall_timeout_s=60"):
    jobs.prepare_job(str(tmp_path / "job"), 2, gin_files=[_suite(tmp_path)],
                     gin_bindings=["trainer.train.heartbeat_every_s = 40"], stall_timeout_s=60)

