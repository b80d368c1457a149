"""Teacher trust and integrity: what a peer publishes is checked before it can teach.

A version whose signature differs from the student's (input shape, output size, dtype) or whose
variables do not fit is refused with a warning and never used; a teacher with NaN/Inf weights or
NaN/Inf predictions on real inputs is dropped for that refresh (the next good version loads); in
a training step, a teacher whose predictions on the batch are not finite counts for nothing;
links in the exchange directory are never followed; and loading a teacher never runs the peer's
graph. See SECURITY.md for what this does and does not protect against.
"""

import json
import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill.exchange import directory as exchange
from tf_codistill.training.model import CodistillModel

from testing_utils import activate_all
from testing_utils import small_net
from testing_utils import student_and_pool

SPEC = tf.TensorSpec([None, 4], tf.float32)
PROBE = tf.random.stateless_normal([16, 4], seed=[1, 2])


def _assert_refused_then_next_version_used(model, pool, tmp_path, caplog, path, reason):
  """The refused version is warned about and never used; a later good one is."""
  assert path in caplog.text and reason in caplog.text, caplog.text[-2000:]
  assert "keeping the previous teacher" in caplog.text
  activate_all(model, pool)
  assert model.teacher_steps.numpy().tolist() == [-1] and pool.rejections == 1
  good = small_net(seed=5)
  exchange.publish(good, str(tmp_path), 1, 30, SPEC, keep_last=5)
  assert pool.poll_once() == 1
  activate_all(model, pool)
  assert model.teacher_steps.numpy().tolist() == [30]


def _huge(net, value=1e30):
  """``net`` with finite but huge weights: its logits overflow to Inf on ordinary inputs."""
  net.set_weights([np.full_like(w, value) for w in net.get_weights()])
  return net


@pytest.mark.parametrize("peer,spec,reason", [
    (lambda: small_net(inputs=5), tf.TensorSpec([None, 5]),
     "signature input 'inputs' is float32(None, 5) but the student expects float32(None, 4)"),
    (lambda: small_net(outputs=2), SPEC,
     "signature output 'logits' is float32(None, 2) but the student expects float32(None, 1)"),
    (lambda: small_net(input_dtype="float64"), tf.TensorSpec([None, 4], tf.float64),
     "signature input 'inputs' is float64(None, 4) but the student expects float32(None, 4)"),
    (lambda: small_net(output_dtype="float64"), SPEC,
     "signature output 'logits' is float64(None, 1) but the student expects float32(None, 1)"),
    (lambda: small_net(hidden=16), SPEC, "cannot restore variables"),
], ids=["input_shape", "output_size", "input_dtype", "output_dtype", "architecture"])
def test_peer_with_another_signature_is_refused_and_never_used(tmp_path, caplog, peer, spec,
                                                              reason):
  model, pool = student_and_pool(tmp_path)
  path = exchange.publish(peer(), str(tmp_path), 1, 10, spec, keep_last=5)
  with caplog.at_level(logging.WARNING):
    assert pool.poll_once() == 0
  _assert_refused_then_next_version_used(model, pool, tmp_path, caplog, path, reason)


def test_teacher_with_nan_weights_is_dropped_for_that_refresh(tmp_path, caplog):
  model, pool = student_and_pool(tmp_path)
  peer = small_net()
  peer.set_weights([np.full_like(w, np.nan) for w in peer.get_weights()])
  path = exchange.publish(peer, str(tmp_path), 1, 10, SPEC, keep_last=5)
  with caplog.at_level(logging.WARNING):
    assert pool.poll_once() == 0
  _assert_refused_then_next_version_used(model, pool, tmp_path, caplog, path, "has NaN/Inf")


def test_teacher_with_non_finite_predictions_is_dropped_for_that_refresh(tmp_path, caplog):
  model, pool = student_and_pool(tmp_path, probe=PROBE)
  path = exchange.publish(_huge(small_net()), str(tmp_path), 1, 10, SPEC, keep_last=5)
  with caplog.at_level(logging.WARNING):
    assert pool.poll_once() == 0
  _assert_refused_then_next_version_used(
      model, pool, tmp_path, caplog, path,
      "its predictions on a probe batch of real inputs are NaN/Inf")


