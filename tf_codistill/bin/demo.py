"""tf-codistill-demo: the README's main command; a small 2-way codistillation job and a baseline."""

from absl import app
from absl import flags

import tf_codistill as tfc

flags.DEFINE_string("work_dir", "demo_run", "Where the demo writes data, models and logs.")
flags.DEFINE_integer("train_rows", 1_600_000, "Generated training rows.")
flags.DEFINE_integer("eval_rows", 50_000, "Generated validation rows.")
flags.DEFINE_integer("steps", 1500, "Training steps per model.")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  tfc.run_demo(FLAGS.work_dir, train_rows=FLAGS.train_rows, eval_rows=FLAGS.eval_rows,
               steps=FLAGS.steps)


def run():
  app.run(main)


if __name__ == "__main__":
  run()
