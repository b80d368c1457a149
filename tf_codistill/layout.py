"""Where a run writes what: every file and folder of a job and of a group's model directory.

A public interface: the trainer and launcher write these, benchmarks, tests and dashboards read
them::

    <job model_dir>/              tf-codistill-launch --model_dir
      launch_events.jsonl         the launcher's events: launched, restarted, finished, failed
      config.gin                  the job's whole checked configuration, the only gin file every
                                  task (a restarted one too) reads
      exchange/                   the exchange directory (exchange/directory.py), unless
                                  --exchange_dir
      group_<i>/                  one group's model_dir (tf-codistill-train --model_dir)
        <task>_<k>.log            each task's log (chief_0.log, worker_1.log, ps_0.log)
        results.json              final metrics and counters of the group's chief
        progress.jsonl            one JSON line per epoch: step, wall time, train/val metrics
        heartbeat.json            step, start step, time, pid; rewritten every few seconds
        tb/                       TensorBoard: epoch metrics; tb/steps: step-level scalars
        export/                   the final model as a SavedModel (serving_default signature)
        eval_predictions.npz      final validation probabilities and labels (if asked for)
        eval_predictions/         step_<n>.npz at every evaluation (prediction history)
        step_timeline.json        every timed step and refresh/publish window (if asked for)
        backup/                   tf_keras BackupAndRestore state (not parameter servers)
        checkpoints/              CheckpointManager checkpoints (parameter servers)
"""

from __future__ import annotations

import dataclasses
import os

EXCHANGE = "exchange"
LAUNCH_EVENTS = "launch_events.jsonl"
JOB_CONFIG = "config.gin"
RESULTS = "results.json"
PROGRESS = "progress.jsonl"
HEARTBEAT = "heartbeat.json"
TENSORBOARD = "tb"
STEP_SUMMARIES = os.path.join("tb", "steps")
EXPORT = "export"
EVAL_PREDICTIONS = "eval_predictions.npz"
PREDICTION_HISTORY = "eval_predictions"
STEP_TIMELINE = "step_timeline.json"
BACKUP = "backup"
CHECKPOINTS = "checkpoints"


def group_dir(job_dir: str, group: int) -> str:
  """Group ``group``'s model directory inside a launched job's directory."""
  return os.path.join(job_dir, f"group_{group}")


def group_run(job_dir: str, group: int) -> "RunDir":
  """The paths of group ``group``'s model directory inside a launched job's directory."""
  return RunDir(group_dir(job_dir, group))


def launch_events(job_dir: str) -> str:
  """The launcher's event log (launcher.EventLog) of a job."""
  return os.path.join(job_dir, LAUNCH_EVENTS)


def job_config(job_dir: str) -> str:
  """A launched job's configuration file (jobs.launch_job writes it; its tasks parse it)."""
  return os.path.join(job_dir, JOB_CONFIG)


def exchange_dir(job_dir: str) -> str:
  """A launched job's default exchange directory."""
  return os.path.join(job_dir, EXCHANGE)


@dataclasses.dataclass(frozen=True)
class RunDir:
  """The paths of one group's model directory."""
  path: str

  def _join(self, name: str) -> str:
    return os.path.join(self.path, name)

  @property
  def results(self) -> str:
    return self._join(RESULTS)

  @property
  def progress(self) -> str:
    return self._join(PROGRESS)

  @property
  def heartbeat(self) -> str:
    return self._join(HEARTBEAT)

  @property
  def tensorboard(self) -> str:
    return self._join(TENSORBOARD)

  @property
  def step_summaries(self) -> str:
    return self._join(STEP_SUMMARIES)

  @property
  def export(self) -> str:
    return self._join(EXPORT)

  @property
  def eval_predictions(self) -> str:
    return self._join(EVAL_PREDICTIONS)

  @property
  def prediction_history(self) -> str:
    return self._join(PREDICTION_HISTORY)

  @property
  def step_timeline(self) -> str:
    return self._join(STEP_TIMELINE)

  @property
  def backup(self) -> str:
    return self._join(BACKUP)

  @property
  def checkpoints(self) -> str:
    return self._join(CHECKPOINTS)

  def task_log(self, task_type: str, task_id: int) -> str:
    """The log of task ``task_type:task_id`` of a launched group (e.g. ``chief_0.log``)."""
    return self._join(f"{task_type}_{task_id}.log")
