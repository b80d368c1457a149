"""CodistillModel: a tf_keras Model that trains any wrapped model with a codistillation term.

``loss = task_loss + alpha_eff * D(student(x), mean over loaded teachers of teacher_j(x))`` where
``alpha_eff = alpha`` after ``burn_in_steps`` optimizer steps and when at least one teacher is
loaded, else 0. With no teacher loaded the step is exactly the wrapped model's own step.

Each peer's teacher is double-buffered: two copies of the student's function (a clone, or what
``TeacherSpec`` says to build: another precision or form, e.g. ``models.ctr_teacher``) with
non-trainable variables and an ``active_slot`` variable choosing the one the train step runs
(``select_branch``; one ``Case`` op kept as such under parameter servers). A refresh restores the
new values into the *inactive* copy (off the training thread, see teachers/pool.py) and then flips
``active_slot``: training never waits for the copy, never sees a half-written teacher, and the
compiled train step is never retraced.

A checkpoint of the model holds the teachers with it (a resumed run needs no reload), under keys
that name the teachers' form (``teacher_state_key``): a run resumed with teachers of another form
or precision restores its student and optimizer and no teacher, and trains on without one until
the exchange gives it the peers' versions, instead of restoring values it cannot use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tf_codistill import errors
from tf_codistill import losses
from tf_codistill import serving
from tf_codistill import step_hooks
from tf_codistill.exchange import config as exchange_config
from tf_codistill.exchange import directory as exchange_lib
from tf_codistill.optim import comm
from tf_codistill.optim import fused_models
from tf_codistill.optim import fusion as fusion_lib
from tf_codistill.teachers import quantization
from tf_codistill.teachers import spec as teacher_spec
from tf_codistill.training import codistill_hooks


def clone_architecture(model: keras.Model, dtype_policy: Optional[str] = None) -> keras.Model:
  """A fresh, unbuilt-weights copy of a Sequential or functional model (for teachers).

  ``dtype_policy`` rebuilds every layer with that tf_keras dtype policy: ``'mixed_bfloat16'``
  keeps float32 variables (the original's checkpoint loads as is) and computes in bfloat16;
  ``'bfloat16'`` keeps variables in bfloat16 too, and then every initializer is ``zeros``: a
  teacher copy is always restored before use, and some initializers (the orthogonal one's QR)
  have no bfloat16 kernel.
  """
  try:
    return keras.models.clone_model(model, clone_function=_with_policy(dtype_policy))
  except ValueError as e:
    raise ValueError(
        f"cannot clone {type(model).__name__} automatically ({e}); pass "
        "teachers=TeacherSpec(factory=...) that builds the same architecture (needed for "
        "subclassed models)") from e


def _with_policy(dtype_policy: Optional[str]) -> Optional[Callable[[keras.layers.Layer],
                                                                   keras.layers.Layer]]:
  """clone_model's clone_function for clone_architecture (None: layers cloned as they are)."""
  if dtype_policy is None:
    return None
  zeros = keras.mixed_precision.Policy(dtype_policy).variable_dtype != "float32"

  def clone(layer):
    config = {**layer.get_config(), "dtype": dtype_policy}
    if zeros:
      config = {key: "zeros" if key.endswith("_initializer") and value is not None else value
                for key, value in config.items()}
    return layer.__class__.from_config(config)

  return clone


def _num_teachers(num_teachers: Optional[int], exchange) -> int:
  if exchange is None:
    return 0 if num_teachers is None else num_teachers
  if num_teachers is not None and num_teachers != exchange.num_teachers:
    raise errors.ConfigurationError(
        f"CodistillModel: num_teachers={num_teachers} but the exchange names "
        f"{exchange.num_teachers} peers ({exchange.peer_groups()}): leave num_teachers unset")
  return exchange.num_teachers


def select_branch(index: tf.Tensor, branches: Sequence[Callable[[], tf.Tensor]],
                  keep_case: bool = False) -> tf.Tensor:
  """``tf.switch_case(index, branches)``; with ``keep_case`` kept as one ``Case`` op instead of
  being lowered to Switch/Merge.

  Lowered, the ops of the branches not taken still run, as dead ops: nearly free when their
  variables are local, but under parameter servers each passes its dead tensor between devices,
  so the unused teacher copy costs about as many RPCs per step as the used one. Kept, only the
  chosen branch runs, as a function call that costs more than the same ops inlined in the step.
  Measured (CTR teacher, batch 512): in one process 1.46 ms kept vs 0.81 ms lowered per call, and
  a throughput ratio of 0.949 kept vs 0.968 lowered; in a parameter-server group 0.905 kept vs
  0.878 lowered.
  """
  if tf.executing_eagerly():
    return branches[int(index)]()
  # tf.switch_case lowers unconditionally (outside XLA) and has no argument to keep the op.
  from tensorflow.python.ops import cond_v2  # pylint: disable=g-import-not-at-top
  return cond_v2.indexed_case(index, list(branches), lower_using_switch_merge=not keep_case)


# The attributes that hold the teachers' state; checkpoints key them by the teachers' form.
_TEACHER_STATE = ("teacher_slots", "teacher_steps", "active_slot")


def _layer_forms(model: keras.Model) -> List[str]:
  """Class and dtype policy of every layer of ``model``, nested models' layers included."""
  forms = []
  for layer in getattr(model, "layers", []):
    forms.append(f"{type(layer).__name__}:{layer.dtype_policy.name}")
    if isinstance(layer, keras.Model):
      forms.extend(_layer_forms(layer))
  return forms


def teacher_form_suffix(teacher: keras.Model, student: keras.Model) -> str:
  """The suffix of the teachers' checkpoint keys: empty for teachers whose layers are the
  student's own (a clone: the keys of every checkpoint so far), else a digest of their layers'
  classes and dtype policies (stacked tables, bfloat16, int8), so that the teachers of one form
  never restore from, or fail on, a checkpoint of another."""
  forms = _layer_forms(teacher)
  if forms == _layer_forms(student):
    return ""
  return "_form_" + hashlib.sha1("|".join(forms).encode()).hexdigest()[:12]


def _teacher_maker(student: keras.Model, teachers: teacher_spec.TeacherSpec
                   ) -> Callable[[], keras.Model]:
  maker = teachers.maker(student)
  if maker is not None:
    return maker
  if teachers.precision == "int8":
    return lambda: quantization.int8_copy(student)
  return lambda: clone_architecture(student, dtype_policy=teachers.dtype_policy())


def export(model: keras.Model, path: str, input_spec=None, *,
           raw_parser: Optional[Callable[[tf.Tensor], Any]] = None,
           output: str = "sigmoid") -> None:
  """Writes ``model`` (a CodistillModel: its student) as a SavedModel with the serving signature
  ``serving_default``: ``inputs`` (or one input per feature name) -> ``{'logits': ...}``, the
  format peers load as teachers and servers read. Written atomically (exchange.save_model).

  Args:
    model: a built tf_keras model.
    path: the SavedModel directory (replaced if it exists; local, ``gs://``, ...).
    input_spec: the batched input spec; by default the spec of the CodistillModel's first call,
      or a functional model's ``inputs``.
    raw_parser: e.g. ``criteo.raw_parser(num_buckets)``: also writes ``serving_raw``, raw lines
      -> ``logits`` and ``probabilities`` (``output``: sigmoid or softmax), see serving.py.
    output: how ``serving_raw`` turns logits into probabilities.

  Raises:
    ValueError: the input spec is unknown (a subclassed model never called through
      CodistillModel and no ``input_spec``).
  """
  spec = input_spec
  if spec is None and isinstance(model, CodistillModel):
    spec = model._features_spec
  student = model.student if isinstance(model, CodistillModel) else model
  if spec is None:
    try:
      spec = student.input  # a functional model's inputs, in their structure
    except AttributeError:
      raise ValueError("export: the model's input spec is unknown; pass input_spec") from None
  exchange_lib.save_model(student, path, codistill_hooks.batched_spec(spec),
                          serving.raw_signatures(student, raw_parser, output))


class CodistillModel(keras.Model):
  """Wraps a student model; trains it on task loss plus distillation toward stale peer teachers.

  Args:
    student: the model trained (any tf_keras model; subclassed ones need a
      ``TeacherSpec.factory``).
    num_teachers: how many peer teachers the train step averages (given by ``exchange`` if set).
    exchange: where and how to exchange models with peer groups (exchange_config.Exchange);
      with it ``fit`` publishes and refreshes teachers by itself.
    teachers: how the teacher copies are built (``tfc.TeacherSpec``: a clone of the student
      at a precision, by default float32, or a factory of another form).
    distillation: the distillation term (``tfc.Distillation``: weight, burn-in, loss kind,
      temperature).
    output: ``sigmoid`` or ``softmax``: how the student's logits become probabilities.
    teacher_weights: each teacher's weight in the average (default: equal).
    fusion, reducer: optimizer fusion (fusion.py) and the gradient all-reduce (comm.py).

  Raises:
    ValueError (ConfigurationError, FusionError): a value that cannot work.
  """

  def __init__(self, student: keras.Model, num_teachers: Optional[int] = None, *,
               exchange: Optional["exchange_config.Exchange"] = None,
               teachers: teacher_spec.TeacherSpec = teacher_spec.TeacherSpec(),
               distillation: losses.Distillation = losses.Distillation(),
               output: str = "sigmoid",
               teacher_weights: Optional[Sequence[float]] = None, fusion: str = "none",
               reducer: Optional[comm.GradientReducer] = None, fusion_binding: str = "fusion",
               **kwargs):
    super().__init__(**kwargs)
    num_teachers = _num_teachers(num_teachers, exchange)
    fusion_lib.check_mode(fusion, fusion_binding)
    if num_teachers < 0:
      raise ValueError(f"num_teachers={num_teachers} must be >= 0")
    losses._check("output", output, losses.OUTPUTS)
    self.student = student
    self.exchange = exchange
    self.teachers = teachers
    make = _teacher_maker(student, teachers)
    self.teacher_slots = [[make(), make()] for _ in range(num_teachers)]
    self.teacher_state_key = (teacher_form_suffix(self.teacher_slots[0][0], student)
                              if num_teachers else "")
    self._set_features_spec(None)
    for teacher in self.all_teachers():
      teacher.trainable = False
    self._teachers_built = False
    self.output_kind = output
    self.distillation = distillation
    if teacher_weights is None:
      teacher_weights = [1.0] * num_teachers
    if len(teacher_weights) != num_teachers:
      raise ValueError(
          f"teacher_weights has {len(teacher_weights)} entries for {num_teachers} teachers")
    # State that changes during training lives in variables so the traced step never retraces.
    self.alpha = tf.Variable(float(distillation.alpha), trainable=False, dtype=tf.float32,
                             name="alpha")
    self.teacher_steps = tf.Variable(tf.fill([num_teachers], tf.constant(-1, tf.int64)),
                                     trainable=False, name="teacher_steps")
    self.active_slot = tf.Variable(tf.zeros([num_teachers], tf.int32), trainable=False,
                                   name="active_slot")
    # Parameter averaging's (round applied, step its period began), checkpointed with the
    # student whose parameters it describes (averaging_hooks.AveragingRound); -1: none.
    self.averaging_position = tf.Variable(tf.constant([-1, 0], tf.int64), trainable=False,
                                          name="averaging_position")
    self._teacher_weights = tf.constant(teacher_weights, tf.float32, shape=[num_teachers])
    self.loss_tracker = keras.metrics.Mean(name="loss")
    self.task_loss_tracker = keras.metrics.Mean(name="task_loss")
    self.distill_loss_tracker = keras.metrics.Mean(name="distill_loss")
    # Optimizer fusion (fusion.py) and the cross-replica gradient reduction (comm.py): with
    # fusion='none' and no reducer the step is tf_keras' own `optimizer.minimize`.
    self.fusion_mode = fusion
    self._fusion_binding = fusion_binding
    self._fusion: Optional[fusion_lib.OptimizerFusion] = None
    self._reducer = reducer
    # Every value a step returns is the same on all replicas (metrics are aggregated, alpha and
    # staleness are mirrored): report it once per group, never summed over replicas.
    self.distribute_reduction_method = "first"

  def compile(self, *args, **kwargs):
    """tf_keras ``compile``; then checks the optimizer against the fusion mode."""
    super().compile(*args, **kwargs)
    self._fusion = None
    if self.fusion_mode != "none":
      self._fusion = fusion_lib.OptimizerFusion(self.optimizer, self.fusion_mode,
                                                binding=self._fusion_binding,
                                                jit_compile=bool(self.jit_compile))

  def flush_fusion(self) -> None:
    """Applies pending forward-fusion updates (call before reading or saving the weights)."""
    if self._fusion is not None:
      self._fusion.flush()

  def _set_features_spec(self, spec) -> None:
    """Keeps the batched spec of the first call's inputs as it is: Keras would wrap a dict
    attribute in a trackable wrapper (which is no dict)."""
    object.__setattr__(self, "_features_spec", spec)

  def copy_student(self) -> keras.Model:
    """A new float32 model of the student's architecture (for local copies and exports): the
    teacher factory's model, unless the teachers it makes hold the weights in another form or
    precision (stacked tables, bfloat16); then a clone of the student."""
    maker = self.teachers.maker(self.student)
    if maker is None:
      return clone_architecture(self.student)
    if self.teacher_slots and not quantization.restores_from_float32(self.teacher_slots[0][0]):
      return clone_architecture(self.student)
    return maker()

  def float32_copy(self) -> keras.Model:
    """A float32 model of the teachers' architecture with its variables created (from the
    inputs the model was first called on): whose object graph finds a peer checkpoint's keys
    for a teacher in another precision or form (``restoring.read_weights``)."""
    copy = self.copy_student()
    if not copy.weights:
      if self._features_spec is None:
        raise ValueError("float32_copy: call the model on a batch first")
      copy(tf.nest.map_structure(lambda s: tf.zeros([1, *s.shape[1:]], s.dtype),
                                 self._features_spec), training=False)
    return copy

  def fit(self, x=None, *args, callbacks=None, hooks: Sequence[step_hooks.StepHook] = (),
          exchange_options: codistill_hooks.HookOptions = codistill_hooks.HookOptions(),
          **kwargs):
    """tf_keras ``fit``. With forward fusion, pending updates are flushed at epoch and train end
    and before validation (``fused_models.FusionFlush`` runs first). With an ``exchange``, the
    chief publishes the student and every process refreshes its teachers between steps
    (``codistill_hooks.exchange_hooks``, given ``exchange_options``); ``self.exchange_hooks``
    holds them. ``hooks`` (the caller's ``StepHook``s) run before them in the same driver: after
    every batch, or from one polling thread under parameter servers. A NaN/Inf loss a hook
    raises from that thread is raised here after ``fit``; on one, teacher loads stop and a
    publish in flight is waited for.

    Raises:
      ConfigurationError: with an ``exchange``, the input spec is unknown (``x`` is not a
        ``tf.data.Dataset``, the model was never called and ``Exchange.input_spec`` is unset)
        or the exchange directory is not writable.
      NonFiniteLossError: a hook stopped training at a NaN/Inf loss.
    """
    callbacks = list(callbacks or [])
    if self._fusion is not None and self._fusion.mode == "forward":
      callbacks.insert(0, fused_models.FusionFlush(self._fusion))
    run = list(hooks)
    self.exchange_hooks = None
    if self.exchange is not None:
      self.exchange_hooks = self._exchange_hooks(x, exchange_options)
      run += self.exchange_hooks.hooks
      callbacks += self.exchange_hooks.callbacks
    driver = step_hooks.driver_for(self.distribute_strategy, run) if run else None
    if driver is not None:
      callbacks.append(driver)
    try:
      history = super().fit(x, *args, callbacks=callbacks, **kwargs)
      error = getattr(driver, "error", None)
      if error is not None:
        raise error
    except errors.NonFiniteLossError:
      if self.exchange_hooks is not None:
        self.exchange_hooks.stop()
      raise
    return history

  def _exchange_hooks(self, x, options: codistill_hooks.HookOptions
                      ) -> codistill_hooks.ExchangeHooks:
    exchange = self.exchange
    assert exchange is not None  # fit builds hooks only for a model given an Exchange
    spec = (exchange.input_spec or codistill_hooks.features_spec(x) or self._features_spec)
    if spec is None:
      raise errors.ConfigurationError(
          "CodistillModel.fit: the student's input spec is unknown: fit on a tf.data.Dataset, "
          "call the model once on a batch, or set Exchange.input_spec")
    if options.probe is None:
      options = dataclasses.replace(options, probe=codistill_hooks.probe_batch(x))
    return codistill_hooks.exchange_hooks(self, exchange, codistill_hooks.batched_spec(spec),
                                          options)

  def _trackable_children(self, save_type: str = "checkpoint", **kwargs) -> dict:
    """Keras' children, in checkpoints with the teachers' state under keys that name its form."""
    children = super()._trackable_children(save_type, **kwargs)
    suffix = getattr(self, "teacher_state_key", "")  # set in __init__ after the slots
    if suffix and save_type == "checkpoint":
      for name in _TEACHER_STATE:
        if name in children:
          children[name + suffix] = children.pop(name)
    return children

  @property
  def num_teachers(self) -> int:
    return len(self.teacher_slots)

  def all_teachers(self) -> List[keras.Model]:
    return [t for slots in self.teacher_slots for t in slots]

  @property
  def metrics(self):
    trackers = [self.loss_tracker, self.task_loss_tracker, self.distill_loss_tracker]
    return trackers + (self.compiled_metrics.metrics if self.compiled_metrics else [])

  def call(self, inputs, training=None):
    if self._features_spec is None:
      self._set_features_spec(codistill_hooks.batched_spec(inputs))
    if not self._teachers_built:
      # Create every teacher's variables with the student's, so refreshes can restore into them.
      for teacher in self.all_teachers():
        teacher(inputs, training=False)
      self._teachers_built = True
    return self.student(inputs, training=training)

  def active_teacher(self, index: int) -> keras.Model:
    """The copy of teacher ``index`` that the train step uses now."""
    return self.teacher_slots[index][int(self.active_slot.numpy()[index])]

  def inactive_teacher(self, index: int) -> keras.Model:
    """The copy of teacher ``index`` that the train step does not use: safe to overwrite."""
    return self.teacher_slots[index][1 - int(self.active_slot.numpy()[index])]

  def activate_teacher(self, index: int, step: int) -> None:
    """Makes the inactive copy of teacher ``index`` (published at peer step ``step``) the one
    used."""
    # Whole-variable assigns: slices of parameter-server variables cannot be assigned.
    slots = self.active_slot.numpy()
    slots[index] = 1 - slots[index]
    steps = self.teacher_steps.numpy()
    steps[index] = step
    self.active_slot.assign(slots)
    self.teacher_steps.assign(steps)

  def set_teacher_weights(self, index: int, weights: Sequence[np.ndarray], step: int) -> None:
    """Loads float values (in the student's ``weights`` order) into teacher ``index``'s inactive
    copy, cast or quantized to its precision, and activates it."""
    try:
      quantization.assign_float_weights(self.inactive_teacher(index), weights)
    except ValueError as e:
      raise ValueError(f"teacher {index}: {e}") from None
    self.activate_teacher(index, step)

  def teachers_are_remote(self) -> bool:
    """Whether the teachers' variables live on other tasks than the step (parameter servers):
    then the train step keeps the copy choice as one ``Case`` op (``select_branch``)."""
    return isinstance(self.distribute_strategy,
                      tf.distribute.experimental.ParameterServerStrategy)

  def _active_weights(self) -> tf.Tensor:
    loaded = tf.cast(self.teacher_steps >= 0, tf.float32)
    return self._teacher_weights * loaded

  def _effective_alpha(self) -> tf.Tensor:
    if not self.teacher_slots:
      return tf.constant(0.0)
    past_burn_in = tf.cast(self.optimizer.iterations >= self.distillation.burn_in_steps, tf.float32)
    any_teacher = tf.cast(tf.reduce_sum(self._active_weights()) > 0, tf.float32)
    return self.alpha * past_burn_in * any_teacher

  def _teacher_target_and_weight(self, x):
    """(averaged target, total weight of the teachers that count for this batch).

    A loaded teacher whose predictions on this batch are not all finite counts for nothing here
    (its values are zeroed so they cannot poison the average).
    """
    keep_case = self.teachers_are_remote()
    teacher_logits = tf.stack([
        select_branch(self.active_slot[j],
                      [lambda t=t: tf.cast(t(x, training=False), tf.float32) for t in slots],
                      keep_case=keep_case)
        for j, slots in enumerate(self.teacher_slots)])
    finite = tf.reduce_all(tf.math.is_finite(
        tf.reshape(teacher_logits, [self.num_teachers, -1])), axis=1)
    weights = self._active_weights() * tf.cast(finite, tf.float32)
    finite_values = tf.where(tf.math.is_finite(teacher_logits), teacher_logits,
                             tf.zeros_like(teacher_logits))
    target = self.distillation.target(finite_values, weights, self.output_kind)
    return target, tf.reduce_sum(weights)

  def teacher_target(self, x) -> tf.Tensor:
    """Averaged teacher probabilities (or logits for MSE) over the loaded peers with finite
    predictions on ``x``."""
    return self._teacher_target_and_weight(x)[0]

  def _teachers_term_inputs(self, x, logits, alpha_eff) -> Optional[Tuple[tf.Tensor, tf.Tensor]]:
    """(target, weight) of the distillation term on ``x``, None without teacher slots."""
    if not self.teacher_slots:
      return None
    # The teachers' forward passes are skipped while the term is off. They take the inputs only,
    # not the student's logits, so they run beside the student's forward pass instead of after it.
    # (The off branch reads only the logits' shape: its ops alone wait for the student.)
    return tf.cond(alpha_eff > 0, lambda: self._teacher_target_and_weight(x),
                   lambda: (tf.zeros(tf.shape(logits)), tf.constant(0.0)))

  def _distill_term(self, logits, teachers: Optional[Tuple[tf.Tensor, tf.Tensor]],
                    sample_weight: Optional[tf.Tensor] = None) -> tf.Tensor:
    """The distillation loss of ``logits`` toward the teachers' (target, weight), each example
    weighed by ``sample_weight`` as the task loss is; 0 without teachers."""
    if teachers is None:
      return tf.constant(0.0, logits.dtype)
    target, weight = teachers
    # The loss itself is not in a cond, whose gradient would be a second cond in the backward
    # pass (in one process, a teacher returning zeros cost the CTR step 2.3% with it, 0.6%
    # without; teacher_overhead resolves no difference). Off, its target is zeros; zeroed here.
    loss = self.distillation.loss(logits, target, self.output_kind, sample_weight)
    # No teacher with finite predictions on this batch: no distillation term for it.
    return tf.where(weight > 0, loss, tf.zeros_like(loss))

  def teacher_staleness(self) -> tf.Tensor:
    """Mean over loaded teachers of (own step - the peer step the teacher was published at)."""
    steps = tf.cast(self.teacher_steps, tf.float32)
    loaded = tf.cast(self.teacher_steps >= 0, tf.float32)
    count = tf.reduce_sum(loaded)
    own = tf.cast(self.optimizer.iterations, tf.float32)
    mean_age = tf.reduce_sum((own - steps) * loaded) / tf.maximum(count, 1.0)
    return tf.where(count > 0, mean_age, -1.0)

  def train_step(self, data):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    alpha_eff = self._effective_alpha()
    fusion = self._fusion
    variables = self.student.trainable_variables
    if fusion is not None and not fusion.built:
      fusion.build(variables, fusion_lib.probe_gradients(self.student, x)
                   if fusion.mode == "forward" else None)
    with tf.GradientTape() as tape:
      with fusion.forward(self.student, tape) if fusion else contextlib.nullcontext():
        logits = self.student(x, training=True)
      task_loss = self.compiled_loss(y, logits, sample_weight,
                                     regularization_losses=self.student.losses)
      teachers = self._teachers_term_inputs(x, logits, alpha_eff)
      distill_loss = self._distill_term(logits, teachers, sample_weight)
      # compiled_loss comes divided by the replicas in sync (their gradients are summed); the
      # distillation term is divided the same way, so alpha weighs it alike on any replicas.
      distill_share = tf.nn.scale_regularization_loss(distill_loss)
      loss = task_loss + tf.cast(alpha_eff, task_loss.dtype) * distill_share
    # The update waits for the teachers' predictions. Parts of it need no gradient (tf_keras
    # Adam's decay of the moments of variables with sparse gradients: the embedding tables);
    # started with the step, they keep every thread busy and the teachers' forward passes queue
    # behind them, delaying the backward pass that needs their predictions. Waiting for the
    # distillation term instead would also hold them back until the student's forward pass ends.
    with tf.control_dependencies(list(teachers or ())):
      fusion_lib.minimize(self.optimizer, loss, tape, variables, fusion, self._reducer)
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    return self._update_metrics(y, logits, sample_weight, loss * replicas, task_loss * replicas,
                                distill_loss, alpha_eff)

  def test_step(self, data):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    logits = self.student(x, training=False)
    task_loss = self.compiled_loss(y, logits, sample_weight,
                                   regularization_losses=self.student.losses)
    task_loss *= tf.distribute.get_replica_context().num_replicas_in_sync  # the loss, unscaled
    zero = tf.constant(0.0)
    return self._update_metrics(y, logits, sample_weight, task_loss, task_loss, zero, zero)

  def _update_metrics(self, y, logits, sample_weight, loss, task_loss, distill_loss, alpha_eff):
    # Weighted by batch size, as Keras' own loss metric is, so epoch means match plain `fit`.
    batch = tf.cast(tf.shape(tf.nest.flatten(logits)[0])[0], tf.float32)
    self.loss_tracker.update_state(loss, sample_weight=batch)
    self.task_loss_tracker.update_state(task_loss, sample_weight=batch)
    self.distill_loss_tracker.update_state(distill_loss, sample_weight=batch)
    self.compiled_metrics.update_state(y, logits, sample_weight)
    results = {m.name: m.result() for m in self.metrics}
    results["alpha"] = tf.cast(alpha_eff, tf.float32)
    results["teacher_staleness"] = self.teacher_staleness()
    return results
