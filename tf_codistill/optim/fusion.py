"""Optimizer fusion (Jiang et al. 2021) for tf_keras optimizers: same math, better locality.

tf_keras' optimizers update each variable with several passes over it and its slots (Adam: about
ten element-wise ops per variable, each reading and writing the whole table). This module issues
one fused TF kernel per variable instead (``ResourceApplyAdam``, ``ResourceApplyKerasMomentum``,
``ResourceApplyAdagradV2``, ``ResourceApplyRMSProp``, ``ResourceApplyGradientDescent``, and for
``IndexedSlices`` embedding gradients ``ResourceSparseApplyAdagradV2`` / ``ResourceScatterAdd``),
and schedules it in one of three ways:

- ``'kernels'``: the fused kernels only, no schedule: every update waits for every gradient, as
  tf_keras' own updates do (what the kernels buy alone, measured apart from the schedule).
- ``'backward'``: each variable's update depends only on its own (aggregated) gradient, so it runs
  as soon as that gradient exists; there is no step over all variables at the end.
- ``'forward'``: the gradient is kept in a non-trainable "pending" variable and the update runs at
  the start of the layer's call in the *next* step, right before the layer reads its weights.
  ``flush()`` applies what is pending; call it before anything reads or saves the weights (the
  trainer does: before checkpoints, publishes, evaluation and the final export).

The optimizer's own state (slots, ``iterations``, learning rate) stays the tf_keras optimizer's,
so checkpoints are interchangeable with ``fusion='none'``. ``iterations`` counts computed steps in
both modes; under ``'forward'`` the weights lag one update behind it until the next step or
``flush()``.

Math differences from tf_keras (float round-off aside): Adagrad adds ``epsilon`` outside the square
root (TF's kernel: ``g / (sqrt(acc) + eps)``; tf_keras: ``g / sqrt(acc + eps)``, relative
difference < eps / sqrt(acc) ~ 3e-7 with the defaults); SGD without momentum does not write its
(unused) momentum slot. Adam, momentum and RMSprop update whole tables even for ``IndexedSlices``
gradients, exactly as tf_keras does (their math decays every row): the gradient is densified and
applied by the dense kernel. Adagrad and plain SGD touch only the looked-up rows, as in tf_keras.

Not supported (``FusionError`` naming the binding): ``global_clipnorm`` (needs every gradient
before the first update), ``use_ema``, loss-scale optimizers, legacy optimizers, optimizers
without a fused kernel here (supported: SGD, Adam, AdamW, Adagrad, RMSprop), partitioned
(sharded) variables, and ``'forward'`` under a parameter-server strategy (asynchronous workers
overwrite each other's pending gradients: ``benchmarks/forward_fusion_ps.py`` measured a quarter
of them lost and a quarter applied twice with 2 workers; docs/fusion_and_comm.md).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import tensorflow as tf
import tf_keras as keras
from absl import logging

from tf_codistill import errors

MODES = ("none", "kernels", "backward", "forward")
_OPT = keras.optimizers


class FusionError(errors.ConfigurationError):
  """A fusion mode that cannot work with this optimizer, model or strategy."""


def in_xla_context() -> bool:
  """Whether the code being traced is compiled by XLA (``jit_compile=True``)."""
  from tensorflow.python.ops import control_flow_util  # pylint: disable=g-import-not-at-top
  return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _read(var: tf.Variable) -> tf.Tensor:
  """The value of ``var`` on this replica (raw read: fine in replica context)."""
  return tf.raw_ops.ReadVariableOp(resource=var.handle, dtype=var.dtype)


def _assign(var: tf.Variable, value) -> None:
  """Sets this replica's copy of ``var`` (sync replicas all set the same value)."""
  tf.raw_ops.AssignVariableOp(resource=var.handle, value=tf.convert_to_tensor(value, var.dtype))


def _densify(grad):
  return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


# --- per-optimizer fused updates --------------------------------------------------------------
# Each takes (optimizer, slot index, variable, gradient (dense or deduplicated IndexedSlices),
# hyper-parameters of this update, scratch variable or None, xla) and emits the update ops.

