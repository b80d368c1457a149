"""tf-codistill-launch: runs n codistillation groups as processes on this machine."""

import os
import sys
from typing import Dict, List, Optional, Tuple

import gin
import tensorflow as tf
from absl import app
from absl import flags
from absl import logging

from tf_codistill import demo
from tf_codistill import exchange
from tf_codistill import launcher
from tf_codistill import layout
from tf_codistill import topology
from tf_codistill import trainer
from tf_codistill.bin import common

common.define_gin_flags()
flags.DEFINE_string("model_dir", "codistill_run",
                    "Job directory; group i writes to model_dir/group_<i>.")
flags.DEFINE_integer("num_groups", 2, "Number of codistillation groups.", lower_bound=1)
flags.DEFINE_string("exchange_dir", None, "Shared exchange directory (default model_dir/exchange).")
flags.DEFINE_enum("strategy", None, list(launcher.STRATEGIES),
                  "Strategy inside each group (default: the gin binding trainer.train.strategy, "
                  "else one_device).")
flags.DEFINE_integer("workers_per_group", None,
                     "Worker tasks per group besides the chief (default: the gin binding "
                     "launcher.group_shape.workers_per_group, else 0).", lower_bound=0)
flags.DEFINE_integer("ps_per_group", None, "Parameter-server tasks per group (default: the gin "
                     "binding launcher.group_shape.ps_per_group, else 0).", lower_bound=0)
flags.DEFINE_integer("max_restarts", 0, "Restarts allowed per group after a task dies.",
                     lower_bound=0)
flags.DEFINE_enum("on_group_failure", "stop_all", list(launcher.FAILURE_POLICIES),
                  "When a group fails for good: stop every group, or let its peers continue.")
flags.DEFINE_enum("teacher_graph", None, list(topology.GRAPHS),
                  "Which peers each group distills from: every other group (all_to_all) or its "
                  "predecessor (ring) (default: the gin binding trainer.train.teacher_graph, "
                  "else all_to_all).")
flags.DEFINE_bool("pin_groups", False, "Pin each group's tasks to its own equal share of this "
                  "machine's CPUs (as if each group had its own machine).")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    common.exit_with_error(f"unexpected arguments: {argv[1:]}")
  # Fail on a bad config here, once, rather than in every group's process.
  common.parse_gin_or_exit(FLAGS.gin_file, FLAGS.gin_bindings)
  strategy = FLAGS.strategy or _gin_strategy()
  exchange_dir = FLAGS.exchange_dir or layout.exchange_dir(FLAGS.model_dir)
  files, sample_dir = _data_files(FLAGS.model_dir)
  overrides = {"strategy": strategy, **files}
  if FLAGS.teacher_graph:
    overrides["teacher_graph"] = FLAGS.teacher_graph
  try:
    shape = launcher.group_shape(strategy, **{
        name: value for name, value in (("workers_per_group", FLAGS.workers_per_group),
                                        ("ps_per_group", FLAGS.ps_per_group))
        if value is not None})
    config = trainer.TrainConfig(**overrides)
    for group in range(FLAGS.num_groups):
      trainer.validate(config, group=group, num_groups=FLAGS.num_groups,
                       exchange_dir=exchange_dir)
    if FLAGS.pin_groups:
      launcher.split_cpus(FLAGS.num_groups)
  except ValueError as e:
    common.exit_with_error(common.first_line(e))
  for flag, directory in (("--model_dir", FLAGS.model_dir), ("--exchange_dir", exchange_dir)):
    try:
      exchange.check_writable(directory)
    except (OSError, tf.errors.OpError) as e:
      reason = getattr(e, "message", None) or getattr(e, "strerror", None) or str(e)
      common.exit_with_error(f"{flag}: cannot write to {directory} ({reason}): make it writable "
                             "by this job or pass another directory")
  if sample_dir:
    logging.warning("trainer.train.train_files/eval_files are not bound: training on generated "
                    "Criteo-format sample data in %s (bind them to train on your data)",
                    sample_dir)
    demo.sample_data(sample_dir)
  gin_bindings = list(FLAGS.gin_bindings) + [f"trainer.train.{name} = {value!r}"
                                              for name, value in files.items()]
  if FLAGS.teacher_graph:
    gin_bindings.append(f"trainer.train.teacher_graph = '{FLAGS.teacher_graph}'")
  try:
    dirs = launcher.launch(FLAGS.model_dir, FLAGS.num_groups, exchange_dir=FLAGS.exchange_dir,
                           gin_files=FLAGS.gin_file, gin_bindings=gin_bindings, shape=shape,
                           max_restarts=FLAGS.max_restarts,
                           on_group_failure=FLAGS.on_group_failure,
                           pin_groups=FLAGS.pin_groups)
  except launcher.GroupFailedError as e:
    logging.error("%s", e)
    sys.exit(1)
  except KeyboardInterrupt:
    logging.error("interrupted: stopped every group")
    sys.exit(130)
  for group, path in dirs.items():
    print(f"group {group}: {path}")


def _data_files(model_dir: str) -> Tuple[Dict[str, List[str]], Optional[str]]:
  """The files to bind when no data is bound (generated sample data, and where to generate
  it); nothing when both are bound; a usage error when only one is."""
  bound = []
  for name in ("train_files", "eval_files"):
    try:
      gin.query_parameter(f"trainer.train.{name}")
      bound.append(name)
    except ValueError:
      pass
  if len(bound) == 2:
    return {}, None
  if bound:
    missing = ({"train_files", "eval_files"} - set(bound)).pop()
    common.exit_with_error(f"trainer.train.{bound[0]} is bound but trainer.train.{missing} is "
                           f"not: pass e.g. --gin_bindings=\"trainer.train.{missing} = "
                           f"['data/{missing.split('_')[0]}-*']\"")
  data_dir = os.path.abspath(os.path.join(model_dir, "data"))
  train, evaluation = demo.sample_data_files(data_dir)
  return {"train_files": train, "eval_files": evaluation}, data_dir


def _gin_strategy() -> str:
  try:
    return gin.query_parameter("trainer.train.strategy")
  except ValueError:  # not bound
    return "one_device"


def run():
  common.PROGRAM[0] = "tf-codistill-launch"
  app.run(main, flags_parser=common.parse_flags_or_exit)


if __name__ == "__main__":
  run()
