"""CodistillModel: identical to plain training without teachers; the distill term really acts."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill.losses import Distillation
from tf_codistill.teachers import quantization
from tf_codistill.teachers.spec import TeacherSpec
from tf_codistill.training import model as model_lib
from tf_codistill.training.model import CodistillModel
from tf_codistill.training.model import clone_architecture


def _data(n=256, batch=32, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 8)).astype("float32")
  y = (x[:, :1] + 0.3 * rng.normal(size=(n, 1)) > 0).astype("float32")
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def _functional(seed=1):
  inputs = keras.Input((8,))
  h = keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-3),
                         kernel_initializer=keras.initializers.GlorotUniform(seed))(inputs)
  out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed + 1))(h)
  return keras.Model(inputs, out)


def _sequential(seed=1):
  return keras.Sequential([
      keras.Input((8,)),
      keras.layers.Dense(16, activation="relu",
                         kernel_initializer=keras.initializers.GlorotUniform(seed)),
      keras.layers.Dense(1)])


class _Subclassed(keras.Model):

  def __init__(self):
    super().__init__()
    self.hidden = keras.layers.Dense(16, activation="relu")
    self.out = keras.layers.Dense(1)

  def call(self, x):
    return self.out(self.hidden(x))


def _compile(model):
  model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))


@pytest.mark.parametrize("make", [_functional, _sequential, _Subclassed])
def test_without_teachers_training_equals_plain_fit(make):
  plain = make()
  plain(tf.zeros([1, 8]))
  student = make()
  student(tf.zeros([1, 8]))
  student.set_weights(plain.get_weights())
  _compile(plain)
  history_plain = plain.fit(_data(), epochs=2, verbose=0)
  wrapped = CodistillModel(student)
  _compile(wrapped)
  history_wrapped = wrapped.fit(_data(), epochs=2, verbose=0)
  np.testing.assert_allclose(history_wrapped.history["loss"], history_plain.history["loss"],
                             rtol=1e-6)
  for a, b in zip(student.get_weights(), plain.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert history_wrapped.history["distill_loss"] == [0.0, 0.0]


def test_unloaded_teacher_and_burn_in_leave_training_unchanged():
  plain, student = _functional(), _functional()
  student.set_weights(plain.get_weights())
  _compile(plain)
  plain.fit(_data(), epochs=1, verbose=0)
  wrapped = CodistillModel(student, 1, distillation=Distillation(burn_in_steps=1000))
  _compile(wrapped)
  wrapped(tf.zeros([1, 8]))
  # A loaded teacher, but burn-in is not over: alpha_eff must stay 0.
  wrapped.set_teacher_weights(0, [w * 3 for w in student.get_weights()], step=5)
  history = wrapped.fit(_data(), epochs=1, verbose=0)
  for a, b in zip(student.get_weights(), plain.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert history.history["alpha"] == [0.0]


def _one_step_grads(alpha, teacher_weights):
  student = _functional()
  model = CodistillModel(student, 1, distillation=Distillation(alpha=alpha))
  _compile(model)
  model(tf.zeros([1, 8]))
  before = [w.copy() for w in student.get_weights()]
  if teacher_weights is not None:
    model.set_teacher_weights(0, teacher_weights(student), step=0)
  model.fit(_data().take(1), epochs=1, verbose=0)
  return [a - b for a, b in zip(student.get_weights(), before)], model


def test_distill_term_changes_the_update_when_a_teacher_is_loaded():
  flipped = lambda s: [w if i < 2 else -w * 5 - 1 for i, w in enumerate(s.get_weights())]
  no_teacher, _ = _one_step_grads(1.0, None)
  with_teacher, model = _one_step_grads(1.0, flipped)
  zero_alpha, _ = _one_step_grads(0.0, flipped)
  assert not np.allclose(no_teacher[-1], with_teacher[-1])
  for a, b in zip(no_teacher, zero_alpha):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert model.distill_loss_tracker.result().numpy() > 0


def test_teacher_swap_does_not_retrace_and_staleness_is_reported():
  student = _functional()
  model = CodistillModel(student, 1, distillation=Distillation(alpha=0.5))
  _compile(model)
  model(tf.zeros([1, 8]))
  history = model.fit(_data(), epochs=1, verbose=0)  # 8 steps, no teacher yet
  assert history.history["teacher_staleness"] == [-1.0]
  train_function = model.train_function
  traces = train_function.experimental_get_tracing_count()
  model.set_teacher_weights(0, student.get_weights(), step=3)
  history = model.fit(_data(), epochs=1, verbose=0)  # steps 9..16
  assert model.train_function is train_function
  assert train_function.experimental_get_tracing_count() == traces
  assert history.history["teacher_staleness"] == [16.0 - 3.0]
  assert history.history["alpha"] == [0.5]


def test_mean_over_two_teachers_uses_only_loaded_ones():
  student = _functional()
  model = CodistillModel(student, 2)
  model(tf.zeros([1, 8]))
  x = tf.random.normal([4, 8])
  model.set_teacher_weights(0, student.get_weights(), step=1)
  np.testing.assert_allclose(model.teacher_target(x).numpy(), tf.sigmoid(student(x)).numpy(),
                             rtol=1e-6)
  other = [w * 2 for w in student.get_weights()]
  model.set_teacher_weights(1, other, step=1)
  second = model.active_teacher(1)
  np.testing.assert_allclose(second.get_weights()[0], other[0])
  expected = (tf.sigmoid(student(x)) + tf.sigmoid(second(x))) / 2
  np.testing.assert_allclose(model.teacher_target(x).numpy(), expected.numpy(), rtol=1e-6)


class _NeedsArgs(keras.Model):

  def __init__(self, width):
    super().__init__()
    self.dense = keras.layers.Dense(width)

  def call(self, x):
    return self.dense(x)


def test_clone_of_a_subclassed_model_has_its_own_variables():
  original = _NeedsArgs(3)
  original(tf.zeros([1, 2]))
  clone = clone_architecture(original)
  clone(tf.zeros([1, 2]))
  assert clone is not original and len(clone.weights) == 2
  assert all(a is not b for a, b in zip(clone.weights, original.weights))


def test_bad_arguments_are_refused():
  with pytest.raises(ValueError, match=r"tfc\.Distillation\.temperature=0\.0 must be > 0"):
    CodistillModel(_functional(), distillation=Distillation(temperature=0.0))
  with pytest.raises(ValueError, match="teacher_weights has 1 entries for 0 teachers"):
    CodistillModel(_functional(), teacher_weights=[1.0])


def test_double_buffer_flips_and_never_touches_the_active_copy():
  student = _functional()
  model = CodistillModel(student, 1)
  model(tf.zeros([1, 8]))
  first = [w + 1 for w in student.get_weights()]
  model.set_teacher_weights(0, first, step=10)
  active = model.teacher_slots[0][model.active_slot[0].numpy()]
  inactive = model.inactive_teacher(0)
  assert active is not inactive and model.active_teacher(0) is active
  inactive.set_weights([w * 0 for w in first])  # what a background restore would do
  np.testing.assert_allclose(active.get_weights()[0], first[0])
  x = tf.random.normal([2, 8])
  np.testing.assert_allclose(model.teacher_target(x).numpy(), tf.sigmoid(active(x)).numpy(),
                             rtol=1e-6)
  model.activate_teacher(0, step=20)
  assert model.teacher_slots[0][model.active_slot[0].numpy()] is inactive
  assert model.active_teacher(0) is inactive
  assert model.teacher_steps.numpy().tolist() == [20]


def _case_lowering(graph) -> list:
  """``_lower_using_switch_merge`` of every Case op in ``graph``."""
  return [op.get_attr("_lower_using_switch_merge") for op in graph.get_operations()
          if op.type in ("Case", "StatelessCase")]


def test_traced_step_follows_active_slot_through_one_lowered_case_with_local_teachers():
  student = _functional()
  model = CodistillModel(student, 1)
  model(tf.zeros([1, 8]))
  target = tf.function(model.teacher_target)
  x = tf.random.normal([4, 8])
  model.set_teacher_weights(0, student.get_weights(), step=1)
  np.testing.assert_allclose(target(x).numpy(), tf.sigmoid(student(x)).numpy(), rtol=1e-6)
  doubled = [w * 2 for w in student.get_weights()]
  model.set_teacher_weights(0, doubled, step=2)  # restored into the other copy, then flipped
  second = model.active_teacher(0)
  np.testing.assert_allclose(second.get_weights()[0], doubled[0])
  np.testing.assert_allclose(target(x).numpy(), tf.sigmoid(second(x)).numpy(), rtol=1e-6)
  assert target.experimental_get_tracing_count() == 1
  # Local variables: lowered to Switch/Merge, the cheaper choice in one process.
  assert not model.teachers_are_remote()
  assert _case_lowering(target.get_concrete_function(x).graph) == [True]


def test_select_branch_keeps_one_case_op_when_asked_and_follows_the_index():
  values = [tf.Variable(1.0), tf.Variable(2.0), tf.Variable(3.0)]
  index = tf.Variable(0)
  for keep_case in (True, False):
    choose = tf.function(lambda: model_lib.select_branch(
        index.read_value(), [lambda v=v: v * 10.0 for v in values], keep_case=keep_case))
    for i, expected in enumerate((10.0, 20.0, 30.0)):
      index.assign(i)
      assert choose().numpy() == expected
    assert choose.experimental_get_tracing_count() == 1
    assert _case_lowering(choose.get_concrete_function().graph) == [not keep_case]
  index.assign(1)
  assert model_lib.select_branch(index, [lambda v=v: v * 10.0 for v in values]).numpy() == 20.0


def test_export_writes_the_student_with_the_serving_signature(tmp_path):
  from tf_codistill.training.model import export
  model = CodistillModel(_Subclassed(), teachers=TeacherSpec(factory=_Subclassed))
  x = tf.random.stateless_normal([3, 8], seed=[4, 2])
  with pytest.raises(ValueError, match="input spec is unknown"):
    export(model.student, str(tmp_path / "never_called"))
  model(x)  # the spec of the first call is the signature's input
  export(model, str(tmp_path / "codistill"))
  functional = _functional()
  export(functional, str(tmp_path / "functional"))
  for name, reference in (("codistill", model.student), ("functional", functional)):
    serve = tf.saved_model.load(str(tmp_path / name)).signatures["serving_default"]
    assert serve.structured_input_signature[1]["inputs"].shape.as_list() == [None, 8]
    np.testing.assert_allclose(serve(inputs=x)["logits"], reference(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["ctr", "lm"])
def test_the_distill_term_is_the_loss_toward_the_teachers_target_and_zero_when_off(name):
  # The teachers' forward passes are a cond (model._teachers_term_inputs) and the loss is gated
  # by tf.where (model._distill_term): the term must still be the distillation loss of the
  # student's logits toward the averaged teacher target, and exactly zero when off.
  from tf_codistill import losses

  from testing_utils import project_model
  student, output, x = project_model(name)
  peer, _, _ = project_model(name)
  peer.set_weights([w + 0.05 for w in student.get_weights()])
  model = CodistillModel(student, 1, output=output, distillation=Distillation(temperature=2.0))
  model(x)
  model.set_teacher_weights(0, peer.get_weights(), step=0)
  logits = student(x, training=False)
  want = losses.distillation_loss(logits, model.teacher_target(x), output=output,
                                  temperature=2.0)
  term = tf.function(lambda x, logits, alpha: model._distill_term(
      logits, model._teachers_term_inputs(x, logits, alpha)))
  np.testing.assert_allclose(float(term(x, logits, tf.constant(1.0))), float(want), rtol=1e-6)
  assert float(term(x, logits, tf.constant(0.0))) == 0.0


def test_sample_weights_weigh_the_distillation_term_as_they_weigh_the_task_loss():
  # A padded example (weight 0) is pulled toward no teacher; doubling every weight doubles both
  # terms, as Keras does for the task loss.
  x, y = next(iter(_data(32, 32)))

  def one_step(weight):
    model = _with_loaded_teacher()
    model.set_teacher_weights(0, _functional(seed=7).get_weights(), step=0)
    logs = model.train_on_batch(x, y, sample_weight=weight, return_dict=True)
    return logs, model.student.get_weights()
  ones, _ = one_step(np.ones(32, "float32"))
  twos, _ = one_step(np.full(32, 2.0, "float32"))
  zeros, weights = one_step(np.zeros(32, "float32"))
  assert ones["distill_loss"] > 0 and zeros["distill_loss"] == 0.0
  assert twos["distill_loss"] == pytest.approx(2 * ones["distill_loss"], rel=1e-5)
  # The task loss holds the student's L2 penalty, which no sample weight scales.
  penalty = zeros["task_loss"]
  assert twos["task_loss"] - penalty == pytest.approx(2 * (ones["task_loss"] - penalty), rel=1e-5)
  untrained = _with_loaded_teacher()
  for after, before in zip(weights, untrained.student.get_weights()):  # only the L2 penalty
    np.testing.assert_allclose(after, before, atol=1e-3)


def test_a_step_with_a_loaded_teacher_compiles_under_xla():
  # Both branches of the teachers' cond give a target of the logits' shape, as XLA requires.
  model = CodistillModel(_functional(), 1,
                         teachers=TeacherSpec(factory=lambda: _functional(seed=5)))
  model.compile(optimizer=keras.optimizers.Adam(1e-2),
                loss=keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=True)
  model(tf.zeros([1, 8]))
  model.set_teacher_weights(0, _functional(seed=7).get_weights(), step=0)
  history = model.fit(_data(64, 16), epochs=1, verbose=0)
  assert history.history["distill_loss"][-1] > 0 and np.isfinite(history.history["loss"][-1])


def _with_loaded_teacher(teacher_factory=None, seed=1):
  student = _functional(seed)
  model = CodistillModel(student, 1, teachers=TeacherSpec(factory=teacher_factory and (
      lambda: teacher_factory(student))))
  _compile(model)
  model(tf.zeros([2, 8]))
  return model


@pytest.mark.parametrize("saved, resumed", [
    (None, lambda s: clone_architecture(s, "bfloat16")),
    (lambda s: clone_architecture(s, "bfloat16"), None),
    (lambda s: clone_architecture(s, "mixed_bfloat16"),
     lambda s: clone_architecture(s, "bfloat16")),
    (None, quantization.int8_copy)])
def test_a_checkpoint_restores_no_teacher_into_teachers_of_another_form(tmp_path, saved, resumed):
  # Keyed by form: a resumed run with another teacher precision restores its student and no
  # teacher (teacher_steps -1: the exchange reloads the peers), instead of failing on dtypes.
  model = _with_loaded_teacher(saved)
  model.set_teacher_weights(0, _functional(seed=7).get_weights(), step=5)
  path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
  fresh = _with_loaded_teacher(resumed, seed=3)
  tf.train.Checkpoint(model=fresh).read(path).expect_partial()
  for got, want in zip(fresh.student.get_weights(), model.student.get_weights()):
    np.testing.assert_array_equal(got, want)
  assert fresh.teacher_steps.numpy().tolist() == [-1]
  assert float(fresh._effective_alpha()) == 0.0
  assert fresh.teacher_state_key != model.teacher_state_key


@pytest.mark.parametrize("form", [None, lambda s: clone_architecture(s, "bfloat16")])
def test_a_checkpoint_restores_teachers_of_the_same_form(tmp_path, form):
  model = _with_loaded_teacher(form)
  model.set_teacher_weights(0, _functional(seed=7).get_weights(), step=5)
  path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
  keys = [name for name, _ in tf.train.list_variables(path)]
  # Clones keep the keys of every checkpoint before the form key existed.
  for name in ("teacher_slots", "teacher_steps", "active_slot"):
    prefix = f"model/{name}{model.teacher_state_key}/"
    assert any(k.startswith(prefix) for k in keys), (prefix, keys)
  assert (model.teacher_state_key == "") == (form is None)
  fresh = _with_loaded_teacher(form, seed=3)
  tf.train.Checkpoint(model=fresh).read(path).assert_existing_objects_matched()
  assert fresh.teacher_steps.numpy().tolist() == [5]
  x = tf.random.normal([4, 8])
  np.testing.assert_array_equal(fresh.active_teacher(0)(x), model.active_teacher(0)(x))