def _sgd(opt, i, var, grad, h, scratch, xla):
  dtype = var.dtype
  lr = tf.cast(h["lr"], dtype)
  if float(opt.momentum) == 0.0:
    if isinstance(grad, tf.IndexedSlices):
      tf.raw_ops.ResourceScatterAdd(resource=var.handle, indices=grad.indices,
                                    updates=-lr * grad.values)
    else:
      tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=lr, delta=grad)
    return
  tf.raw_ops.ResourceApplyKerasMomentum(
      var=var.handle, accum=opt.momentums[i].handle, lr=lr, grad=_densify(grad),
      momentum=tf.cast(opt.momentum, dtype), use_nesterov=bool(opt.nesterov))


def _adam(opt, i, var, grad, h, scratch, xla):
  dtype = var.dtype
  local_step = tf.cast(h["step"] + 1, dtype)
  beta_1 = tf.cast(opt.beta_1, dtype)
  beta_2 = tf.cast(opt.beta_2, dtype)
  beta_1_power = tf.pow(beta_1, local_step)
  beta_2_power = tf.pow(beta_2, local_step)
  epsilon = tf.cast(opt.epsilon, dtype)
  if getattr(opt, "adaptive_epsilon", False):
    epsilon = epsilon * tf.sqrt(1 - beta_2_power)
  lr = tf.cast(h["lr"], dtype)
  m, v = opt._momentums[i], opt._velocities[i]
  grad = _densify(grad)
  if not opt.amsgrad:
    tf.raw_ops.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle,
                                 beta1_power=beta_1_power, beta2_power=beta_2_power, lr=lr,
                                 beta1=beta_1, beta2=beta_2, epsilon=epsilon, grad=grad)
  elif not xla:
    tf.raw_ops.ResourceApplyAdamWithAmsgrad(
        var=var.handle, m=m.handle, v=v.handle, vhat=opt._velocity_hats[i].handle,
        beta1_power=beta_1_power, beta2_power=beta_2_power, lr=lr, beta1=beta_1, beta2=beta_2,
        epsilon=epsilon, grad=grad)
  else:  # XLA has no AMSGrad kernel; it fuses these element-wise ops itself.
    m_t = _read(m) + (grad - _read(m)) * (1 - beta_1)
    v_t = _read(v) + (tf.square(grad) - _read(v)) * (1 - beta_2)
    vhat_t = tf.maximum(_read(opt._velocity_hats[i]), v_t)
    alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
    _assign(m, m_t)
    _assign(v, v_t)
    _assign(opt._velocity_hats[i], vhat_t)
    tf.raw_ops.AssignSubVariableOp(resource=var.handle,
                                   value=(m_t * alpha) / (tf.sqrt(vhat_t) + epsilon))


def _adagrad(opt, i, var, grad, h, scratch, xla):
  dtype = var.dtype
  lr = tf.cast(h["lr"], dtype)
  epsilon = tf.cast(opt.epsilon, dtype)
  acc = opt._accumulators[i]
  if not isinstance(grad, tf.IndexedSlices):
    tf.raw_ops.ResourceApplyAdagradV2(var=var.handle, accum=acc.handle, lr=lr, epsilon=epsilon,
                                      grad=grad)
  elif not xla:
    tf.raw_ops.ResourceSparseApplyAdagradV2(var=var.handle, accum=acc.handle, lr=lr,
                                            epsilon=epsilon, grad=grad.values,
                                            indices=grad.indices)
  else:  # XLA has no sparse apply kernels: the row-wise update of tf_keras, as scatters.
    tf.raw_ops.ResourceScatterAdd(resource=acc.handle, indices=grad.indices,
                                  updates=grad.values * grad.values)
    rows = tf.raw_ops.ResourceGather(resource=acc.handle, indices=grad.indices, dtype=dtype)
    tf.raw_ops.ResourceScatterAdd(resource=var.handle, indices=grad.indices,
                                  updates=-lr * grad.values / tf.sqrt(rows + epsilon))


def _rmsprop(opt, i, var, grad, h, scratch, xla):
  dtype = var.dtype
  lr = tf.cast(h["lr"], dtype)
  mom = opt._momentums[i] if opt.momentum > 0 else scratch
  common = dict(lr=lr, rho=tf.cast(opt.rho, dtype), momentum=tf.cast(opt.momentum, dtype),
                epsilon=tf.cast(opt.epsilon, dtype), grad=_densify(grad))
  if opt.centered:
    tf.raw_ops.ResourceApplyCenteredRMSProp(var=var.handle, mg=opt._average_gradients[i].handle,
                                            ms=opt._velocities[i].handle, mom=mom.handle,
                                            **common)
  else:
    tf.raw_ops.ResourceApplyRMSProp(var=var.handle, ms=opt._velocities[i].handle,
                                    mom=mom.handle, **common)


