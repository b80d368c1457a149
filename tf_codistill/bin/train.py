"""tf-codistill-train: trains one codistillation group (or one task of a group's cluster).

``kill -USR1 <pid>`` prints every thread's Python stack to the task's log (a stuck task).
"""

import faulthandler
import signal

from absl import app
from absl import flags

from tf_codistill import trainer
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
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  common.parse_gin_or_exit(FLAGS.gin_file, FLAGS.gin_bindings)
  try:
    trainer.train(FLAGS.model_dir, group=FLAGS.group, num_groups=FLAGS.num_groups,
                  exchange_dir=FLAGS.exchange_dir)
  except trainer.ConfigurationError as e:
    raise app.UsageError(str(e)) from None


def run():
  faulthandler.register(signal.SIGUSR1, all_threads=True)
  app.run(main)


if __name__ == "__main__":
  run()
