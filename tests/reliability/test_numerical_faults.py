"""Numerical faults: a NaN/Inf loss stops training with a message naming the step, keeps the last
good checkpoint and the last good published model, and no non-finite model is ever published.

The fault is a real divergence, not an injected NaN: the learning rate jumps to 1e30 at step 100
(a piecewise-constant schedule bound in gin), so the weights blow up and the loss turns NaN/Inf a
few steps later.
"""

import glob
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from tf_codistill import errors
from tf_codistill import step_hooks
from tf_codistill.exchange import directory as exchange
from tf_codistill.exchange import publishing
from tf_codistill.training import checkpointing

from testing_utils import Launch
from testing_utils import error_lines
from testing_utils import launch_args
from testing_utils import run
from testing_utils import small_net
from testing_utils import train_args

DIVERGE_AT = 100
DIVERGE = ("trainer.train.learning_rate = @schedules.PiecewiseConstantDecay()",
           f"schedules.PiecewiseConstantDecay.boundaries = [{DIVERGE_AT}]",
           "schedules.PiecewiseConstantDecay.values = [1e-3, 1e30]",
           "tfc.Checkpoints.every_steps = 40",
           "trainer.train.heartbeat_every_s = 0.1")
SPEC = tf.TensorSpec([None, 4], tf.float32)


def _finite_checkpoint(path):
  """True if every floating-point value in the checkpoint at ``path`` is finite."""
  reader = tf.train.load_checkpoint(path)
  for key, dtype in reader.get_variable_to_dtype_map().items():
    if dtype.is_floating and not np.isfinite(reader.get_tensor(key)).all():
      return False
  return True


@pytest.mark.e2e
def test_nan_loss_stops_at_its_step_keeping_the_last_good_checkpoint_and_published_model(
    tmp_path, criteo_dir):
  model_dir, exchange_dir = tmp_path / "group_0", tmp_path / "exchange"
  proc = run(train_args(str(model_dir), criteo_dir, "--group=0", "--num_groups=2",
                        f"--exchange_dir={exchange_dir}", gin="codistill_2way.gin",
                        bindings=DIVERGE), timeout=600)
  assert proc.returncode == errors.NON_FINITE_EXIT_CODE, proc.stderr[-3000:]
  [line] = error_lines(proc.stderr)
  match = re.search(r"training stopped: non-finite loss at step (\d+) \((.*?)\); nothing of this "
                    r"step or later was checkpointed or published; kept: last checkpoint (\S+) "
                    r"\(step (\d+); a restart resumes from it\), last published version (\S+)\. "
                    r"Lower trainer.train.learning_rate", line)
  assert match, line
  step, checkpoint, checkpoint_step, published = (int(match.group(1)), match.group(3),
                                                  int(match.group(4)), match.group(5))
  assert step > DIVERGE_AT and re.search(r"=(nan|inf|-inf)\b", match.group(2)), line
  # The last good checkpoint: taken before the divergence, every value finite.
  assert (checkpoint_step <= DIVERGE_AT
          and checkpointing.checkpoint_step(checkpoint) == checkpoint_step)
  assert _finite_checkpoint(checkpoint)
  # The last good published model, and every published model, is from before the NaN step.
  versions = exchange.list_versions(str(exchange_dir), 0)
  assert versions and versions[0].path == published
  for version in versions:
    assert version.step < step
    exchange.verify(version)
    assert _finite_checkpoint(os.path.join(version.path, "variables", "variables"))
  assert not glob.glob(f"{exchange_dir}/group_0/.tmp-*")
  # No final export and no results: the run did not pretend to finish.
  assert not (model_dir / "export").exists() and not (model_dir / "results.json").exists()


@pytest.mark.cluster
def test_nan_loss_under_parameter_servers_stops_the_group_without_retrying(tmp_path, criteo_dir):
  model_dir = tmp_path / "job"
  launch = Launch(launch_args(str(model_dir), criteo_dir, "--num_groups=1", "--max_restarts=2",
                              "--strategy=parameter_server", "--workers_per_group=1",
                              "--ps_per_group=1", gin="baseline.gin", bindings=DIVERGE))
  assert launch.wait(timeout=600) == 1, launch.stderr[-3000:]
  assert re.search(r"group 0 chief:0 stopped on a non-finite loss \(exit status 4\), not "
                   r"restarted", launch.stderr), launch.stderr[-3000:]
  assert "restarting" not in launch.stderr  # a divergence is not a process fault
  chief_log = open(model_dir / "group_0" / "chief_0.log").read()
  [line] = error_lines(chief_log)
  step = int(re.search(r"non-finite loss at step (\d+)", line).group(1))
  assert step > DIVERGE_AT
  # Epoch checkpoints (every 80 steps) that exist are all from before the NaN and finite.
  checkpoints = tf.train.get_checkpoint_state(str(model_dir / "group_0" / "checkpoints"))
  for path in checkpoints.all_model_checkpoint_paths:
    assert checkpointing.checkpoint_step(path) < step and _finite_checkpoint(path)


def test_guard_names_the_step_and_the_non_finite_losses():
  guard = step_hooks.NonFiniteGuard()
  guard.check(7, {"loss": 0.5, "task_loss": 0.5, "distill_loss": 0.0})
  with pytest.raises(errors.NonFiniteLossError,
                     match=r"non-finite loss at step 8 \(distill_loss=inf, loss=nan\)") as info:
    guard.check(8, {"loss": float("nan"), "task_loss": 0.5, "distill_loss": float("inf")})
  assert info.value.step == 8 and guard.step == 8


@pytest.mark.parametrize("poison,reason", [
    (lambda w: np.full_like(w, np.nan), "its weights contain NaN/Inf"),
    (lambda w: np.full_like(w, 1e30),
     "its predictions on a probe batch of real inputs are NaN/Inf"),
], ids=["nan_weights", "inf_predictions"])
def test_publisher_never_publishes_a_non_finite_model(tmp_path, caplog, poison, reason):
  student, local = small_net(), small_net()
  publisher = publishing.ExchangePublisher(publishing.LocalCopy(student, local), str(tmp_path), 0,
                                          publish_every_steps=10, input_spec=SPEC,
                                          probe=tf.ones([8, 4]))
  publisher.on_begin(None, 0)
  publisher.on_step(None, 10, {})
  publisher._in_flight.result()
  student.set_weights([poison(w) for w in student.get_weights()])
  with caplog.at_level("ERROR"):
    publisher.on_step(None, 20, {})
    publisher.on_end(None, 25)
  assert f"not publishing step 20: {reason}" in caplog.text
  assert publisher.refused == 2 and publisher.failures == 0
  assert [v.step for v in exchange.list_versions(str(tmp_path), 0)] == [10]


def test_epoch_checkpoint_is_skipped_for_a_non_finite_epoch(tmp_path):
  model = small_net()
  model.compile(optimizer="sgd", loss="mse")
  model.optimizer.iterations.assign(80)
  checkpoints = checkpointing.EpochCheckpoint(str(tmp_path), model)
  checkpoints.set_model(model)
  checkpoints.on_epoch_end(0, {"loss": 0.3})
  model.optimizer.iterations.assign(160)
  checkpoints.on_epoch_end(1, {"loss": float("nan")})
  assert [checkpointing.checkpoint_step(p) for p in checkpoints.manager.checkpoints] == [80]