# Most specific first (AdamW is not an Adam subclass, but shares its update).
_RULES: Tuple[Tuple[type, Callable], ...] = (
    (_OPT.AdamW, _adam), (_OPT.Adam, _adam), (_OPT.SGD, _sgd), (_OPT.Adagrad, _adagrad),
    (_OPT.RMSprop, _rmsprop))
SUPPORTED = tuple(cls.__name__ for cls, _ in _RULES)


def _rule(optimizer) -> Optional[Callable]:
  for cls, rule in _RULES:
    if type(optimizer) is cls:  # pylint: disable=unidiomatic-typecheck
      return rule
  return None


def check_mode(mode: str, binding: str = "fusion", parameter_server: bool = False) -> None:
  """Raises FusionError (a ConfigurationError) naming ``binding`` when ``mode`` is no mode, or is
  'forward' in a parameter-server group: the one check of a mode, before and after any process
  starts."""
  if mode not in MODES:
    raise FusionError(f"{binding}={mode!r} is not one of {MODES}")
  if mode == "forward" and parameter_server:
    raise FusionError(
        f"{binding}={mode!r} cannot run under strategy='parameter_server' "
        "(ParameterServerStrategy): asynchronous workers would overwrite each other's pending "
        "gradients. Use 'backward' (or 'none') for parameter-server groups")


def check_supported(optimizer, mode: str, binding: str = "fusion",
                    strategy: Optional[tf.distribute.Strategy] = None) -> None:
  """Raises FusionError when ``mode`` cannot be used with ``optimizer`` (and ``strategy``)."""
  strategy = strategy or tf.distribute.get_strategy()
  check_mode(mode, binding,
             isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy))
  if mode == "none":
    return
  what = f"{binding}={mode!r}"
  if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
    raise FusionError(f"{what} does not support LossScaleOptimizer (mixed precision); "
                      f"bind {binding} = 'none'")
  if not isinstance(optimizer, _OPT.Optimizer) or _rule(optimizer) is None:
    raise FusionError(
        f"{what} has no fused update for {type(optimizer).__module__}."
        f"{type(optimizer).__name__}; supported: tf_keras.optimizers.{{{', '.join(SUPPORTED)}}}. "
        f"Bind {binding} = 'none' for other optimizers")
  if optimizer.global_clipnorm:
    raise FusionError(
        f"{what} cannot be combined with global_clipnorm={optimizer.global_clipnorm}: clipping by "
        "the global norm needs every gradient before the first update, which is the barrier "
        "fusion removes. Use clipnorm or clipvalue (per variable), or bind "
        f"{binding} = 'none'")
  if optimizer.use_ema:
    raise FusionError(f"{what} does not support use_ema=True; bind {binding} = 'none'")


# --- gradient structure probe -----------------------------------------------------------------

def probe_gradients(model: keras.Model, inputs) -> List[Optional[tf.TensorSpec]]:
  """For each trainable variable of ``model``: None if its gradient is dense, else the spec of
  its ``IndexedSlices`` values (an embedding lookup's gradient), found by tracing (never running)
  the forward pass and backward pass on inputs shaped like ``inputs``."""
  specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), inputs)
  variables = model.trainable_variables
  found: List[Optional[tf.TensorSpec]] = []

  def trace(x):
    with tf.GradientTape() as tape:
      outputs = model(x, training=True)
      total = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32)) for o in tf.nest.flatten(outputs)]
                       + [tf.cast(loss, tf.float32) for loss in model.losses])
    for grad in tape.gradient(total, variables):
      found.append(tf.TensorSpec(grad.values.shape, grad.values.dtype)
                   if isinstance(grad, tf.IndexedSlices) else None)
    return total

  tf.function(trace, autograph=False).get_concrete_function(specs)
  return found


# --- the fused optimizer step -----------------------------------------------------------------

