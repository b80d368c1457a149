"""How one group trains (``trainer.train.*``): the typed configuration and its one check."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

import gin
import tf_keras as keras

from tf_codistill import errors
from tf_codistill import losses
from tf_codistill.exchange import config as exchange_config
from tf_codistill.models import ctr
from tf_codistill.optim import fusion as fusion_lib
from tf_codistill.teachers import spec as teacher_spec
from tf_codistill.training import checkpointing
from tf_codistill.training import group as group_lib
from tf_codistill.training import inputs
from tf_codistill.training import tasks as tasks_lib

OPTIMIZERS = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD,
              "adagrad": keras.optimizers.Adagrad, "rmsprop": keras.optimizers.RMSprop}
ConfigurationError = errors.ConfigurationError
# Settings that moved or were renamed: old trainer.train name -> (what to bind now, why); an
# old name is an error naming the new one.
_TO_EXCHANGE = "bind trainer.train.exchange = @tfc.Exchange"
_TO_DISTILLATION = "the distillation term is tfc.Distillation's"
RENAMED = {
    "exchange_every_steps": ("tfc.Exchange.publish_every_steps", _TO_EXCHANGE),
    "codistill": ("trainer.train.exchange",
                  "True: bind trainer.train.exchange = @tfc.Exchange; False: leave it unbound "
                  "(None)"),
    **{name: (f"tfc.Exchange.{name}", _TO_EXCHANGE)
       for name in ("publish_every_steps", "keep_last", "poll_interval_s", "publish_format",
                    "wait_for_first_teachers_s", "teacher_graph")},
    "averaging": ("tfc.Exchange.averaging",
                  f"{_TO_EXCHANGE}, and tfc.Exchange.distill = False unless the groups also "
                  "codistilled"),
    "teacher_precision": ("tfc.TeacherSpec.precision", "the teachers belong to the model"),
    "teacher_fn": ("tfc.TeacherSpec.student_factory", "the teachers belong to the model"),
    "data_split": ("tfc.Data.split", "the data is tfc.Data's"),
    **{name: (f"tfc.Data.{name}", "the data is tfc.Data's")
       for name in ("train_files", "eval_files", "dataset_fn", "raw_parser", "batch_size",
                    "shuffle_buffer")},
    **{name: (f"tfc.Group.{name}", "the group's shape is tfc.Group's")
       for name in ("strategy", "allreduce_dtype")},
    "checkpoint_every_steps": ("tfc.Checkpoints.every_steps", "checkpointing is tfc.Checkpoints'"),
    **{name: (f"tfc.Distillation.{name}", _TO_DISTILLATION)
       for name in ("alpha", "burn_in_steps", "temperature")},
    "distill_kind": ("tfc.Distillation.kind", _TO_DISTILLATION),
}


# Learning-rate schedules for trainer.train.learning_rate, e.g.
#   trainer.train.learning_rate = @schedules.PiecewiseConstantDecay()
#   schedules.PiecewiseConstantDecay.boundaries = [1000]
#   schedules.PiecewiseConstantDecay.values = [1e-3, 1e-4]
for _schedule in (keras.optimizers.schedules.PiecewiseConstantDecay,
                  keras.optimizers.schedules.ExponentialDecay,
                  keras.optimizers.schedules.CosineDecay):
  gin.external_configurable(_schedule, module="schedules")


@gin.configurable("train", module="trainer")
@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How one group trains: every ``trainer.train.<name>`` gin binding, typed; ``validate``
  checks it once, in the launcher for every group and in every task. The parts configured by
  gin classes of their own are made when the config is, from their bindings.

  Attributes:
    shape: the group's shape (``tfc.Group``): strategy (with a cluster, the tasks come from
      TF_CONFIG; a parameter-server group's workers and ps tasks only serve), task counts,
      gradient all-reduce.
    data: what the group reads (``tfc.Data``): files, parser, global batch, split between groups.
    model_fn: builds the student; ``task`` (default ``tasks.BinaryTask()``) sets the loss,
      metrics and results keys.
    train_steps, steps_per_epoch, steps_per_execution, eval_steps: exactly ``train_steps``
      steps, evaluated every ``steps_per_epoch`` on ``eval_steps`` batches (None: all).
    optimizer, learning_rate: one of OPTIMIZERS, at a rate or a ``schedules.*`` schedule.
    exchange: ``@tfc.Exchange`` (None: the group trains alone), called with the exchange
      directory, this group and the number of groups: distillation from the peers' newest
      versions (publish interval, format, teacher graph), parameter averaging
      (``tfc.Exchange.averaging``: DiLoCo, local SGD), or both.
    teachers: how CodistillModel builds the teacher copies (``tfc.TeacherSpec``: a clone at a
      precision, or a factory, e.g. ``tfc.TeacherSpec.student_factory = @models.ctr_teacher``).
    distillation: CodistillModel's distillation term (``tfc.Distillation``: weight, burn-in,
      loss kind, temperature).
    label_smoothing, smoothing_prior: the label-smoothing baseline ('uniform' or 'unigram').
    checkpoints: how the group checkpoints and resumes (``tfc.Checkpoints``).
    summary_every_steps, seed, verbose: TensorBoard scalars' interval, the seed, fit's verbosity.
    save_eval_predictions, prediction_batches, prediction_history: keep the eval predictions
      (``eval_predictions.npz``, at most ``prediction_batches`` batches; with
      ``prediction_history`` also at every evaluation, for churn against loss).
    fusion, jit_compile: fused optimizer updates ('none', 'kernels', 'backward', 'forward';
      fusion.py) and XLA.
    intra_op_threads, inter_op_threads: this task's thread pools (0: TF's default), also a
      serving task's.
    heartbeat_every_s: how often the chief writes ``heartbeat.json`` (the launcher's stall
      watchdog reads it).
    max_wall_seconds: ends training early, as if ``train_steps`` were reached (not for
      ``multi_worker_mirrored``).
    save_step_timeline: writes every timed step interval (under parameter servers one per
      scheduled step, step_timing.ClosureTimer) and refresh/publish window (benchmarks/soak.py).

  Files: layout.RunDir.
  """
  # Made when the config is: the Group and Data of the tfc.Group.* and tfc.Data.* bindings.
  shape: group_lib.Group = dataclasses.field(default_factory=group_lib.Group)
  data: inputs.Data = dataclasses.field(default_factory=inputs.Data)
  model_fn: Callable[[], keras.Model] = ctr.ctr_model
  task: Optional[tasks_lib.Task] = None
  train_steps: int = 1000
  steps_per_epoch: int = 250
  steps_per_execution: int = 1
  eval_steps: Optional[int] = None
  optimizer: str = "adam"
  learning_rate: Union[float, keras.optimizers.schedules.LearningRateSchedule] = 1e-3
  exchange: Optional[Callable[..., exchange_config.Exchange]] = None
  # Made when the config is: the TeacherSpec of the tfc.TeacherSpec.* bindings.
  teachers: teacher_spec.TeacherSpec = dataclasses.field(default_factory=teacher_spec.TeacherSpec)
  # Made when the config is: the Distillation of the tfc.Distillation.* bindings.
  distillation: losses.Distillation = dataclasses.field(default_factory=losses.Distillation)
  label_smoothing: float = 0.0
  smoothing_prior: str = "uniform"
  # Made when the config is: the Checkpoints of the tfc.Checkpoints.* bindings.
  checkpoints: checkpointing.Checkpoints = dataclasses.field(
      default_factory=checkpointing.Checkpoints)
  summary_every_steps: int = 50
  seed: int = 0
  save_eval_predictions: bool = False
  prediction_batches: Optional[int] = None
  prediction_history: bool = False
  fusion: str = "none"
  jit_compile: bool = False
  intra_op_threads: int = 0
  inter_op_threads: int = 0
  heartbeat_every_s: float = 5.0
  max_wall_seconds: Optional[float] = None
  save_step_timeline: bool = False
  verbose: int = 2

  @property
  def exchanges(self) -> bool:
    """Whether the group exchanges anything with its peers (distillation or averaging)."""
    return self.exchange is not None

  @property
  def epochs(self) -> int:
    """``fit``'s epochs: ``train_steps`` in epochs of ``steps_per_epoch`` (the last one may be
    cut short by ``StepLimit``)."""
    return max(1, -(-self.train_steps // self.steps_per_epoch))


def check_renamed(names: Sequence[str]) -> None:
  """Raises ConfigurationError for a setting given by a name it no longer has."""
  for name in names:
    if name in RENAMED:
      new, what = RENAMED[name]
      raise ConfigurationError(
          f"trainer.train.{name} is now {new} ({what}): rename the binding")


def validate(config: TrainConfig, *, group: int, num_groups: int,
             exchange_dir: Optional[str]) -> None:
  """Raises ConfigurationError naming the first setting of group ``group`` that cannot work.

  The one check of a configuration: the launcher runs it for every group before starting any,
  and every task before it trains.
  """
  _validate(group, num_groups, config.exchanges, exchange_dir, config.optimizer)
  _check_parts(config)
  fusion_lib.check_mode(config.fusion, "trainer.train.fusion", config.shape.asynchronous)
  _validate_numbers(train_steps=config.train_steps, steps_per_epoch=config.steps_per_epoch,
                    steps_per_execution=config.steps_per_execution)
  exchange = exchange_for(config, exchange_dir or "", group, num_groups)  # checks itself
  if exchange is not None:
    exchange.check_strategy(config.shape.asynchronous)
  if config.max_wall_seconds is not None and config.shape.strategy == "multi_worker_mirrored":
    raise ConfigurationError("trainer.train.max_wall_seconds cannot end a multi_worker_mirrored "
                             "group (its workers would wait for the chief): unbind it")
  config.data.check()


def _check_parts(config: TrainConfig) -> None:
  """Raises ConfigurationError for a part bound to something other than its config class (each
  part checks its own values)."""
  for name, kind in (("shape", group_lib.Group), ("data", inputs.Data),
                     ("checkpoints", checkpointing.Checkpoints),
                     ("teachers", teacher_spec.TeacherSpec),
                     ("distillation", losses.Distillation)):
    if not isinstance(getattr(config, name), kind):
      raise ConfigurationError(
          f"trainer.train.{name}={getattr(config, name)!r} is not a tfc.{kind.__name__}: bind "
          f"@tfc.{kind.__name__}() (its fields as tfc.{kind.__name__}.<field>) or leave it "
          "unbound")


def exchange_for(config: TrainConfig, directory: str, group: int, num_groups: int,
                 input_spec: Any = None) -> Optional[exchange_config.Exchange]:
  """Group ``group``'s ``tfc.Exchange`` (None when it trains alone), checked by the Exchange."""
  if config.exchange is None:
    return None
  if isinstance(config.exchange, exchange_config.Exchange) or not callable(config.exchange):
    raise ConfigurationError(
        f"trainer.train.exchange={config.exchange!r} must make the exchange of each group: "
        "bind @tfc.Exchange (no parentheses; its fields as tfc.Exchange.<field>), or pass "
        "functools.partial(tfc.Exchange, ...)")
  return config.exchange(directory=directory, group=group, num_groups=num_groups,
                         input_spec=input_spec)


def from_bindings(**settings: Any) -> TrainConfig:
  """``TrainConfig(**settings)``, the rest from gin; a setting under an old name, or a
  configurable called where a factory belongs (``@tfc.Exchange()``), is a ConfigurationError."""
  check_renamed(list(settings))
  try:
    return TrainConfig(**settings)
  except TypeError as e:
    if "Exchange" in str(e):
      raise ConfigurationError(
          "trainer.train.exchange = @tfc.Exchange() calls the exchange before it has a group: "
          f"bind @tfc.Exchange without parentheses ({str(e).splitlines()[0]})") from None
    raise


def _validate_numbers(**values: int) -> None:
  for name, value in values.items():
    if value < 1:
      raise ConfigurationError(f"trainer.train.{name}={value} must be >= 1")


def _validate(group: int, num_groups: int, exchanges: bool, exchange_dir: Optional[str],
              optimizer: str) -> None:
  if num_groups < 1:
    raise ConfigurationError(f"--num_groups={num_groups} must be >= 1")
  if not 0 <= group < num_groups:
    raise ConfigurationError(f"--group={group} is out of range for --num_groups={num_groups}")
  if exchanges and num_groups < 2:
    raise ConfigurationError("trainer.train.exchange (codistillation, parameter averaging) needs "
                             "--num_groups >= 2 (or unbind trainer.train.exchange)")
  if exchanges and not exchange_dir:
    raise ConfigurationError("trainer.train.exchange (codistillation, parameter averaging) needs "
                             "--exchange_dir")
  if optimizer not in OPTIMIZERS:
    raise ConfigurationError(f"trainer.train.optimizer={optimizer!r} is not one of "
                             f"{sorted(OPTIMIZERS)}")
