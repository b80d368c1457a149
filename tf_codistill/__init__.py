"""tf-codistill: codistillation (online distillation) for TensorFlow distributed training.

The public API, for users' own scripts (``import tf_codistill as tfc``):

* ``tfc.CodistillModel(student, exchange=tfc.Exchange(...))``: a tf_keras Model whose ``fit``
  trains ``student`` on its task loss plus a distillation term toward stale copies of its peer
  groups, publishing the student and refreshing the teachers by itself, under every
  ``tf.distribute`` strategy.
* ``tfc.TeacherSpec``: how the model builds its teacher copies (a clone at a precision, or a
  factory of another form), given as ``CodistillModel(teachers=...)``; ``tfc.Distillation``: the
  distillation term (weight, burn-in, loss kind, temperature), ``CodistillModel(distillation=...)``.
* ``tfc.Exchange``: where and how a group exchanges models with its peers;
  ``tfc.PublishFormat``: whole SavedModels, or lean versions (bfloat16/int8 weights, row deltas).
* ``tfc.ParameterAveraging``: parameter averaging between the groups every H steps (DiLoCo's
  outer Nesterov step, or local SGD), beside or instead of distillation (``Exchange.averaging``).
* ``tfc.prediction_churn``: how much two models' predictions on a dataset differ;
  ``tfc.predict_probabilities`` reads SavedModels (exports or exchange versions) and
  ``tfc.pairwise_churn`` compares their predictions; ``tfc.churn``: the same figures for two
  arrays of predicted probabilities.
* ``tfc.export``: writes a model as a SavedModel with the serving signature peers and servers
  read, and with ``raw_parser`` (e.g. ``criteo.raw_parser(num_buckets)``) a ``serving_raw``
  signature that parses raw lines inside the model; ``tfc.raw_lines``: batches of raw lines to
  predict on.
* ``tfc.TrainConfig``, ``tfc.train``, ``tfc.GroupTrainer``: one group's training as the
  binaries run it (gin-configurable: ``trainer.train.*``); ``tfc.Data``: what it reads (files,
  parser, global batch, split between groups; ``tfc.Data.*``); ``tfc.Group``: its shape
  (strategy, tasks, gradient all-reduce; ``tfc.Group.*``); ``tfc.Checkpoints``: when it
  checkpoints (``tfc.Checkpoints.*``) and whether a restart resumes its input too;
  ``tfc.resume_step``: the step a stopped group's run resumes from.
* ``tfc.launch_job``: n groups on this machine, each a local TF cluster (its tasks in the
  launch's private network namespace), their configuration checked once, supervised and
  restarted after faults (what ``tf-codistill-launch`` runs); ``tfc.launch_groups``: the same
  without the checks, for a group shape and gin configuration already known to be valid.
* ``tfc.parse_gin``: gin files and bindings parsed, every bound value checked against its type;
  ``tfc.gin_value``: what the parsed configuration binds to one parameter (None: unbound).
* ``tfc.run_demo``: the README's demo (a small 2-way job and its baseline, on generated data).
* ``tfc.ConfigurationError``, ``tfc.DataError``, ``tfc.NonFiniteLossError``,
  ``tfc.GroupFailedError``, ``tfc.AveragingError``: what fails; ``tf_codistill.errors``: the
  exit statuses of a task that failed for good.

Names are resolved on first use, so importing the package (e.g. by the launcher) stays cheap.
"""

import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "CodistillModel": "tf_codistill.training.model",
    "clone_architecture": "tf_codistill.training.model",
    "Exchange": "tf_codistill.exchange.config",
    "TeacherSpec": "tf_codistill.teachers.spec",
    "Distillation": "tf_codistill.losses",
    "PublishFormat": "tf_codistill.exchange.lean_versions",
    "ParameterAveraging": "tf_codistill.exchange.averaging",
    "AveragingError": "tf_codistill.exchange.averaging",
    "churn": "tf_codistill.metrics",
    "prediction_churn": "tf_codistill.metrics",
    "predict_probabilities": "tf_codistill.metrics",
    "pairwise_churn": "tf_codistill.metrics",
    "ensemble_scores": "tf_codistill.metrics",
    "raw_lines": "tf_codistill.serving",
    "parse_gin": "tf_codistill.launch.gin_config",
    "gin_value": "tf_codistill.launch.gin_config",
    "run_demo": "tf_codistill.launch.demo",
    "export": "tf_codistill.training.model",
    "TrainConfig": "tf_codistill.training.train_config",
    "Data": "tf_codistill.training.inputs",
    "Group": "tf_codistill.training.group",
    "Checkpoints": "tf_codistill.training.checkpointing",
    "resume_step": "tf_codistill.training.checkpointing",
    "train": "tf_codistill.training.trainer",
    "GroupTrainer": "tf_codistill.training.trainer",
    "launch_groups": "tf_codistill.launch.launcher",
    "launch_job": "tf_codistill.launch.jobs",
    "GroupFailedError": "tf_codistill.launch.launcher",
    "ConfigurationError": "tf_codistill.errors",
    "NonFiniteLossError": "tf_codistill.errors",
    "DataError": "data_pipelines.records",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name):
  if name in _PUBLIC:
    return getattr(importlib.import_module(_PUBLIC[name]), name)
  raise AttributeError(f"module 'tf_codistill' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + __all__)