class OptimizerFusion:
  """Fused per-variable updates for one tf_keras optimizer and one model's trainable variables.

  Used inside a train step (replica context): ``with fusion.forward(model, tape): y = model(x)``
  around the forward pass, then ``fusion.apply_gradients(grads_and_vars)`` with the aggregated
  gradients. ``flush()`` (eagerly, between steps) applies pending updates of ``'forward'``.
  """

  def __init__(self, optimizer: _OPT.Optimizer, mode: str, *, binding: str = "fusion",
               jit_compile: bool = False):
    check_supported(optimizer, mode, binding)
    if mode == "none":
      raise FusionError(f"{binding}='none' needs no OptimizerFusion")
    self.optimizer = optimizer
    self.mode = mode
    self.binding = binding
    self.jit_compile = jit_compile  # compiles flush() like the train step
    self._rule = _rule(optimizer)
    self._variables: List[tf.Variable] = []
    self._position: Dict[int, int] = {}
    self._scratch: Dict[int, tf.Variable] = {}
    # forward mode: per variable, ('dense', value var) or ('sparse', values var, indices var)
    self._pending: List[tuple] = []
    self._has_pending: Optional[tf.Variable] = None
    self._flush_fn = None
    self.built = False

  # -- building ---------------------------------------------------------------------------------

  def build(self, variables: Sequence[tf.Variable],
            sparse: Optional[Sequence[Optional[tf.TensorSpec]]] = None) -> None:
    """Creates the optimizer's slots and this object's variables (lifted out of any trace).

    ``sparse`` (forward mode): per variable, the spec of its IndexedSlices gradient values, or
    None for a dense gradient (see ``probe_gradients``); all dense if not given.
    """
    variables = list(variables)
    self._position = {id(v): i for i, v in enumerate(variables)}
    for var in variables:
      if hasattr(var, "_sharded_container") or type(var).__name__ == "ShardedVariable":
        raise FusionError(f"{self.binding}={self.mode!r} does not support partitioned variable "
                          f"{var.name}; bind strategies.make_strategy.partitioner = 'none' or "
                          f"{self.binding} = 'none'")
    xla = in_xla_context()
    with tf.init_scope():
      self.optimizer.build(variables)
      strategy = tf.distribute.get_strategy()
      for var in variables:
        i = self._index(var)
        if isinstance(self.optimizer, _OPT.RMSprop) and self.optimizer.momentum <= 0:
          with strategy.extended.colocate_vars_with(var):
            self._scratch[i] = tf.Variable(tf.zeros(var.shape, var.dtype), trainable=False,
                                           name=f"fusion_scratch/{var._shared_name}")
      if self.mode == "forward":
        sparse = list(sparse) if sparse is not None else [None] * len(variables)
        if len(sparse) != len(variables):
          raise ValueError(f"{len(sparse)} gradient specs for {len(variables)} variables")
        self._has_pending = tf.Variable(False, trainable=False, name="fusion_has_pending")
        for var, spec in zip(variables, sparse):
          with strategy.extended.colocate_vars_with(var):
            self._pending.append(self._pending_storage(var, spec, xla))
    self._variables = variables
    self.built = True

  def _pending_storage(self, var: tf.Variable, spec: Optional[tf.TensorSpec], xla: bool) -> tuple:
    name = f"fusion_pending/{var._shared_name}"
    # IndexedSlices are kept as such (rows vary from step to step, and all-gathered ones with
    # the number of replicas), except under XLA, which needs fixed shapes: densely there.
    if spec is None or xla:
      return ("dense", tf.Variable(tf.zeros(var.shape, var.dtype), trainable=False, name=name))
    inner = spec.shape[1:].as_list()
    values = tf.Variable(tf.zeros([0] + inner, spec.dtype), shape=tf.TensorShape([None] + inner),
                         trainable=False, name=f"{name}/values")
    indices = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]),
                          trainable=False, name=f"{name}/indices")
    return ("sparse", values, indices)

  def _index(self, var: tf.Variable) -> int:
    return self.optimizer._index_dict[self.optimizer._var_key(var)]

  # -- one variable's update ----------------------------------------------------------------

  def _hyper(self, step: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Learning rate etc. of the update that follows ``step`` earlier updates."""
    schedule = self.optimizer._learning_rate
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
      lr = tf.convert_to_tensor(schedule(step))
      _assign(self.optimizer._current_learning_rate, lr)
    else:
      lr = _read(schedule)
    return {"lr": lr, "step": step}

  def _update(self, var: tf.Variable, grad, hyper: Dict[str, tf.Tensor], xla: bool) -> None:
    """tf_keras' per-variable pipeline (clip, deduplicate, decay, update, constrain), fused."""
    opt = self.optimizer
    if opt.clipnorm or opt.clipvalue:
      grad = opt._clip_gradients([grad])[0]
    grad = opt._deduplicate_sparse_grad([grad])[0]
    if opt.weight_decay and opt._use_weight_decay(var):
      decay = tf.cast(hyper["lr"], var.dtype) * tf.cast(opt.weight_decay, var.dtype)
      tf.raw_ops.AssignSubVariableOp(resource=var.handle, value=_read(var) * decay)
    i = self._index(var)
    self._rule(opt, i, var, grad, hyper, self._scratch.get(i), xla)
    if var.constraint is not None:
      _assign(var, var.constraint(_read(var)))

  # -- the step ---------------------------------------------------------------------------------

  def apply_gradients(self, grads_and_vars: Sequence[Tuple[object, tf.Variable]]) -> None:
    """Backward: updates every variable now, each on its own gradient (kernels: once all
    gradients exist). Forward: keeps the
    gradients as pending. Either way counts the step in ``optimizer.iterations``."""
    grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
    if not self.built:
      self.build([v for _, v in grads_and_vars])
    step = _read(self.optimizer.iterations)
    xla = in_xla_context()
    if self.mode in ("kernels", "backward"):
      hyper = self._hyper(step)
      barrier = []
      if self.mode == "kernels":  # every gradient before the first update
        barrier = [tf.group(*[t for g, _ in grads_and_vars for t in tf.nest.flatten(
            g, expand_composites=True)])]
      with tf.control_dependencies(barrier):
        for grad, var in grads_and_vars:
          self._update(var, grad, hyper, xla)
    else:
      for grad, var in grads_and_vars:
        self._store_pending(var, grad)
      _assign(self._has_pending, True)
    tf.raw_ops.AssignAddVariableOp(resource=self.optimizer.iterations.handle,
                                   value=tf.constant(1, tf.int64))

  def _store_pending(self, var: tf.Variable, grad) -> None:
    index = self._position.get(id(var))
    storage = None if index is None else self._pending[index]
    if storage is None:
      raise FusionError(f"{self.binding}='forward': variable {var.name} was not built")
    if storage[0] == "dense":
      _assign(storage[1], _densify(grad))
    else:
      if not isinstance(grad, tf.IndexedSlices):
        raise FusionError(f"{self.binding}='forward': {var.name} now has a dense gradient but "
                          "was probed sparse")
      _assign(storage[1], grad.values)
      _assign(storage[2], tf.cast(grad.indices, tf.int64))

  def _pending_grad(self, index: int):
    storage = self._pending[index]
    if storage[0] == "dense":
      return _read(storage[1])
    var = self._variables[index]
    return tf.IndexedSlices(_read(storage[1]), _read(storage[2]),
                            tf.constant(var.shape.as_list(), tf.int64))

  def _apply_pending(self, indices: Sequence[int], has_pending: tf.Tensor, step: tf.Tensor,
                     xla: bool) -> None:
    """Applies the pending gradients of ``self._variables[indices]`` if there are any."""
    if not indices:
      return

    def apply():
      hyper = self._hyper(step)
      for i in indices:
        self._update(self._variables[i], self._pending_grad(i), hyper, xla)
      return tf.constant(True)

    tf.cond(has_pending, apply, lambda: tf.constant(False))

  @contextlib.contextmanager
  def forward(self, model: keras.Model, tape: Optional[tf.GradientTape] = None) -> Iterator[None]:
    """Around the forward pass of ``model`` in a train step. Forward mode: each layer applies the
    pending update of its variables (its sublayers' included) when it is first called, right
    before it reads them; variables of no layer are updated on entry, those of layers never
    called on exit (a weight read by another layer before its own layer is called would be read
    before its update: use 'backward' for such weight tying)."""
    if self.mode != "forward" or not self.built:
      yield
      return
    xla = in_xla_context()
    graph = tf.compat.v1.get_default_graph()
    has_pending = _read(self._has_pending)
    step = _read(self.optimizer.iterations) - 1  # the pending gradient is that of the last step
    position = self._position
    owners: Dict[int, List[int]] = {}
    layers = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
      # Functional models only call their layers, which are hooked themselves; any other layer
      # may read its sublayers' weights directly (an LSTM reads its cell's): it updates them all.
      if getattr(layer, "_is_graph_network", False):
        continue
      own = [position[id(v)] for v in layer.trainable_weights if id(v) in position]
      if own:
        owners[id(layer)] = own
        layers[id(layer)] = layer
    owned = {i for own in owners.values() for i in own}
    done: set = set()
    stop = tape.stop_recording if tape is not None else contextlib.nullcontext

    def apply(indices):
      indices = [i for i in indices if i not in done]
      done.update(indices)
      with stop():
        self._apply_pending(indices, has_pending, step, xla)

    apply([i for i in range(len(self._variables)) if i not in owned])
    patched = []
    for key, layer in layers.items():
      original = layer.call

      @tf.autograph.experimental.do_not_convert
      def hooked(*args, __layer=layer, __original=original, __own=owners[key], **kwargs):
        if tf.compat.v1.get_default_graph() is graph:
          # Wait for the layer's inputs (its turn in the forward pass), then update its weights.
          with tf.control_dependencies([t for t in tf.nest.flatten((args, kwargs))
                                        if isinstance(t, tf.Tensor)]):
            apply(__own)
        elif any(i not in done for i in __own):
          raise FusionError(
              f"{self.binding}='forward': layer {__layer.name} is first called inside control "
              "flow (tf.cond / loop) of the train step, where its pending update might not run; "
              f"bind {self.binding} = 'backward' for this model")
        call = __original
        if __layer._should_use_autograph():
          call = tf.__internal__.autograph.tf_convert(
              __original, tf.__internal__.autograph.control_status_ctx())
        return call(*args, **kwargs)

      layer.__dict__["call"] = hooked
      patched.append(layer)
    try:
      yield
    finally:
      for layer in patched:
        layer.__dict__.pop("call", None)
    missed = [i for i in owned if i not in done]
    if missed:
      logging.warning("%s='forward': %d variables' layers were not called in the forward pass; "
                      "their pending updates run after it", self.binding, len(missed))
      apply(missed)

  # -- flush ------------------------------------------------------------------------------------

  def flush(self) -> None:
    """Applies every pending update now (forward mode; a no-op otherwise). Call between steps."""
    if self.mode != "forward" or not self.built:
      return
    if self._flush_fn is None:
      strategy = self.optimizer._distribution_strategy

      def replica_flush():
        xla = in_xla_context()
        step = _read(self.optimizer.iterations) - 1
        self._apply_pending(list(range(len(self._variables))), _read(self._has_pending), step,
                            xla)
        _assign(self._has_pending, False)

      def run():
        strategy.run(replica_flush)

      self._flush_fn = tf.function(run, jit_compile=self.jit_compile or None, autograph=False)
    with self.optimizer._distribution_strategy.scope():
      self._flush_fn()

  @property
  def pending(self) -> bool:
    """Whether updates are pending (forward mode)."""
    return bool(self._has_pending is not None and self._has_pending.numpy())


# --- the optimizer step with fusion and a custom reduction -----------------------------------

def minimize(optimizer: _OPT.Optimizer, loss: tf.Tensor, tape: tf.GradientTape,
             variables: Sequence[tf.Variable], fusion: Optional[OptimizerFusion] = None,
             reducer=None) -> None:
  """``optimizer.minimize(loss, variables, tape=tape)`` with optional fusion and a custom
  cross-replica reduction (``comm.GradientReducer``: reduced precision)."""
  if fusion is None and reducer is None:
    optimizer.minimize(loss, variables, tape=tape)
    return
  grads = tape.gradient(loss, variables)
  if reducer is not None:
    grads = reducer.reduce(grads)
  elif fusion is not None:
    grads = _all_reduce_sum(grads)
  grads_and_vars = list(zip(grads, variables))
  if fusion is not None:
    fusion.apply_gradients(grads_and_vars)
  else:
    optimizer.apply_gradients(grads_and_vars, skip_gradients_aggregation=True)


def _all_reduce_sum(grads: List) -> List:
  """What tf_keras' optimizer does before updating: sum the gradients over sync replicas."""
  strategy = tf.distribute.get_strategy()
  if (not tf.distribute.has_strategy() or strategy.num_replicas_in_sync == 1 or
      isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)):
    return grads
  present = [g for g in grads if g is not None]
  reduced = iter(tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                                present))
  return [None if g is None else next(reduced) for g in grads]
