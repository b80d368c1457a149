"""tfc.Checkpoints, checked when made; EpochCheckpoint: parameter-server groups' checkpoints,
kept and restored like CheckpointManager's, saved through one traced function (no ps memory
growth per save)."""

import os
import re
import threading

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tf_codistill as tfc
from tf_codistill import layout
from tf_codistill.errors import ConfigurationError
from tf_codistill.training import checkpointing

from testing_utils import run_ps_coordinator
from testing_utils import small_net


@pytest.mark.parametrize("field", ["every_steps", "max_to_keep"])
def test_intervals_and_counts_below_one_are_refused_naming_the_setting(field):
  with pytest.raises(ConfigurationError, match=f"tfc.Checkpoints.{field}=0 must be >= 1"):
    checkpointing.Checkpoints(**{field: 0})


def _compiled(seed=0):
  model = small_net(seed=seed)
  model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
  model.fit(tf.ones([8, 4]), tf.ones([8, 1]), epochs=1, verbose=0)  # slots and iterations exist
  return model


def test_saves_keep_the_newest_and_a_new_run_restores_the_last(tmp_path):
  model = _compiled()
  checkpoints = checkpointing.EpochCheckpoint(str(tmp_path), model, max_to_keep=2)
  for step in (10, 20, 30):
    checkpoints.save(step)
  assert checkpoints.manager.checkpoints == [str(tmp_path / "ckpt-20"), str(tmp_path / "ckpt-30")]
  assert not tf.io.gfile.glob(str(tmp_path / "ckpt-10.*"))
  assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-30")
  # A restarted run (another model object) restores the newest, optimizer included.
  fresh = _compiled(seed=5)
  restored = checkpointing.EpochCheckpoint(str(tmp_path), fresh)
  assert restored.restore() == 1
  for got, want in zip(fresh.get_weights(), model.get_weights()):
    np.testing.assert_array_equal(got, want)
  for got, want in zip(fresh.optimizer.variables(), model.optimizer.variables()):
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  # Later saves go on from the kept ones.
  restored.save(40)
  assert restored.manager.checkpoints == [str(tmp_path / "ckpt-30"), str(tmp_path / "ckpt-40")]


def test_variables_created_after_the_first_save_are_saved_too(tmp_path):
  model = small_net()
  model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
  checkpoints = checkpointing.EpochCheckpoint(str(tmp_path), model)
  checkpoints.save(0)  # before any step: no optimizer slots yet
  model.fit(tf.ones([8, 4]), tf.ones([8, 1]), epochs=1, verbose=0)
  checkpoints.save(1)
  def optimizer_keys(step):
    keys = tf.train.load_checkpoint(str(tmp_path / f"ckpt-{step}")).get_variable_to_shape_map()
    return [k for k in keys if k.startswith("optimizer/")]

  # Adam's two slots of each of the 4 trainable variables appear in the second save.
  assert len(optimizer_keys(1)) == len(optimizer_keys(0)) + 2 * 4


# A parameter-server group's coordinator (its own process: connecting to a cluster changes the
# process's eager context for good) saves 200 + 100 checkpoints of a model on the ps and reports
# the ps task's resident memory growth over the last 100 and how often the save was traced.
_PS_COORDINATOR = r"""
import tf_keras as keras
from testing_utils import run_ps_coordinator, small_net
from tf_codistill.training import checkpointing

def rss_mib(pid):
  with open(f"/proc/{pid}/status") as f:
    return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

with strategy.scope():
  model = small_net()
  model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
  model.optimizer.build(model.trainable_variables)
checkpoints = checkpointing.EpochCheckpoint(args[0], model)
for step in range(200):  # the ps's allocator grows through the first ~200 saves either way
  checkpoints.save(step)
before = rss_mib(ps_pid)
for step in range(200, 300):
  checkpoints.save(step)
print(json.dumps({"growth_mib": rss_mib(ps_pid) - before,
                  "traces": checkpoints._write.experimental_get_tracing_count(),
                  "kept": checkpoints.manager.checkpoints}))
"""


