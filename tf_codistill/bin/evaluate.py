"""tf-codistill-evaluate: scores SavedModels and their ensemble on the same evaluation data.

The data pipeline, task and batch come from the gin config a run trained with (its
``tfc.Data.dataset_fn``, ``eval_files`` and ``batch_size``, and ``trainer.train.task``), so each
model's score is the one its training run reported and the ensemble (the mean of the models'
probabilities) is scored on exactly the same examples:

  tf-codistill-evaluate --gin_file=gin/lm/debian.gin --saved_model=a/export \
      --saved_model=b/export --json_out=ensemble.json
"""

import json
import os
import sys

import tensorflow as tf
from absl import app
from absl import flags

import tf_codistill as tfc
from data_pipelines import criteo
from tf_codistill.bin import common
from tf_codistill.exchange import directory
from tf_codistill.training import results

common.define_gin_flags()
flags.DEFINE_multi_string("saved_model", [], "SavedModel dirs (exports or exchange versions).")
flags.DEFINE_string("data", None, "File pattern of the evaluation data (default: the bound "
                    "tfc.Data.eval_files).")
flags.DEFINE_integer("batch_size", None, "Batch size (default: the bound tfc.Data."
                     "batch_size, else 4096); scores do not depend on it.")
flags.DEFINE_string("json_out", None, "Optional path for the scores as JSON.")
flags.DEFINE_string("predictions_out", None, "Optional .npz for the ensemble's probabilities "
                    "and the labels of the first --prediction_batches batches (for churn).")
flags.DEFINE_integer("prediction_batches", None, "Batches --predictions_out keeps (default: "
                     "the bound trainer.train.prediction_batches, else all, as a run keeps).")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not FLAGS.saved_model:
    raise app.UsageError("give at least one --saved_model path")
  common.parse_gin_or_exit(FLAGS.gin_file, FLAGS.gin_bindings)
  files = [FLAGS.data] if FLAGS.data else list(tfc.gin_value("tfc.Data.eval_files") or [])
  if not files:
    raise app.UsageError("give --data, or bind tfc.Data.eval_files")
  batch = FLAGS.batch_size or tfc.gin_value("tfc.Data.batch_size") or 4096
  task = tfc.gin_value("trainer.train.task")
  output = task.output if task is not None else "sigmoid"
  dataset_fn = tfc.gin_value("tfc.Data.dataset_fn") or criteo.make_dataset
  try:
    keep = (FLAGS.prediction_batches or tfc.gin_value("trainer.train.prediction_batches")
            or sys.maxsize) if FLAGS.predictions_out else 0
    scores = tfc.ensemble_scores(FLAGS.saved_model, dataset_fn(files, batch), output,
                                 keep_batches=keep)
  except (ValueError, FileNotFoundError, OSError) as e:
    common.exit_with_error(common.first_line(e))
  for out in (FLAGS.predictions_out, FLAGS.json_out):
    if out and os.path.dirname(out):
      tf.io.gfile.makedirs(os.path.dirname(out))
  if FLAGS.predictions_out:
    results.save_npz(FLAGS.predictions_out, probs=scores.pop("probs"),
                     labels=scores.pop("labels"))
  scores.update(models=list(FLAGS.saved_model), data=files, output=output)
  for path, member in zip(FLAGS.saved_model, scores["members"]):
    print(f"{path}: " + " ".join(f"{k}={v:.5f}" for k, v in sorted(member.items())))
  print(f"ensemble of {len(FLAGS.saved_model)}: "
        + " ".join(f"{k}={v:.5f}" for k, v in sorted(scores["ensemble"].items()))
        + f" on {scores['examples']} examples")
  if FLAGS.json_out:
    directory.write_atomically(FLAGS.json_out, json.dumps(scores, indent=1, sort_keys=True))


def run():
  common.PROGRAM[0] = "tf-codistill-evaluate"
  app.run(main, flags_parser=common.parse_flags_or_exit)


if __name__ == "__main__":
  run()
