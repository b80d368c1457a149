"""tf-codistill-churn: prediction churn between two or more SavedModels on a dataset."""

import json

import numpy as np
from absl import app
from absl import flags

import tf_codistill as tfc
from data_pipelines import criteo
from tf_codistill.bin import common

common.define_gin_flags()
flags.DEFINE_multi_string("saved_model", [],
                          "SavedModel dirs (exports or exchange versions); >= 2.")
flags.DEFINE_string("data", None, "File pattern of the evaluation data.", required=True)
flags.DEFINE_enum("output", None, ["sigmoid", "softmax"],
                  "How logits become probabilities (default: the bound trainer.train.task's, "
                  "else sigmoid).")
flags.DEFINE_bool("raw", False, "Read --data as raw lines (e.g. Criteo TSV) and predict through "
                  "each model's serving_raw signature, which parses them inside the model.")
flags.DEFINE_integer("batch_size", 4096, "Batch size for prediction.")
flags.DEFINE_string("json_out", None, "Optional path for the results as JSON.")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if len(FLAGS.saved_model) < 2:
    raise app.UsageError("give at least two --saved_model paths")
  common.parse_gin_or_exit(FLAGS.gin_file, FLAGS.gin_bindings)
  # The data pipeline and task of the gin config (Criteo and sigmoid when none is bound).
  if FLAGS.raw:
    try:
      dataset = tfc.raw_lines(FLAGS.data, FLAGS.batch_size)
    except FileNotFoundError as e:
      common.exit_with_error(f"--data: {e}")
  else:
    dataset_fn = tfc.gin_value("tfc.Data.dataset_fn") or criteo.make_dataset
    dataset = dataset_fn(FLAGS.data, FLAGS.batch_size)
  task = tfc.gin_value("trainer.train.task")
  output = FLAGS.output or (task.output if task is not None else "sigmoid")
  try:
    preds = [tfc.predict_probabilities(p, dataset, output) for p in FLAGS.saved_model]
  except (ValueError, FileNotFoundError) as e:
    common.exit_with_error(common.first_line(e))
  pairs = tfc.pairwise_churn(preds, output)
  print(f"{'model a':>8} {'model b':>8} {'mean |pa-pb|':>13} {'disagreement':>13}")
  for pair in pairs:
    print(f"{pair['a']:>8} {pair['b']:>8} {pair['mean_abs_diff']:>13.5f} "
          f"{pair['disagreement']:>13.5f}")
  summary = {"models": FLAGS.saved_model, "pairs": pairs,
             "mean_abs_diff": float(np.mean([p["mean_abs_diff"] for p in pairs])),
             "disagreement": float(np.mean([p["disagreement"] for p in pairs])),
             "examples": int(preds[0].shape[0])}
  print(f"mean over pairs: mean |pa-pb| = {summary['mean_abs_diff']:.5f}, "
        f"disagreement = {summary['disagreement']:.5f} on {summary['examples']} examples")
  if FLAGS.json_out:
    with open(FLAGS.json_out, "w") as f:
      json.dump(summary, f, indent=2)


def run():
  common.PROGRAM[0] = "tf-codistill-churn"
  app.run(main, flags_parser=common.parse_flags_or_exit)


if __name__ == "__main__":
  run()