@pytest.mark.cluster
def test_saves_under_parameter_servers_leave_the_ps_memory_flat(tmp_path):
  """Saved eagerly, each of these saves grew the ps by about 0.5 MiB (a function traced per
  save, kept by the ps for good): 100 saves grew it by about 50 MiB."""
  report = run_ps_coordinator(_PS_COORDINATOR, tmp_path / "ckpt")
  assert report["growth_mib"] < 10, report
  assert report["traces"] == 1
  assert report["kept"] == [str(tmp_path / "ckpt" / f"ckpt-{s}") for s in (298, 299)]


def test_the_resume_step_is_the_newest_checkpoints_optimizer_step(tmp_path):
  run = layout.RunDir(str(tmp_path))
  assert checkpointing.newest_step(run.checkpoints) == 0
  assert tfc.resume_step(str(tmp_path)) == 0  # nothing to resume: it starts over
  model = _compiled()
  checkpoints = checkpointing.EpochCheckpoint(run.checkpoints, model)
  for step in (30, 60):
    model.optimizer.iterations.assign(step)
    checkpoints.save(step)
  assert checkpointing.newest_step(run.checkpoints) == 60
  assert tfc.resume_step(str(tmp_path)) == 60
  assert checkpointing.backup_checkpoints(run.backup) == os.path.join(run.backup, "chief")


def _two_checkpoints(tmp_path):
  run = layout.RunDir(str(tmp_path))
  model = _compiled()
  checkpoints = checkpointing.EpochCheckpoint(run.checkpoints, model)
  for step in (30, 60):
    model.optimizer.iterations.assign(step)
    checkpoints.save(step)
  return run.checkpoints, model


@pytest.mark.parametrize("damage", ["state_file", "index_gone", "index_truncated"])
def test_checkpoints_that_cannot_be_resumed_from_stop_the_run_naming_them(tmp_path, damage):
  # TF would find no newest checkpoint (or fail on it) and the run would start over, rewriting
  # its progress: it stops instead, before anything is trained, naming the directory.
  directory, model = _two_checkpoints(tmp_path)
  if damage == "state_file":
    with open(os.path.join(directory, "checkpoint"), "w") as f:
      f.write("model_checkpoint_path: \"ckpt-60")  # cut short: not a readable state
  elif damage == "index_gone":
    os.remove(os.path.join(directory, "ckpt-60.index"))
  else:
    with open(os.path.join(directory, "ckpt-60.index"), "r+b") as f:
      f.truncate(10)
  with pytest.raises(ConfigurationError, match=re.escape(directory)) as raised:
    checkpointing.newest_step(directory)
  assert "move" in str(raised.value) and "start over" in str(raised.value)
  with pytest.raises(ConfigurationError, match=re.escape(directory)):
    tfc.resume_step(str(tmp_path))
  with pytest.raises(ConfigurationError, match=re.escape(directory)):
    checkpointing.EpochCheckpoint(directory, model).restore()


def test_a_save_under_way_is_not_taken_for_damage(tmp_path):
  # What a reader of a running group's directory can see (CI saw it: a test polling
  # tfc.resume_step): the state file read still names the old checkpoint, whose .index the save's
  # sweep has just deleted; the save had already named its new checkpoint in the state file.
  directory, _ = _two_checkpoints(tmp_path)
  state = os.path.join(directory, "checkpoint")
  with open(state) as f:
    newest_state = f.read()
  with open(state, "w") as f:
    f.write(re.sub(r'^(model_checkpoint_path: ".*ckpt-)60"', r'\g<1>30"', newest_state))
  os.remove(os.path.join(directory, "ckpt-30.index"))
  writer = threading.Timer(0.1, lambda: open(state, "w").write(newest_state))
  writer.start()
  try:
    assert checkpointing.newest_step(directory) == 60
  finally:
    writer.join()


