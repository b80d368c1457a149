"""tf-codistill-launch: runs n codistillation groups as processes on this machine."""

import signal
import sys

from absl import app
from absl import flags
from absl import logging

import tf_codistill as tfc
from tf_codistill.bin import common
from tf_codistill.launch import launcher

common.define_gin_flags()
flags.DEFINE_string("model_dir", "codistill_run",
                    "Job directory; group i writes to model_dir/group_<i>.")
flags.DEFINE_integer("num_groups", 2, "Number of codistillation groups.", lower_bound=1)
flags.DEFINE_string("exchange_dir", None, "Shared exchange directory (default model_dir/exchange).")
flags.DEFINE_list("groups", None,
                  "Run only these of the job's groups here (e.g. 1), the others on other "
                  "machines given the same --num_groups and --exchange_dir (default: all).")
flags.DEFINE_string("strategy", None,
                    "Strategy inside each group: one_device, mirrored, multi_worker_mirrored or "
                    "parameter_server (default: the gin binding tfc.Group.strategy, else "
                    "one_device).")
flags.DEFINE_integer("workers_per_group", None,
                     "Worker tasks per group besides the chief (default: the gin binding "
                     "tfc.Group.workers_per_group, else 0).", lower_bound=0)
flags.DEFINE_integer("ps_per_group", None, "Parameter-server tasks per group (default: the gin "
                     "binding tfc.Group.ps_per_group, else 0).", lower_bound=0)
flags.DEFINE_integer("max_restarts", None,
                     "Restarts allowed per group after a task dies: a lost parameter-server "
                     "worker alone, else the group from its last checkpoint (default 3).",
                     lower_bound=0)
flags.DEFINE_float("stall_timeout_s", launcher.DEFAULT_STALL_TIMEOUT_S,
                   "A group whose chief's step has not moved for this long (a hang) dumps every "
                   "task's stacks into its log and is restarted like a failed one (0: never).",
                   lower_bound=0.0)
flags.DEFINE_string("on_group_failure", "stop_all",
                    "When a group fails for good: stop every group (stop_all), or let its peers "
                    "continue (continue).")
flags.DEFINE_string("teacher_graph", None,
                    "Which peers each group distills from: every other group (all_to_all) or its "
                    "predecessor (ring) (default: the gin binding tfc.Exchange.teacher_graph, "
                    "else all_to_all).")
flags.DEFINE_bool("isolate_network", True,
                  "Run every task of the launch in one private network namespace (loopback only): "
                  "TF's servers listen on all interfaces and run any graph sent to them.")
flags.DEFINE_bool("allow_exposed_ports", False,
                  "Start the tasks on this machine's network where no private namespace can be "
                  "made (or with --noisolate_network): their servers are then reachable by "
                  "anyone who can reach this machine.")
flags.DEFINE_bool("pin_groups", False, "Pin each group's tasks to its own equal share of this "
                  "machine's CPUs (as if each group had its own machine).")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    common.exit_with_error(f"unexpected arguments: {argv[1:]}")
  policy = {} if FLAGS.max_restarts is None else {"max_restarts": FLAGS.max_restarts}
  if FLAGS.groups is not None:
    given = ",".join(FLAGS.groups)
    if not FLAGS.groups or not all(g.strip().isdigit() for g in FLAGS.groups):
      common.exit_with_error(f"--groups={given}: give group indices, e.g. --groups=1 or "
                             "--groups=0,2")
    policy["groups"] = [int(g) for g in FLAGS.groups]
    if max(policy["groups"]) >= FLAGS.num_groups:
      common.exit_with_error(f"--groups={given} is out of range for "
                             f"--num_groups={FLAGS.num_groups}")
  try:
    dirs = tfc.launch_job(
        FLAGS.model_dir, FLAGS.num_groups, gin_files=FLAGS.gin_file,
        gin_bindings=FLAGS.gin_bindings, exchange_dir=FLAGS.exchange_dir, strategy=FLAGS.strategy,
        workers_per_group=FLAGS.workers_per_group, ps_per_group=FLAGS.ps_per_group,
        teacher_graph=FLAGS.teacher_graph, on_group_failure=FLAGS.on_group_failure,
        pin_groups=FLAGS.pin_groups, isolate_network=FLAGS.isolate_network,
        allow_exposed_ports=FLAGS.allow_exposed_ports, stall_timeout_s=FLAGS.stall_timeout_s,
        **policy)
  except tfc.ConfigurationError as e:
    common.exit_with_error(common.first_line(e))
  except tfc.GroupFailedError as e:
    logging.error("%s", e)
    sys.exit(1)
  except KeyboardInterrupt as e:
    signum = getattr(e, "signum", signal.SIGINT)  # Ctrl-C before the launcher's handler is set
    logging.error("interrupted by %s: stopped every group", signal.Signals(signum).name)
    sys.exit(128 + signum)
  for group, path in dirs.items():
    print(f"group {group}: {path}")


def run():
  common.PROGRAM[0] = "tf-codistill-launch"
  app.run(main, flags_parser=common.parse_flags_or_exit)


if __name__ == "__main__":
  run()
