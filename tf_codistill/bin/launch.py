"""tf-codistill-launch: runs n codistillation groups as processes on this machine."""

import sys

from absl import app
from absl import flags
from absl import logging

from tf_codistill import launcher
from tf_codistill.bin import common

common.define_gin_flags()
flags.DEFINE_string("model_dir", None, "Job directory; group i writes to model_dir/group_<i>.",
                    required=True)
flags.DEFINE_integer("num_groups", 2, "Number of codistillation groups.", lower_bound=1)
flags.DEFINE_string("exchange_dir", None, "Shared exchange directory (default model_dir/exchange).")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # Fail on a bad config here, once, rather than in every group's process.
  common.parse_gin_or_exit(FLAGS.gin_file, FLAGS.gin_bindings)
  try:
    dirs = launcher.launch(FLAGS.model_dir, FLAGS.num_groups, exchange_dir=FLAGS.exchange_dir,
                           gin_files=FLAGS.gin_file, gin_bindings=FLAGS.gin_bindings)
  except launcher.GroupFailedError as e:
    logging.error("%s", e)
    sys.exit(1)
  except KeyboardInterrupt:
    logging.error("interrupted: stopped every group")
    sys.exit(130)
  for group, path in dirs.items():
    print(f"group {group}: {path}")


def run():
  app.run(main)


if __name__ == "__main__":
  run()