def test_a_teacher_non_finite_on_a_batch_counts_for_nothing_in_that_step():
  student = small_net()
  model = CodistillModel(student, 2)
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  model(PROBE)
  good = small_net(seed=9)
  model.set_teacher_weights(0, _huge(small_net()).get_weights(), step=10)
  model.set_teacher_weights(1, good.get_weights(), step=10)
  np.testing.assert_allclose(model.teacher_target(PROBE).numpy(),
                             tf.sigmoid(good(PROBE)).numpy(), rtol=1e-6)
  # Only the Inf teacher: no distillation term, and the step stays finite.
  only_bad = CodistillModel(small_net(), 1)
  only_bad.compile(optimizer=keras.optimizers.SGD(0.1),
                   loss=keras.losses.BinaryCrossentropy(from_logits=True))
  only_bad(PROBE)
  only_bad.set_teacher_weights(0, _huge(small_net()).get_weights(), step=10)
  logs = only_bad.train_on_batch(PROBE, tf.ones([16, 1]), return_dict=True)
  assert logs["distill_loss"] == 0.0 and np.isfinite(logs["loss"])
  assert all(np.isfinite(w).all() for w in only_bad.student.get_weights())


def _outside_version(tmp_path, step=10):
  """A complete, valid version published outside the exchange directory; returns its path."""
  return exchange.publish(small_net(seed=3), str(tmp_path / "elsewhere"), 1, step, SPEC)


@pytest.mark.parametrize("attack", ["version_dir", "group_dir", "file_in_version",
                                    "marker_path"])
def test_links_out_of_the_exchange_are_not_followed(tmp_path, caplog, attack):
  exchange_dir = tmp_path / "exchange"
  exchange_dir.mkdir()
  model, pool = student_and_pool(exchange_dir)
  outside = _outside_version(tmp_path)
  if attack == "version_dir":  # group_1/step_10 -> a version elsewhere
    (exchange_dir / "group_1").mkdir()
    path = str(exchange_dir / "group_1" / "step_10")
    os.symlink(outside, path)
    reason = "outside the exchange directory"
  elif attack == "group_dir":  # group_1 -> a directory elsewhere
    os.symlink(os.path.dirname(outside), exchange_dir / "group_1")
    path = str(exchange_dir / "group_1" / "step_10")
    reason = "outside the exchange directory"
  elif attack == "file_in_version":  # a real version whose weights file is a link elsewhere
    path = exchange.publish(small_net(seed=4), str(exchange_dir), 1, 10, SPEC)
    data = os.path.join(path, "variables", "variables.data-00000-of-00001")
    shutil.copy(os.path.join(outside, "variables", "variables.data-00000-of-00001"),
                tmp_path / "weights")
    os.remove(data)
    os.symlink(tmp_path / "weights", data)
    path, reason = data, "a symbolic link"
  else:  # the marker lists a file outside the version
    path = exchange.publish(small_net(seed=4), str(exchange_dir), 1, 10, SPEC)
    marker = os.path.join(path, exchange.MARKER)
    content = json.loads(open(marker).read())
    content["files"]["../../../etc/passwd"] = os.path.getsize("/etc/passwd")
    with open(marker, "w") as f:
      f.write(json.dumps(content))
    reason = "a path outside the version"
  with caplog.at_level(logging.WARNING):
    assert pool.poll_once() == 0
  assert path in caplog.text and reason in caplog.text, caplog.text[-2000:]
  activate_all(model, pool)
  assert model.teacher_steps.numpy().tolist() == [-1]


def test_loading_a_teacher_never_runs_the_peers_graph(tmp_path):
  """The peer's serving function writes a file when run; loading it as a teacher must not."""
  peer = small_net(seed=6)
  canary = str(tmp_path / "graph_ran")

  @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, "inputs")])
  def serve(inputs):
    with tf.control_dependencies([tf.io.write_file(canary, "the peer's graph ran")]):
      return {exchange.OUTPUT_KEY: tf.identity(peer(inputs, training=False))}

  path = os.path.join(str(tmp_path), "group_1", "step_10")
  peer.save(path, save_format="tf", include_optimizer=False, save_traces=False,
            signatures={exchange.SIGNATURE_KEY: serve.get_concrete_function()})
  exchange._write_marker(path, {"group": 1, "step": 10, "time": 0.0})
  model, pool = student_and_pool(tmp_path, probe=PROBE)
  assert pool.poll_once() == 1
  activate_all(model, pool)
  assert model.teacher_steps.numpy().tolist() == [10]
  np.testing.assert_allclose(model.teacher_target(PROBE).numpy(),
                             tf.sigmoid(peer(PROBE)).numpy(), rtol=1e-6)
  assert not os.path.exists(canary)
  # Whereas loading the SavedModel and calling it, as serving or tf-codistill-churn does, runs it.
  tf.saved_model.load(path).signatures[exchange.SIGNATURE_KEY](inputs=PROBE)
  assert os.path.exists(canary)
