"""A local codistillation job, checked once and run: what ``tf-codistill-launch`` does.

``launch_job`` parses the gin configuration, validates every group's ``TrainConfig`` (the same
``train_config.validate`` each task runs again before training), checks that the job and exchange
directories are writable, generates sample data when no data is bound, writes the whole checked
configuration to ``model_dir/config.gin`` and then runs the groups with
``launcher.launch_groups``: every task, a restarted one too, parses that one file, not the user's
files again. What it refuses is a ``ConfigurationError`` naming the flag or gin binding, raised
before any process starts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin
from absl import logging

from tf_codistill import layout
from tf_codistill.errors import ConfigurationError
from tf_codistill.exchange import config as exchange_config
from tf_codistill.exchange import directory as exchange
from tf_codistill.launch import demo
from tf_codistill.launch import gin_config as config
from tf_codistill.launch import launcher
from tf_codistill.training import group as group_lib
from tf_codistill.training import train_config as train_config_lib


@dataclasses.dataclass(frozen=True)
class Job:
  """A checked job, ready to run: what every group trains with and where its tasks read it."""
  train_config: train_config_lib.TrainConfig
  shape: group_lib.Group
  config_file: str  # the whole configuration as one gin file (layout.job_config)


def launch_job(model_dir: str, num_groups: int = 2, *, gin_files: Sequence[str] = (),
               gin_bindings: Sequence[str] = (), exchange_dir: Optional[str] = None,
               strategy: Optional[str] = None, workers_per_group: Optional[int] = None,
               ps_per_group: Optional[int] = None, teacher_graph: Optional[str] = None,
               **launch_options) -> Dict[int, str]:
  """Checks, then runs, ``num_groups`` groups on this machine; returns each group's directory.

  Args:
    model_dir: the job's directory; group i writes to ``model_dir/group_<i>``.
    num_groups: codistillation groups.
    gin_files, gin_bindings: the configuration every task gets (``trainer.train.*``, ...).
    exchange_dir: where groups publish and read models (default ``model_dir/exchange``).
    strategy, workers_per_group, ps_per_group, teacher_graph: override the gin bindings
      ``tfc.Group.*`` and ``tfc.Exchange.teacher_graph``.
    **launch_options: ``launcher.launch_groups``'s fault, CPU and network options (``max_restarts``,
      ``on_group_failure``, ``pin_groups``, ``isolate_network``, ``allow_exposed_ports``,
      ``stall_timeout_s``).

  Raises:
    ConfigurationError: a bad flag, binding, directory or group shape, before anything runs.
    launcher.GroupFailedError: a group failed for good.
  """
  job = prepare_job(model_dir, num_groups, gin_files=gin_files, gin_bindings=gin_bindings,
                    exchange_dir=exchange_dir, strategy=strategy,
                    workers_per_group=workers_per_group, ps_per_group=ps_per_group,
                    teacher_graph=teacher_graph,
                    stall_timeout_s=launch_options.get("stall_timeout_s",
                                                       launcher.DEFAULT_STALL_TIMEOUT_S),
                    pin_groups=bool(launch_options.get("pin_groups")),
                    groups=launch_options.get("groups"))
  return launcher.launch_groups(model_dir, num_groups, exchange_dir=exchange_dir,
                                gin_files=[job.config_file], shape=job.shape, **launch_options)


def prepare_job(model_dir: str, num_groups: int, *, gin_files: Sequence[str] = (),
                gin_bindings: Sequence[str] = (), exchange_dir: Optional[str] = None,
                strategy: Optional[str] = None, workers_per_group: Optional[int] = None,
                ps_per_group: Optional[int] = None, teacher_graph: Optional[str] = None,
                stall_timeout_s: float = launcher.DEFAULT_STALL_TIMEOUT_S,
                pin_groups: bool = False, groups: Optional[Sequence[int]] = None) -> Job:
  """Everything ``launch_job`` does before starting a process: parses and checks the
  configuration, binds the flags that override it, and writes it to ``model_dir/config.gin``
  (atomically, and only once every check passed), the one file its tasks parse."""
  config.parse_gin(gin_files, gin_bindings)
  files, sample_dir = _data_files(model_dir)
  shape_flags = {"strategy": strategy, "workers_per_group": workers_per_group,
                 "ps_per_group": ps_per_group}
  overrides: Dict[str, Any] = {
      **{f"tfc.Group.{name}": value for name, value in shape_flags.items() if value is not None},
      **{f"tfc.Data.{name}": value for name, value in files.items()},
      **({"tfc.Exchange.teacher_graph": teacher_graph} if teacher_graph else {})}
  for name, value in overrides.items():
    gin.bind_parameter(name, value)
  train_config = train_config_lib.from_bindings()  # what config.gin below gives every task
  shape = train_config.shape
  shape.check_startable()
  shared_exchange = exchange_dir or layout.exchange_dir(model_dir)
  for group in range(num_groups):
    train_config_lib.validate(train_config, group=group, num_groups=num_groups,
                              exchange_dir=shared_exchange)
  _check_waits(train_config_lib.exchange_for(train_config, shared_exchange, 0, num_groups),
               stall_timeout_s)
  if stall_timeout_s and train_config.heartbeat_every_s > stall_timeout_s / 2:
    raise ConfigurationError(
        f"trainer.train.heartbeat_every_s={train_config.heartbeat_every_s:g} is not at most half "
        f"of --stall_timeout_s={stall_timeout_s:g}: the watchdog would take a training group "
        "for hung; lower the interval or raise the timeout")
  if pin_groups:
    launcher.split_cpus(len(groups) if groups is not None else num_groups)
  for flag, directory in (("--model_dir", model_dir), ("--exchange_dir", shared_exchange)):
    exchange.check_writable(directory, flag)
  config_file = os.path.abspath(layout.job_config(model_dir))
  exchange.write_atomically(config_file, config.config_text())
  if sample_dir:
    logging.warning("tfc.Data.train_files/eval_files are not bound: training on generated "
                    "Criteo-format sample data in %s (bind them to train on your data)",
                    sample_dir)
    demo.sample_data(sample_dir)
  return Job(train_config, shape, config_file)


def _check_waits(exchange: Optional[exchange_config.Exchange], stall_timeout_s: float) -> None:
  """Raises ConfigurationError if a wait the exchange allows could look like a hang to the
  launcher's watchdog (``stall_timeout_s``; 0: no watchdog)."""
  if exchange is None:
    return
  waits = {"tfc.Exchange.wait_for_first_teachers_s": exchange.wait_for_first_teachers_s}
  averaging = exchange.averaging
  if averaging is not None:  # a worker that does not decide waits twice the timeout
    waits["tfc.ParameterAveraging.peer_timeout_s (x2 + 60)"] = (
        averaging.peer_timeout_s + max(60.0, averaging.peer_timeout_s))
  for name, seconds in waits.items():
    if stall_timeout_s and seconds >= stall_timeout_s:
      raise ConfigurationError(f"{name} allows a {seconds:.0f} s wait, not below "
                               f"--stall_timeout_s={stall_timeout_s:g}: the watchdog would "
                               "restart a waiting group; lower the wait or raise the timeout")


def _data_files(model_dir: str) -> Tuple[Dict[str, List[str]], Optional[str]]:
  """The files to bind when no data is bound (generated sample data, and where to generate
  it); nothing when both are bound; a ConfigurationError when only one is."""
  bound = [name for name in ("train_files", "eval_files")
           if config.gin_value(f"tfc.Data.{name}") is not None]
  if len(bound) == 2:
    return {}, None
  if bound:
    missing = ({"train_files", "eval_files"} - set(bound)).pop()
    raise ConfigurationError(f"tfc.Data.{bound[0]} is bound but tfc.Data.{missing} is "
                             f"not: pass e.g. --gin_bindings=\"tfc.Data.{missing} = "
                             f"['data/{missing.split('_')[0]}-*']\"")
  data_dir = os.path.abspath(os.path.join(model_dir, "data"))
  train, evaluation = demo.sample_data_files(data_dir)
  return {"train_files": train, "eval_files": evaluation}, data_dir


