"""Lean published versions: bfloat16/int8 weights and row deltas, written to a real exchange
directory and read back by LeanReader and the teacher pool."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tf_codistill as tfc
from tf_codistill.errors import ConfigurationError
from tf_codistill.exchange import directory as exchange
from tf_codistill.exchange import lean_versions as lv
from tf_codistill.exchange import weight_codecs as wc
from tf_codistill.teachers import pool as teachers
from tf_codistill.teachers import quantization
from tf_codistill.training.model import CodistillModel

from testing_utils import activate_all

SPEC = tf.TensorSpec([None, 3], tf.int32)
VOCAB = 200


def emb_net(seed=0):
  """Embedding(200, 8) of 3 ids -> Dense(1): a table of which a step touches few rows."""
  x = keras.Input((3,), dtype="int32")
  h = keras.layers.Embedding(VOCAB, 8, embeddings_initializer=keras.initializers.RandomNormal(
      stddev=0.1, seed=seed))(x)
  out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed + 1))(
      keras.layers.Flatten()(h))
  model = keras.Model(x, out)
  model(tf.zeros([1, 3], tf.int32))
  return model


def _writer(model, **fmt):
  return lv.LeanWriter(lv.PublishFormat(**fmt), [w.name for w in model.weights],
                       exchange.expected_signature(SPEC, [None, 1]))


def _touch_rows(weights, rows, seed):
  """The weights with ``rows`` of the table moved, as a sparse optimizer step would."""
  out = [w.copy() for w in weights]
  out[0][rows] += np.random.default_rng(seed).normal(0, 0.05, (len(rows), 8)).astype(np.float32)
  out[1] += 0.01  # the dense layer changes every step
  out[2] += 0.01
  return out


def _reader_arrays(exchange_dir, step, reader, shapes, group=1):
  version = exchange.Version(group, step, exchange.version_dir(exchange_dir, group, step))
  marker = exchange.verify(version)
  return reader.read(exchange_dir, version, marker,
                     exchange.expected_signature(SPEC, [None, 1]), shapes)


def _stored(weights, encoding):
  return [wc.decode(wc.encode(w, encoding)).reshape(w.shape) for w in weights]


@pytest.mark.parametrize("encoding", wc.ENCODINGS)
def test_deltas_hold_only_changed_rows_and_rebuild_the_whole_version(tmp_path, encoding):
  exchange_dir = str(tmp_path)
  model = emb_net()
  shapes = [w.shape for w in model.get_weights()]
  writer = _writer(model, encoding=encoding, row_deltas=True, whole_every=10)
  reader = lv.LeanReader()
  weights = model.get_weights()
  path = writer.publish(weights, exchange_dir, 1, 10, keep_last=2)
  whole = json.load(open(os.path.join(path, exchange.MARKER)))["format"]
  assert whole["base"] is None and [a["stored"] for a in whole["arrays"]] == ["whole"] * 3
  whole_bytes = writer.last_bytes
  version_id, arrays = _reader_arrays(exchange_dir, 10, reader, shapes)
  reader.commit(version_id, arrays)
  for step, rows in ((20, [3, 150]), (30, [7]), (40, [])):
    weights = _touch_rows(weights, rows, step)
    path = writer.publish(weights, exchange_dir, 1, step, keep_last=2)
    fmt = json.load(open(os.path.join(path, exchange.MARKER)))["format"]
    assert fmt["base"]["step"] == step - 10
    assert [a["stored"] for a in fmt["arrays"]] == ["rows", "whole", "whole"]
    bundle = tf.train.load_checkpoint(os.path.join(path, lv.BUNDLE))
    assert bundle.get_tensor("0/rows").tolist() == rows
    version_id, arrays = _reader_arrays(exchange_dir, step, reader, shapes)
    reader.commit(version_id, arrays)
    for got, want in zip(arrays, _stored(weights, encoding)):
      np.testing.assert_array_equal(got, want)
  # A delta's bytes: the changed rows (and their indices) plus the dense arrays.
  assert writer.last_bytes < whole_bytes / 10


@pytest.mark.parametrize("encoding", ["float32", "int8"])
def test_tolerant_deltas_send_only_drifted_rows_and_bound_every_rows_error(tmp_path, encoding):
  exchange_dir = str(tmp_path)
  model = emb_net()
  shapes = [w.shape for w in model.get_weights()]
  tolerance = 0.2
  writer = _writer(model, encoding=encoding, row_deltas=True, row_tolerance=tolerance)
  reader = lv.LeanReader()
  weights = model.get_weights()
  writer.publish(weights, exchange_dir, 1, 10)
  reader.commit(*_reader_arrays(exchange_dir, 10, reader, shapes))
  table = weights[0]
  magnitude = np.abs(table).max(axis=1, keepdims=True)
  # Row 3 drifts by 1% of its magnitude per publish, row 4 by 50%, row 5 not at all.
  sent = []
  for step in (20, 30, 40):
    weights = [w.copy() for w in weights]
    weights[0][3] += 0.01 * magnitude[3]
    weights[0][4] += 0.5 * magnitude[4]
    path = writer.publish(weights, exchange_dir, 1, step)
    sent.append(tf.train.load_checkpoint(os.path.join(path, lv.BUNDLE)).get_tensor("0/rows"))
    reader.commit(*_reader_arrays(exchange_dir, step, reader, shapes))
    held = reader.held[0]
    error = np.abs(held - weights[0]).max(axis=1) / np.abs(weights[0]).max(axis=1)
    assert error.max() <= tolerance + (0.01 if encoding == "int8" else 1e-6)
  assert all(rows.dtype == np.uint16 for rows in sent)  # a 200-row table: 2-byte indices
  # Row 4 goes out every time; row 3's drift (1%, 2%, 3%) stays within 20%: never sent.
  assert [rows.tolist() for rows in sent] == [[4], [4], [4]]
  # What the reader holds is what the writer will build its next delta against.
  for got, want in zip(reader.held, writer._last):
    np.testing.assert_array_equal(got.reshape(-1), wc.decode(want).reshape(-1))


def test_int8_scales_are_stored_as_bfloat16_and_float32_scales_of_older_writers_still_read(
    tmp_path, monkeypatch):
  model = emb_net()
  shapes = [w.shape for w in model.get_weights()]
  weights = model.get_weights()
  path = _writer(model, encoding="int8").publish(weights, str(tmp_path), 1, 10)
  assert tf.train.load_checkpoint(os.path.join(path, lv.BUNDLE)).get_tensor("0/scales").dtype == (
      tf.bfloat16.as_numpy_dtype)
  # An older writer stored float32 scales.
  monkeypatch.setattr(wc, "stored_scales", lambda scales: scales.astype(np.float32))
  path = _writer(model, encoding="int8").publish(weights, str(tmp_path), 2, 10)
  assert tf.train.load_checkpoint(os.path.join(path, lv.BUNDLE)).get_tensor(
      "0/scales").dtype == np.float32
  for group in (1, 2):
    _, arrays = _reader_arrays(str(tmp_path), 10, lv.LeanReader(), shapes, group=group)
    for got, want in zip(arrays, _stored(weights, "int8")):
      np.testing.assert_array_equal(got, want)


def test_a_reader_that_skipped_versions_or_holds_none_walks_the_chain(tmp_path):
  exchange_dir = str(tmp_path)
  model = emb_net()
  shapes = [w.shape for w in model.get_weights()]
  writer = _writer(model, encoding="int8", row_deltas=True)
  weights = model.get_weights()
  for step in (10, 20, 30, 40):
    weights = _touch_rows(weights, [step, step + 1], step)
    writer.publish(weights, exchange_dir, 1, step, keep_last=1)
  # Garbage collection keeps the chain back to the whole version (step 10).
  assert [v.step for v in exchange.list_versions(exchange_dir, 1)] == [40, 30, 20, 10]
  _, arrays = _reader_arrays(exchange_dir, 40, lv.LeanReader(), shapes)
  for got, want in zip(arrays, _stored(weights, "int8")):
    np.testing.assert_array_equal(got, want)


def test_whole_every_starts_a_new_chain_and_old_versions_are_then_collected(tmp_path):
  exchange_dir = str(tmp_path)
  model = emb_net()
  writer = _writer(model, encoding="bfloat16", row_deltas=True, whole_every=3)
  weights = model.get_weights()
  bases = []
  for step in range(10, 70, 10):
    weights = _touch_rows(weights, [1], step)
    path = writer.publish(weights, exchange_dir, 1, step, keep_last=1)
    bases.append(json.load(open(os.path.join(path, exchange.MARKER)))["format"]["base"])
  assert [b is None for b in bases] == [True, False, False, True, False, False]
  assert [v.step for v in exchange.list_versions(exchange_dir, 1)] == [60, 50, 40]


def _whole_then_delta(exchange_dir, encoding):
  """A whole version at step 10 and a delta (row 5 moved) at step 20; (model, shapes, delta)."""
  model = emb_net()
  writer = _writer(model, encoding=encoding, row_deltas=True)
  writer.publish(model.get_weights(), exchange_dir, 1, 10, keep_last=5)
  delta = writer.publish(_touch_rows(model.get_weights(), [5], 1), exchange_dir, 1, 20,
                         keep_last=5)
  return model, [w.shape for w in model.get_weights()], delta


def test_a_delta_whose_base_is_gone_or_was_republished_is_rejected_naming_it(tmp_path):
  exchange_dir = str(tmp_path)
  model, shapes, _ = _whole_then_delta(exchange_dir, "int8")
  weights = model.get_weights()
  # Step 10 published again by a restarted peer: another version under the same name.
  _writer(model, encoding="int8").publish(weights, exchange_dir, 1, 10, keep_last=5)
  with pytest.raises(exchange.InvalidVersionError, match="base step 10 in the directory is "
                                                          "another version"):
    _reader_arrays(exchange_dir, 20, lv.LeanReader(), shapes)
  tf.io.gfile.rmtree(exchange.version_dir(exchange_dir, 1, 10))
  with pytest.raises(exchange.InvalidVersionError,
                     match=r"step_20: a row delta built on step 10, which this reader does not "
                           r"hold and cannot read"):
    _reader_arrays(exchange_dir, 20, lv.LeanReader(), shapes)


def test_rows_out_of_range_and_wrong_shapes_are_rejected(tmp_path):
  exchange_dir = str(tmp_path)
  _, shapes, path = _whole_then_delta(exchange_dir, "float32")
  reader = lv.LeanReader()
  reader.commit(*_reader_arrays(exchange_dir, 10, reader, shapes))
  # Rewrite the delta's bundle with an index past the table (and a marker listing its sizes).
  bundle = tf.train.load_checkpoint(os.path.join(path, lv.BUNDLE))
  tensors = {n: bundle.get_tensor(n) for n in bundle.get_variable_to_shape_map()}
  tensors["0/rows"] = np.array([VOCAB], np.int32)
  lv.save_bundle(path, tensors)
  marker = json.load(open(os.path.join(path, exchange.MARKER)))
  marker["files"] = exchange._list_files(path)
  del marker["files"][exchange.MARKER]
  exchange.write_atomically(os.path.join(path, exchange.MARKER), json.dumps(marker))
  with pytest.raises(exchange.InvalidVersionError,
                     match=r"array 0 .*row indices out of \[0, 200\)"):
    _reader_arrays(exchange_dir, 20, reader, shapes)
  with pytest.raises(exchange.InvalidVersionError, match="do not match the teacher's weights"):
    _reader_arrays(exchange_dir, 10, lv.LeanReader(), [(VOCAB, 4), (24, 1), (1,)])


@pytest.mark.parametrize("drop", ["signature", "dtype"])
def test_a_marker_without_a_field_readers_use_is_rejected_naming_it(tmp_path, drop):
  exchange_dir = str(tmp_path)
  model = emb_net()
  path = _writer(model, encoding="bfloat16").publish(model.get_weights(), exchange_dir, 1, 10)
  marker = json.load(open(os.path.join(path, exchange.MARKER)))
  if drop == "signature":
    del marker["format"]["signature"]
  else:
    del marker["format"]["arrays"][1]["dtype"]
  exchange.write_atomically(os.path.join(path, exchange.MARKER), json.dumps(marker))
  with pytest.raises(exchange.InvalidVersionError, match=f"step_10/COMPLETE: malformed lean "
                                                         f"format .*{drop}"):
    _reader_arrays(exchange_dir, 10, lv.LeanReader(), [tuple(w.shape) for w in model.weights])


@pytest.mark.parametrize("changes,named", [
    ({"encoding": "int4"}, "PublishFormat.encoding"),
    ({"row_deltas": True}, "PublishFormat.row_deltas"),
    ({"encoding": "int8", "whole_every": 0}, "PublishFormat.whole_every"),
    ({"encoding": "int8", "delta_max_fraction": 2.0}, "PublishFormat.delta_max_fraction"),
    ({"encoding": "int8", "row_tolerance": 0.1}, "PublishFormat.row_tolerance"),
    ({"encoding": "int8", "row_deltas": True, "row_tolerance": 1.0},
     "PublishFormat.row_tolerance")])
def test_publish_format_refuses_values_that_cannot_work_naming_them(changes, named):
  with pytest.raises(ConfigurationError, match=named):
    tfc.PublishFormat(**changes)


def _student_and_pool(tmp_path, teacher_precision="float32"):
  model = CodistillModel(emb_net(), exchange=tfc.Exchange(str(tmp_path), 0),
                         teachers=tfc.TeacherSpec(precision=teacher_precision))
  model(tf.zeros([1, 3], tf.int32))
  pool = teachers.TeacherPool(str(tmp_path), [1], model, SPEC, [None, 1], poll_interval_s=0.05,
                              probe=tf.constant([[1, 2, 3]], tf.int32))
  return model, pool


@pytest.mark.parametrize("teacher_precision", ["float32", "bfloat16", "int8"])
def test_the_teacher_pool_loads_lean_versions_and_their_deltas(tmp_path, teacher_precision):
  model, pool = _student_and_pool(tmp_path, teacher_precision)
  peer = emb_net(seed=5)
  writer = _writer(peer, encoding="int8", row_deltas=True)
  weights = peer.get_weights()
  writer.publish(weights, str(tmp_path), 1, 100, keep_last=2)
  assert pool.poll_once() == 1
  activate_all(model, pool)
  weights = _touch_rows(weights, [9, 10, 11], 3)
  writer.publish(weights, str(tmp_path), 1, 200, keep_last=2)
  assert pool.poll_once() == 1
  activate_all(model, pool)
  assert model.teacher_steps.numpy().tolist() == [200] and pool.rejections == 0
  teacher = model.active_teacher(0)
  tolerance = {"float32": 0, "bfloat16": 2 ** -8, "int8": 1e-6}[teacher_precision]
  for got, want in zip(quantization.float_weights(teacher), _stored(weights, "int8")):
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tolerance, atol=1e-8)


def test_fit_publishes_int8_deltas_that_a_peer_pool_loads(tmp_path):
  exchange_dir = str(tmp_path / "exchange")
  ids = tf.random.stateless_uniform([512, 3], seed=[1, 2], maxval=VOCAB, dtype=tf.int32)
  labels = tf.cast(tf.reduce_sum(ids, axis=1, keepdims=True) % 2, tf.float32)
  data = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(4).repeat()
  # delta_max_fraction=1: rows even when a slow publisher's delta spans most of the table.
  fmt = tfc.PublishFormat(encoding="int8", row_deltas=True, whole_every=4, delta_max_fraction=1.0)
  model = tfc.CodistillModel(emb_net(), exchange=tfc.Exchange(
      exchange_dir, 0, publish_every_steps=5, keep_last=10, poll_interval_s=0.05,
      publish_format=fmt))
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  model.fit(data, epochs=1, steps_per_epoch=30, verbose=0)
  versions = exchange.list_versions(exchange_dir, 0)
  formats = [exchange.read_marker(v)["format"] for v in versions]
  assert versions[0].step == 30 and all(f["encoding"] == "int8" for f in formats)
  # Publishes skip while one is in flight, but the second one is always a delta.
  assert any(f["base"] is not None and f["arrays"][0]["stored"] == "rows" for f in formats), [
      (v.step, f["base"], [a["stored"] for a in f["arrays"]]) for v, f in zip(versions, formats)]
  peer, pool = _student_and_pool(tmp_path / "exchange")
  pool.peers = [0]
  assert pool.poll_once() == 1 and pool.rejections == 0
  activate_all(peer, pool)
  teacher = peer.active_teacher(0)
  for got, want in zip(teacher.get_weights(), _stored(model.student.get_weights(), "int8")):
    np.testing.assert_array_equal(got, want)
