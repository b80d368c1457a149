"""Optimizer fusion in Keras models (fused_models.py): fused fit gives the weights of unfused fit,
in CodistillModel, checkpoints and the trainer; what cannot be fused is refused."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill.exchange import publishing
from tf_codistill.losses import Distillation
from tf_codistill.optim import fused_models
from tf_codistill.optim import fusion
from tf_codistill.training import checkpointing
from tf_codistill.training import group as group_lib
from tf_codistill.training import inputs
from tf_codistill.training import trainer
from tf_codistill.training.model import CodistillModel

import fusion_cases as cases


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("mode", ["kernels", "backward", "forward"])
@pytest.mark.parametrize("name", sorted(cases.OPTIMIZERS))
def test_fused_training_gives_the_weights_of_unfused_training(name, mode, jit):
  reference = cases.compiled(cases.OPTIMIZERS[name], jit)
  reference.fit(cases.data(), epochs=2, verbose=0)
  fused = fused_models.fuse(cases.compiled(cases.OPTIMIZERS[name], jit), mode)
  fused.fit(cases.data(), epochs=2, verbose=0)
  assert int(fused.optimizer.iterations.numpy()) == 2 * cases.STEPS
  cases.assert_same(reference.get_weights(), fused.get_weights())
  # The optimizer's state is tf_keras' own (SGD without momentum never reads its slot).
  cases.assert_same(cases.slots(reference.optimizer), cases.slots(fused.optimizer))


@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05, clipnorm=0.5, amsgrad=True),
    lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True, clipvalue=0.1),
    lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.02, 3, 0.5)),
], ids=["adamw_decay_clipnorm_amsgrad", "rmsprop_centered_clipvalue", "adam_lr_schedule"])
def test_other_optimizers_and_per_variable_options_match(make):
  reference = cases.compiled(make, False)
  reference.fit(cases.data(), epochs=1, verbose=0)
  fused = fused_models.fuse(cases.compiled(make, False), "forward")
  fused.fit(cases.data(), epochs=1, verbose=0)
  cases.assert_same(reference.get_weights(), fused.get_weights())


@pytest.mark.parametrize("mode", ["backward", "forward"])
def test_lstm_reading_its_cell_weights_gets_them_updated(mode):
  def make():
    tokens = keras.Input((5,), dtype=tf.int64)
    x = keras.layers.Embedding(20, 4, embeddings_initializer=keras.initializers.RandomUniform(
        -0.1, 0.1, seed=1))(tokens)
    x = keras.layers.LSTM(6, return_sequences=True, kernel_initializer=keras.initializers
                          .GlorotUniform(2), recurrent_initializer=keras.initializers
                          .Orthogonal(seed=3))(x)
    return keras.Model(tokens, keras.layers.Dense(20, kernel_initializer=keras.initializers
                                                  .GlorotUniform(4))(x))

  rng = np.random.default_rng(0)
  ids = rng.integers(0, 20, size=(48, 6))
  data = tf.data.Dataset.from_tensor_slices((ids[:, :-1], ids[:, 1:])).batch(8)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  reference = make()
  reference.compile(keras.optimizers.Adam(0.01), loss)
  reference.fit(data, epochs=1, verbose=0)
  fused = make()
  fused.compile(keras.optimizers.Adam(0.01), loss)
  fused_models.fuse(fused, mode).fit(data, epochs=1, verbose=0)
  cases.assert_same(reference.get_weights(), fused.get_weights())


def test_forward_fusion_defers_each_update_to_the_next_step_until_flushed():
  seen = []
  model = fused_models.fuse(cases.compiled(cases.OPTIMIZERS["adam"], False), "forward")
  initial = model.get_weights()
  record = keras.callbacks.LambdaCallback(
      on_train_batch_end=lambda batch, logs: seen.append(model.get_weights()))
  model.fit(cases.data().take(2), epochs=1, verbose=0, callbacks=[record])
  # After step 1 nothing is applied yet; step 2 applied step 1's update before its forward pass.
  cases.assert_same(initial, seen[0], rtol=0, atol=0)
  reference = cases.compiled(cases.OPTIMIZERS["adam"], False)
  reference.fit(cases.data().take(1), epochs=1, verbose=0)
  cases.assert_same(reference.get_weights(), seen[1])
  # fit flushed at the end: both updates are in.
  assert not model.fusion.pending
  reference.fit(cases.data().skip(1).take(1), epochs=1, verbose=0)
  cases.assert_same(reference.get_weights(), model.get_weights())


@pytest.mark.parametrize("mode", ["backward", "forward"])
def test_codistill_model_with_a_teacher_trains_the_same_fused(mode):
  def run(fusion_mode):
    student = cases.model()
    model = CodistillModel(student, 1, distillation=Distillation(alpha=0.5), fusion=fusion_mode)
    model.compile(keras.optimizers.Adam(0.01), keras.losses.BinaryCrossentropy(from_logits=True))
    model(next(iter(cases.data()))[0])
    model.set_teacher_weights(0, [w * 2 for w in student.get_weights()], step=0)
    history = model.fit(cases.data(), epochs=2, verbose=0)
    return student.get_weights(), history.history

  weights, history = run("none")
  fused_weights, fused_history = run(mode)
  cases.assert_same(weights, fused_weights)
  np.testing.assert_allclose(fused_history["distill_loss"], history["distill_loss"], rtol=1e-4)
  assert history["distill_loss"][-1] > 0


def test_backup_checkpoints_and_snapshots_hold_flushed_weights(tmp_path):
  model = CodistillModel(cases.model(), fusion="forward")
  model.compile(keras.optimizers.Adam(0.01), keras.losses.BinaryCrossentropy(from_logits=True))
  snapshots = []
  local = publishing.LocalCopy(model.student, cases.model(), before_snapshot=model.flush_fusion)
  backup = fused_models.BackupAndRestore(str(tmp_path / "backup"), model.flush_fusion, save_freq=4,
                                   delete_checkpoint=False)
  take = keras.callbacks.LambdaCallback(
      on_train_batch_end=lambda batch, logs: batch == 2 and snapshots.append(local.snapshot()))
  model.fit(cases.data(), epochs=1, verbose=0, callbacks=[backup, take])

  reference = cases.compiled(cases.OPTIMIZERS["adam"], False)
  reference.fit(cases.data().take(3), epochs=1, verbose=0)
  cases.assert_same(reference.get_weights(), snapshots[0])  # publish/eval path: flushed at step 3
  reference.fit(cases.data().skip(3).take(1), epochs=1, verbose=0)
  # The backup written after step 4 holds the weights after 4 updates, not 3.
  reader = tf.train.load_checkpoint(str(tmp_path / "backup" / "chief"))
  kernel = [k for k in reader.get_variable_to_shape_map()
            if k.startswith("model/student/layer_with_weights-0/embeddings/")
            and k.endswith("VARIABLE_VALUE")]
  assert len(kernel) == 1, kernel
  np.testing.assert_allclose(reader.get_tensor(kernel[0]), reference.get_weights()[0],
                             rtol=1e-4, atol=2e-5)
  # Pending gradients are not checkpointed (nothing is pending at a save).
  assert not [k for k in reader.get_variable_to_shape_map() if "fusion" in k]


def test_global_norm_clipping_is_refused_with_the_binding_named():
  model = CodistillModel(cases.model(), fusion="backward", fusion_binding="trainer.train.fusion")
  with pytest.raises(fusion.FusionError, match=r"trainer.train.fusion='backward' cannot be "
                     r"combined with global_clipnorm=1.0.*clipnorm or clipvalue"):
    model.compile(keras.optimizers.Adam(0.01, global_clipnorm=1.0), "mse")
  plain = cases.compiled(lambda: keras.optimizers.SGD(0.1, global_clipnorm=2.0), False)
  with pytest.raises(fusion.FusionError, match="global_clipnorm"):
    fused_models.fuse(plain, "forward")


def test_unsupported_optimizers_and_modes_are_refused():
  with pytest.raises(fusion.FusionError, match=r"no fused update for .*Nadam.*supported"):
    fused_models.fuse(cases.compiled(lambda: keras.optimizers.Nadam(0.01), False), "backward")
  with pytest.raises(fusion.FusionError, match=r"fusion='sideways' is not one of"):
    CodistillModel(cases.model(), fusion="sideways")
  with pytest.raises(fusion.FusionError, match="use_ema"):
    fused_models.fuse(cases.compiled(lambda: keras.optimizers.SGD(0.1, use_ema=True), False),
                      "backward")
  # 'none' leaves the model alone.
  model = cases.compiled(cases.OPTIMIZERS["sgd"], False)
  assert fused_models.fuse(model, "none") is model and "train_step" not in model.__dict__


def test_trainer_refuses_bad_fusion_bindings(tmp_path):
  files = dict(data=inputs.Data(train_files=["x"], eval_files=["y"]))
  with pytest.raises(trainer.ConfigurationError, match="trainer.train.fusion='fast'"):
    trainer.train(str(tmp_path), fusion="fast", **files)
  with pytest.raises(trainer.ConfigurationError, match="fusion='forward' cannot run under"):
    trainer.train(str(tmp_path), fusion="forward",
                  shape=group_lib.Group("parameter_server", 1, 1), **files)


@pytest.mark.parametrize("mode", ["forward"])
def test_trainer_with_fusion_exports_the_weights_of_unfused_training(tmp_path, criteo_dir, mode):
  def run(name, fusion_mode):
    model_dir = str(tmp_path / name)
    results = trainer.train(
        model_dir, data=inputs.Data(
            train_files=[f"{criteo_dir}/train-*"], eval_files=[f"{criteo_dir}/eval-*"],
            dataset_fn=lambda *a, **k: _criteo(*a, **k), batch_size=64, shuffle_buffer=1),
        model_fn=_ctr, train_steps=12, steps_per_epoch=6, eval_steps=2,
        checkpoints=checkpointing.Checkpoints(every_steps=4),
        fusion=fusion_mode, verbose=0)
    reader = tf.train.load_checkpoint(os.path.join(model_dir, "export", "variables", "variables"))
    return results, sorted((k, reader.get_tensor(k)) for k in reader.get_variable_to_shape_map()
                           if k.startswith("layer_with_weights"))

  results, weights = run("none", "none")
  fused_results, fused_weights = run(mode, mode)
  assert fused_results["steps"] == results["steps"] == 12
  assert len(weights) == 26 + 4
  for (name, a), (_, b) in zip(weights, fused_weights):
    np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-6, err_msg=name)
  assert fused_results["val_logloss"] == pytest.approx(results["val_logloss"], rel=1e-4)


def _criteo(*args, **kwargs):
  from data_pipelines import criteo  # pylint: disable=g-import-not-at-top
  return criteo.make_dataset(*args, num_buckets=1000, **kwargs)


def _ctr():
  from tf_codistill.models import ctr  # pylint: disable=g-import-not-at-top
  return ctr.ctr_model(num_buckets=1000, embedding_dim=4, hidden_units=(16,), seed=3)