def test_a_first_checkpoint_cut_short_starts_the_run_over(tmp_path):
  directory, _ = _two_checkpoints(tmp_path)
  os.remove(os.path.join(directory, "checkpoint"))  # killed before its state file was written
  assert checkpointing.newest_step(directory) == 0


def test_step_backups_count_steps_wait_for_the_epochs_end_and_outlive_fit(tmp_path):
  model = small_net()
  model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", steps_per_execution=2)
  backup_dir = str(tmp_path / "backup")
  flushed = []
  backup = checkpointing.StepBackup(backup_dir, lambda: flushed.append(1), every_steps=3)
  newest = checkpointing.backup_checkpoints(backup_dir)
  seen_at_epoch_end = []  # what a callback before the backup (the evaluation) sees
  before = keras.callbacks.LambdaCallback(
      on_epoch_end=lambda epoch, logs: seen_at_epoch_end.append(checkpointing.newest_step(newest)))
  data = tf.data.Dataset.from_tensors((tf.ones([4, 4]), tf.ones([4, 1]))).repeat()
  model.fit(data, epochs=2, steps_per_epoch=6, callbacks=[before, backup], verbose=0)
  # Executions end at steps 2, 4, 6 | 8, 10, 12; backups every 3 steps: at 4, at 6 (the epoch's
  # last step: after the callbacks before it), at 10, at 12 (the same).
  assert seen_at_epoch_end == [4, 10]
  assert checkpointing.newest_step(newest) == 12 and len(flushed) == 4
  assert tfc.resume_step(str(tmp_path)) == 12  # kept after fit: run again, it resumes at its end
  # A backup records the execution's last step within its epoch (step 12 is batch 5 of epoch 1;
  # tf_keras records the first, 4), so a resumed fit goes on at the next step, not at steps it
  # has taken.
  reader = tf.train.load_checkpoint(
      [p for p in tf.train.get_checkpoint_state(newest).all_model_checkpoint_paths][0])
  assert reader.get_tensor("ckpt_saved_batch/.ATTRIBUTES/VARIABLE_VALUE") == 5  # step 12


def test_a_resumed_run_takes_the_configured_alpha_and_learning_rate_not_the_checkpoints():
  from tf_codistill.training.model import CodistillModel
  model = CodistillModel(small_net(), 1)
  model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
  model(tf.zeros([1, 4]))
  model.alpha.assign(0.5)  # as a checkpoint of a run configured so restores them
  model.optimizer.learning_rate.assign(0.01)
  data = tf.data.Dataset.from_tensor_slices(
      (np.ones([8, 4], "float32"), np.ones([8, 1], "float32"))).batch(8)
  model.fit(data, epochs=1, verbose=0, callbacks=[checkpointing.ConfiguredValues(1.0, 0.1)])
  assert float(model.alpha.numpy()) == 1.0
  assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.1)


def test_checkpoints_under_a_relative_or_moved_directory_are_resumed_from(tmp_path, monkeypatch):
  # The state file names checkpoints relative to their directory, as TF reads them: a relative
  # --model_dir, or a run directory moved elsewhere, resumes instead of being refused as damaged.
  monkeypatch.chdir(tmp_path)
  model = _compiled()
  checkpoints = checkpointing.EpochCheckpoint(os.path.join("run", "checkpoints"), model)
  for step in (30, 60):
    model.optimizer.iterations.assign(step)
    checkpoints.save(step)
  assert checkpointing.newest_step(os.path.join("run", "checkpoints")) == 60
  os.rename("run", "moved")
  again = _compiled()
  assert checkpointing.EpochCheckpoint(os.path.join("moved", "checkpoints"), again).restore() == 60
  assert checkpointing.newest_step(str(tmp_path / "moved" / "checkpoints")) == 60

