"""tf-codistill-train: trains one codistillation group (or one task of a group's cluster).

``kill -USR1 <pid>`` prints every thread's Python stack to the task's log (a stuck task).
Exit statuses: 0 done; 2 configuration error, 3 bad input data, 4 non-finite loss (one line on
stderr says what to fix; the launcher does not restart these); anything else is a crash.
"""

from absl import app
from absl import flags

import tf_codistill as tfc
from tf_codistill import errors
from tf_codistill.bin import common

common.define_gin_flags()
flags.DEFINE_string("model_dir", None, "Where this group writes checkpoints, summaries, results.",
                    required=True)
flags.DEFINE_integer("group", 0, "Index of this group, in [0, num_groups).")
flags.DEFINE_integer("num_groups", 1, "Number of codistillation groups.")
flags.DEFINE_string("exchange_dir", None, "Shared directory groups publish their models to.")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    common.exit_with_error(f"unexpected arguments: {argv[1:]}")
  common.parse_gin_or_exit(FLAGS.gin_file, FLAGS.gin_bindings)
  try:
    tfc.train(FLAGS.model_dir, group=FLAGS.group, num_groups=FLAGS.num_groups,
              exchange_dir=FLAGS.exchange_dir)
  except errors.ConfigurationError as e:
    common.exit_with_error(common.first_line(e), errors.CONFIGURATION_EXIT_CODE)
  except tfc.DataError as e:
    common.exit_with_error(f"bad input data: {common.first_line(e)}", errors.DATA_EXIT_CODE)
  except errors.NonFiniteLossError as e:
    common.exit_with_error(common.first_line(e), errors.NON_FINITE_EXIT_CODE)


def run():
  common.PROGRAM[0] = "tf-codistill-train"
  app.run(main, flags_parser=common.parse_flags_or_exit)


if __name__ == "__main__":
  run()
