"""Exchange directory: atomic publish, completeness marker, GC, corrupt and partial versions."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_codistill.exchange import directory as exchange

import testing_utils

SPEC = tf.TensorSpec([None, 4], tf.float32)


def _model(seed=0, outputs=1):
  inputs = keras.Input((4,))
  out = keras.layers.Dense(outputs,
                           kernel_initializer=keras.initializers.GlorotUniform(seed))(inputs)
  return keras.Model(inputs, out)


def test_publish_writes_savedmodel_with_marker_and_signature(tmp_path):
  model = _model()
  path = exchange.publish(model, str(tmp_path), group=1, step=100, input_spec=SPEC)
  assert path == os.path.join(str(tmp_path), "group_1", "step_100")
  marker = json.loads(open(os.path.join(path, exchange.MARKER)).read())
  assert marker["step"] == 100 and marker["group"] == 1
  assert "saved_model.pb" in marker["files"] and "variables/variables.index" in marker["files"]
  assert exchange.list_versions(str(tmp_path), 1) == [exchange.Version(1, 100, path)]
  exchange.verify(exchange.Version(1, 100, path))
  signature = exchange.read_signature(path)
  assert signature["inputs"]["inputs"].shape.as_list() == [None, 4]
  assert signature["outputs"]["logits"].shape.as_list() == [None, 1]
  loaded = tf.saved_model.load(path).signatures["serving_default"]
  x = tf.random.normal([3, 4])
  np.testing.assert_allclose(loaded(inputs=x)["logits"].numpy(), model(x).numpy(), rtol=1e-6)
  # Nothing temporary is left behind.
  assert sorted(os.listdir(tmp_path / "group_1")) == ["step_100"]


def test_keep_last_garbage_collects_old_versions_and_leftover_temp_dirs(tmp_path):
  model = _model()
  leftover = tmp_path / "group_0" / ".tmp-step_5-deadbeef"
  leftover.mkdir(parents=True)
  for step in (10, 20, 30, 40):
    exchange.publish(model, str(tmp_path), 0, step, SPEC, keep_last=2)
  assert [v.step for v in exchange.list_versions(str(tmp_path), 0)] == [40, 30]
  assert sorted(os.listdir(tmp_path / "group_0")) == ["step_30", "step_40"]


def test_version_without_marker_is_invisible(tmp_path):
  model = _model()
  exchange.publish(model, str(tmp_path), 0, 10, SPEC)
  path = exchange.publish(model, str(tmp_path), 0, 20, SPEC)
  os.remove(os.path.join(path, exchange.MARKER))  # as if the writer died before the marker
  assert [v.step for v in exchange.list_versions(str(tmp_path), 0)] == [10]
  # The next publish removes it (older than the newest complete version, never to be read).
  exchange.publish(model, str(tmp_path), 0, 30, SPEC, keep_last=5)
  assert sorted(os.listdir(tmp_path / "group_0")) == ["step_10", "step_30"]


def test_truncated_file_is_detected_as_corrupt(tmp_path):
  path = exchange.publish(_model(), str(tmp_path), 0, 10, SPEC)
  data = os.path.join(path, "variables", "variables.data-00000-of-00001")
  with open(data, "r+b") as f:
    f.truncate(os.path.getsize(data) // 2)
  with pytest.raises(exchange.InvalidVersionError, match="corrupt"):
    exchange.verify(exchange.Version(0, 10, path))


def test_garbage_marker_and_missing_file_are_detected(tmp_path):
  path = exchange.publish(_model(), str(tmp_path), 0, 10, SPEC)
  version = exchange.Version(0, 10, path)
  os.remove(os.path.join(path, "saved_model.pb"))
  with pytest.raises(exchange.InvalidVersionError, match="missing"):
    exchange.verify(version)
  with open(os.path.join(path, exchange.MARKER), "w") as f:
    f.write("{not json")
  with pytest.raises(exchange.InvalidVersionError, match="unreadable completeness marker"):
    exchange.verify(version)


def test_signature_mismatch_is_reported_with_the_difference(tmp_path):
  path = exchange.publish(_model(outputs=3), str(tmp_path), 0, 10, SPEC)
  with pytest.raises(exchange.InvalidVersionError, match="output 'logits'"):
    exchange.check_signature(path, exchange.expected_signature(SPEC, [None, 1]))
  with pytest.raises(exchange.InvalidVersionError, match="input 'inputs' is float32"):
    exchange.check_signature(path, exchange.expected_signature(tf.TensorSpec([None, 5]), [None, 3]))
  exchange.check_signature(path, exchange.expected_signature(SPEC, [None, 3]))


def test_dict_inputs_are_named_by_their_keys(tmp_path):
  a, b = keras.Input((2,), name="a"), keras.Input((3,), dtype=tf.int64, name="b")
  out = keras.layers.Dense(1)(keras.layers.Concatenate()([a, tf.cast(b, tf.float32)]))
  model = keras.Model({"a": a, "b": b}, out)
  spec = {"a": tf.TensorSpec([None, 2]), "b": tf.TensorSpec([None, 3], tf.int64)}
  path = exchange.publish(model, str(tmp_path), 0, 1, spec)
  exchange.check_signature(path, exchange.expected_signature(spec, [None, 1]))


def test_failed_save_leaves_previous_version_intact(tmp_path):
  model = _model()
  exchange.publish(model, str(tmp_path), 0, 10, SPEC)
  with pytest.raises(Exception):
    exchange.publish(model, str(tmp_path), 0, 20, tf.TensorSpec([None, 7]))  # wrong input width
  assert [v.step for v in exchange.list_versions(str(tmp_path), 0)] == [10]
  exchange.verify(exchange.list_versions(str(tmp_path), 0)[0])


def test_keep_last_must_be_positive(tmp_path):
  with pytest.raises(ValueError, match="keep_last=0"):
    exchange.publish(_model(), str(tmp_path), 0, 1, SPEC, keep_last=0)


def test_publish_saved_model_turns_an_export_into_a_complete_verified_version(tmp_path):
  model = _model(seed=3)
  export = str(tmp_path / "export")
  exchange.save_model(model, export, SPEC)
  path = exchange.publish_saved_model(export, str(tmp_path / "exchange"), group=1, step=500)
  version = exchange.list_versions(str(tmp_path / "exchange"), 1)[0]
  assert version == exchange.Version(1, 500, path)
  assert exchange.verify(version)["source"] == export
  x = tf.random.normal([2, 4])
  loaded = tf.saved_model.load(path).signatures["serving_default"]
  np.testing.assert_allclose(loaded(inputs=x)["logits"].numpy(), model(x).numpy(), rtol=1e-6)
  assert sorted(os.listdir(tmp_path / "exchange" / "group_1")) == ["step_500"]


_CONCURRENT_PROBES = """
import sys, threading
import numpy as np
import tensorflow as tf
from tf_codistill.exchange import directory as exchange
from tf_codistill.models import resnet
batch = tf.constant(np.random.default_rng(0).random((64, 28, 28, 1), np.float32))
models = [resnet.resnet(num_classes=10, widths=(8, 16, 32)) for _ in range(2)]
probes = [exchange.ProbeForward(batch) for _ in models]  # a publisher's and a teacher pool's
calls, start = [0, 0], threading.Barrier(2)
def run(i):  # both threads start together and each runs its calls beside the other's
  start.wait()
  for _ in range(int(sys.argv[1])):
    assert probes[i].finite(models[i])
    calls[i] += 1
threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
print("calls", min(calls))
"""


def test_probe_forward_passes_of_one_architecture_run_safely_in_two_threads_at_once(tmp_path):
  # Eager forward passes of two ResNets from two threads abort this process (heap corruption in
  # oneDNN's shared eager kernels) within a second; ProbeForward runs them as tf.functions.
  repo = testing_utils.REPO
  done = subprocess.run([sys.executable, "-c", _CONCURRENT_PROBES, "100"], cwd=repo,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert int(done.stdout.split()[-1]) == 100  # every call of both threads returned finite


def test_probe_forward_names_non_finite_predictions_and_passes_without_a_probe():
  model = _model()
  probe = exchange.ProbeForward(tf.ones([2, 4]))
  assert probe.finite(model)
  model.layers[-1].bias.assign([np.inf])
  assert not probe.finite(model)
  assert exchange.ProbeForward(None).finite(model)
