"""Bad input data: every kind of malformed record or file, in each input pipeline, under both
policies. ``bad_lines='error'``: a clear error naming file and line; ``'skip'``: the record is
dropped and counted (and a training run completes, logging the count and writing it to
TensorBoard).

Pipelines covered: Criteo TSV (and Parquet rows in tests/data_pipelines), UCI Adult Parquet, the
text (language-model) pipeline (empty file, non-UTF-8 line; also in the vocabulary builder) and
the image pipeline (empty file, image bytes that are not a complete PNG/JPEG, label out of range;
a corruption inside intact image bytes fails in the decoder without the file name). The
training-run checks (exit status, the skipped count in the log and TensorBoard) run on Criteo;
for text and image records the trainer's message is checked on the pipelines directly.
"""

import json
import os
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from data_pipelines import adult
from data_pipelines import criteo
from data_pipelines import images
from data_pipelines import text_lm
from tf_codistill.training import inputs

from testing_utils import GOOD_LINES
from testing_utils import collect
from testing_utils import error_lines
from testing_utils import run
from testing_utils import tb_scalars
from testing_utils import train_args
from testing_utils import tsv_line
from testing_utils import write_lines as write

ROW = GOOD_LINES[0]
LONG_LINE = tsv_line("1", [""] * 13, ["a" * 5000] + [""] * 25)
# (bad line, the reason the error gives); bytes where the line is not valid UTF-8.
BAD_LINES = [
    (ROW[:ROW.rindex("\t")], "expected 40 tab-separated fields, got 39"),
    (ROW + "\tabc", "expected 40 tab-separated fields, got 41"),
    (tsv_line("1", ["1", "12a"] + [""] * 11, [""] * 26), "non-numeric integer field I2"),
    (tsv_line("1", [""] * 12 + ["1.5"], [""] * 26), "non-numeric integer field I13"),
    (tsv_line("1", ["9" * 19] + [""] * 12, [""] * 26), "non-numeric integer field I1"),
    (tsv_line("0", [""] * 13, ["abc"] * 25 + ["xyz1"]), "non-hex categorical field C26"),
    (tsv_line("0", [""] * 13, ["0123456789abcdef0"] + [""] * 25), "non-hex categorical field C1"),
    (tsv_line("2", [""] * 13, [""] * 26), "label not in {0,1}"),
    (tsv_line("", [""] * 13, [""] * 26), "label not in {0,1}"),
    ("", "expected 40 tab-separated fields, got 1"),
    (LONG_LINE, f"line of {len(LONG_LINE)} bytes is longer than any valid Criteo line "
                f"({criteo.MAX_LINE_BYTES} bytes)"),
    (b"1\t" + b"\t".join([b"1"] * 12 + [b"\xff\xfe"]) + b"\t" + b"\t".join([b"ab"] * 26),
     "non-UTF-8 bytes in the line"),
    (ROW.encode().replace(b"deadBEEF", b"dead\xc3BEEF"), "non-UTF-8 bytes in the line"),
]


def error_message(dataset):
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    for _ in dataset:
      pass
  return str(info.value)


# --- Criteo TSV: the pipeline ------------------------------------------------------------------


def test_error_names_file_line_and_reason(tmp_path):
  lines = [GOOD_LINES[0]]
  for bad_line, _ in BAD_LINES:
    lines += [bad_line, GOOD_LINES[1]]
  path = write(tmp_path / "bad.tsv", lines)
  batches = iter(criteo.make_dataset(path, 1))
  outcomes = []
  for _ in lines:  # tf.data goes on after an element fails, so one pass checks every bad line
    try:
      next(batches)
      outcomes.append("ok")
    except tf.errors.InvalidArgumentError as error:
      outcomes.append(str(error))
  for line_number, (line, outcome) in enumerate(zip(lines, outcomes), start=1):
    if line in (GOOD_LINES[0], GOOD_LINES[1]):
      assert outcome == "ok", (line_number, outcome)
    else:
      reason = BAD_LINES[line_number // 2 - 1][1]
      assert f"malformed Criteo TSV line {path}:{line_number}: {reason}" in outcome


def test_error_on_truncated_last_line_without_newline(tmp_path):
  path = write(tmp_path / "cut.tsv", GOOD_LINES + [GOOD_LINES[0][:30]], trailing_newline=False)
  message = error_message(criteo.make_dataset(path, 100))
  assert f"{path}:4: expected 40 tab-separated fields, got " in message


def test_error_line_number_beyond_first_read_block(tmp_path):
  lines = GOOD_LINES * 700  # 2100 lines, more than one read block
  lines[1776] = tsv_line("7", [""] * 13, [""] * 26)
  path = write(tmp_path / "long.tsv", lines)
  message = error_message(criteo.make_dataset(path, 256))
  assert f"{path}:1777: label not in {{0,1}}" in message


def test_skip_drops_every_kind_of_bad_line_and_counts_them(tmp_path):
  bad = [line for line, _ in BAD_LINES]
  lines = [GOOD_LINES[0], *bad[:5], GOOD_LINES[1], *bad[5:], GOOD_LINES[2], bad[1][:30]]
  path = write(tmp_path / "mixed.tsv", lines, trailing_newline=False)
  counter = criteo.BadLineCounter()
  got = collect(criteo.make_dataset(path, 3, bad_lines="skip", bad_line_counter=counter))
  want = collect(criteo.make_dataset(write(tmp_path / "good.tsv", GOOD_LINES), 3))
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  assert counter.count == len(lines) - len(GOOD_LINES)


def test_skipped_lines_count_each_bad_line_once_however_often_it_is_read(tmp_path):
  bad = [line for line, _ in BAD_LINES][:6]
  path = write(tmp_path / "mixed.tsv", [GOOD_LINES[0], *bad, GOOD_LINES[1]])
  counter = criteo.BadLineCounter()
  dataset = criteo.make_dataset(path, 3, bad_lines="skip", bad_line_counter=counter, repeat=True)
  labels = [label.numpy() for _, label in dataset.take(10)]  # at least 5 passes over the file
  assert sum(len(batch) for batch in labels) >= 10
  assert counter.count == 6
  counter.reset()
  assert counter.count == 0


def test_skip_drops_batches_that_become_empty(tmp_path):
  bad = BAD_LINES[7][0]
  path = write(tmp_path / "mixed.tsv", [bad, bad, GOOD_LINES[0], bad, bad])
  counter = criteo.BadLineCounter()
  dataset = criteo.make_dataset(path, 2, bad_lines="skip", bad_line_counter=counter)
  sizes = [label.shape[0] for _, label in dataset]
  assert sizes == [1] and counter.count == 4


def test_missing_files_raise_naming_the_pattern(tmp_path):
  pattern = str(tmp_path / "nothing-*.tsv")
  with pytest.raises(FileNotFoundError, match="nothing-"):
    criteo.make_dataset(pattern, 2)
  present = write(tmp_path / "day.tsv", GOOD_LINES)
  with pytest.raises(FileNotFoundError, match="nothing-") as info:
    criteo.make_dataset([present, pattern], 2)
  assert present not in str(info.value)


def test_empty_file_is_an_error_naming_it_or_skipped_with_a_warning(tmp_path, caplog):
  empty = str(tmp_path / "part-0.tsv")
  open(empty, "w").close()
  present = write(tmp_path / "part-1.tsv", GOOD_LINES)
  pattern = str(tmp_path / "part-*.tsv")
  with pytest.raises(criteo.DataError, match=re.escape(f"{empty}: empty file (0 bytes)")):
    criteo.make_dataset(pattern, 2)
  with caplog.at_level("WARNING"):
    got = collect(criteo.make_dataset(pattern, 2, bad_lines="skip"))
  assert f"{empty}: empty file (0 bytes), skipped" in caplog.text
  assert got[2].tolist() == collect(criteo.make_dataset(present, 2))[2].tolist()
  with pytest.raises(criteo.DataError, match="every file matching .* is empty"):
    criteo.make_dataset(empty, 2, bad_lines="skip")


# --- UCI Adult (Parquet): the pipeline ---------------------------------------------------------


def _adult_table(rows=8, label=lambda i: i % 2):
  columns = {adult.LABEL_COLUMN: pa.array([label(i) for i in range(rows)], pa.int64())}
  columns.update({c: pa.array(list(range(rows)), pa.int64()) for c in adult.NUMERIC_COLUMNS})
  columns.update({c: pa.array([f"v{i % 3}" for i in range(rows)]) for c in
                  adult.CATEGORICAL_COLUMNS})
  return pa.table(columns)


@pytest.mark.parametrize("content,message", [
    (b"", "empty file (0 bytes)"),
    (b"PAR1 this is not a Parquet file at all PAR1", "not a readable Parquet file"),
], ids=["empty", "corrupt_bytes"])
def test_adult_empty_or_corrupt_file_is_an_error_naming_it(tmp_path, content, message):
  good = str(tmp_path / "train-0.parquet")
  pq.write_table(_adult_table(), good)
  bad = tmp_path / "train-1.parquet"
  bad.write_bytes(content)
  with pytest.raises(criteo.DataError, match=re.escape(f"{bad}: {message}")):
    adult.make_dataset(str(tmp_path / "train-*.parquet"), 4)


def test_adult_label_outside_0_1_fails_naming_the_row_or_is_skipped(tmp_path):
  path = str(tmp_path / "labels.parquet")
  pq.write_table(_adult_table(3000, label=lambda i: 2 if i == 1500 else i % 2), path)
  message = error_message(adult.make_dataset(path, 4096))
  assert f"malformed Adult Parquet row {path}:1501: label not in {{0,1}} (got: 2)" in message
  counter = criteo.BadLineCounter()
  _, _, labels = collect(adult.make_dataset(path, 4096, bad_lines="skip", bad_line_counter=counter))
  assert len(labels) == 2999 and counter.count == 1


# --- Text (language-model) pipeline -----------------------------------------------------------

TEXT_LINES = ["the cat sat", "the dog ran", "a cat ran"]
NON_UTF8 = [b"the caf\xe9 sat", b"\xff\xfe the", b"cat \xc3"]  # Latin-1, a bad start, cut short


def _text_dir(tmp_path, files):
  """Text files (name -> lines) and the word vocabulary of TEXT_LINES (vocab_size 8); returns
  the pattern matching the files."""
  for name, lines in files.items():
    write(tmp_path / name, lines)
  vocab = text_lm.build_vocab([write(tmp_path / "vocab-source.txt", TEXT_LINES)], 8)
  text_lm.write_vocab(vocab, str(tmp_path / "vocab-word-8.tsv"))
  return str(tmp_path / "train-*")


def _tokens(dataset):
  return np.concatenate([features["tokens"].numpy().ravel() for features, _ in dataset])


def test_text_non_utf8_line_fails_naming_file_and_line_or_is_skipped_and_counted(tmp_path):
  lines = TEXT_LINES * 600
  lines[1499] = NON_UTF8[0]  # beyond the first batch of lines
  pattern = _text_dir(tmp_path, {"train-0.txt": TEXT_LINES, "train-1.txt": lines})
  message = error_message(text_lm.make_dataset(pattern, 4, vocab_size=8, sequence_length=3))
  assert (f"malformed text line {tmp_path}/train-1.txt:1500: non-UTF-8 bytes in the line "
          "(got: the caf\ufffd sat)") in message

  mixed = [NON_UTF8[1], *TEXT_LINES[:2], NON_UTF8[2], TEXT_LINES[2], NON_UTF8[0]]
  pattern = _text_dir(tmp_path, {"train-0.txt": TEXT_LINES, "train-1.txt": mixed})
  counter = criteo.BadLineCounter()
  got = _tokens(text_lm.make_dataset(pattern, 4, vocab_size=8, sequence_length=3,
                                     bad_lines="skip", bad_line_counter=counter))
  assert counter.count == 3
  write(tmp_path / "train-1.txt", TEXT_LINES)
  np.testing.assert_array_equal(got, _tokens(text_lm.make_dataset(pattern, 4, vocab_size=8,
                                                                  sequence_length=3)))


def test_text_empty_file_is_an_error_naming_it_or_skipped_with_a_warning(tmp_path, caplog):
  pattern = _text_dir(tmp_path, {"train-1.txt": TEXT_LINES})
  empty = tmp_path / "train-0.txt"
  empty.write_bytes(b"")
  with pytest.raises(criteo.DataError, match=re.escape(
      f"{empty}: empty file (0 bytes); remove it, or bind text_lm.make_dataset.bad_lines = "
      "'skip'")):
    text_lm.make_dataset(pattern, 4, vocab_size=8)
  with caplog.at_level("WARNING"):
    got = text_lm.make_dataset(pattern, 4, vocab_size=8, sequence_length=3, bad_lines="skip")
  assert f"{empty}: empty file (0 bytes), skipped" in caplog.text
  want = text_lm.make_dataset(str(tmp_path / "train-1.txt"), 4, vocab_size=8, sequence_length=3)
  np.testing.assert_array_equal(_tokens(got), _tokens(want))


@pytest.mark.parametrize("level", text_lm.LEVELS)
def test_text_vocabulary_skips_empty_files_and_fails_or_skips_non_utf8_lines(tmp_path, level):
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  bad = write(tmp_path / "bad.txt", [TEXT_LINES[0], NON_UTF8[2], TEXT_LINES[1]])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=re.escape(f"malformed text line {bad}:2: non-UTF-8 bytes")):
    text_lm.build_vocab([str(empty), bad], 6, level)
  got = text_lm.build_vocab([str(empty), bad], 6, level, bad_lines="skip")
  assert got == text_lm.build_vocab([write(tmp_path / "good.txt", TEXT_LINES[:2])], 6, level)


# --- Image pipeline ----------------------------------------------------------------------------

PIXELS = np.arange(6 * 16, dtype=np.uint8).reshape(6, 4, 4, 1) * 2
PNGS = [tf.io.encode_png(p).numpy() for p in PIXELS]
JPEG = tf.io.encode_jpeg(np.full((4, 4, 1), 200, np.uint8)).numpy()
NOT_AN_IMAGE = "image/encoded is not a complete PNG or JPEG image"
# (encoded bytes, label, the reason the error gives), read with num_classes = 10.
BAD_RECORDS = [
    (PNGS[0][:len(PNGS[0]) // 2], 1, f"{NOT_AN_IMAGE} ({len(PNGS[0]) // 2} bytes)"),  # truncated
    (b"\x00" + PNGS[0][1:], 1, f"{NOT_AN_IMAGE} ({len(PNGS[0])} bytes)"),  # garbled signature
    (PNGS[0][:-12] + b"\x00" * 12, 1, f"{NOT_AN_IMAGE} ({len(PNGS[0])} bytes)"),  # no IEND chunk
    (JPEG[:-40], 1, f"{NOT_AN_IMAGE} ({len(JPEG) - 40} bytes)"),  # truncated JPEG
    (b"GIF89a" + JPEG[6:], 1, f"{NOT_AN_IMAGE} ({len(JPEG)} bytes)"),
    (b"", 1, f"{NOT_AN_IMAGE} (0 bytes)"),
    (PNGS[0], 10, "image/class/label not in [0, 10) (got: 10)"),
    (PNGS[0], -1, "image/class/label not in [0, 10) (got: -1)"),
]


def _write_records(path, records):
  """A TFRecord file of (encoded, label) Examples; returns the path as str."""
  with tf.io.TFRecordWriter(str(path)) as writer:
    for encoded, label in records:
      writer.write(images.example(encoded, label, 4, 4, 1).SerializeToString())
  return str(path)


def _image_dataset(pattern, **kwargs):
  return images.make_dataset(pattern, 4, image_size=None, num_classes=10, **kwargs)


@pytest.mark.parametrize("encoded,label,reason", BAD_RECORDS,
                         ids=["truncated_png", "garbled_signature", "no_iend", "truncated_jpeg",
                              "gif_header", "empty_bytes", "label_too_big", "negative_label"])
def test_image_bad_record_fails_naming_file_record_and_reason(tmp_path, encoded, label, reason):
  _write_records(tmp_path / "train-0.tfrecord", [(PNGS[1], 1)] * 3)
  path = _write_records(tmp_path / "train-1.tfrecord",
                        [(PNGS[2], 2), (JPEG, 3), (encoded, label), (PNGS[3], 4)])
  message = error_message(_image_dataset(str(tmp_path / "train-*")))
  assert f"malformed image record {path}:3: {reason}" in message


def test_image_label_range_follows_label_offset_and_needs_num_classes_for_its_top(tmp_path):
  path = _write_records(tmp_path / "imagenet.tfrecord", [(PNGS[0], 1), (PNGS[1], 0)])
  message = error_message(_image_dataset(path, label_offset=-1))
  assert f"malformed image record {path}:2: image/class/label not in [1, 11) (got: 0)" in message
  path = _write_records(tmp_path / "labels.tfrecord", [(PNGS[0], 1000), (PNGS[1], -1)])
  message = error_message(images.make_dataset(path, 4, image_size=None))
  assert f"malformed image record {path}:2: image/class/label below 0 (got: -1)" in message


def test_image_skip_keeps_the_good_records_only_and_counts_the_bad(tmp_path):
  good = [(PNGS[k], k) for k in range(6)]
  mixed = [(encoded, label) for encoded, label, _ in BAD_RECORDS]
  mixed[1:1], mixed[4:4], mixed[7:7] = good[:2], good[2:4], good[4:]
  path = _write_records(tmp_path / "mixed.tfrecord", mixed)
  counter = criteo.BadLineCounter()
  batches = list(_image_dataset(path, bad_lines="skip", bad_line_counter=counter))
  assert [len(labels) for _, labels in batches] == [4, 2]  # batches stay full
  pixels = np.concatenate([features["image"].numpy() for features, _ in batches])
  np.testing.assert_array_equal(np.round(pixels * 255).astype(np.uint8), PIXELS)
  assert np.concatenate([labels for _, labels in batches]).tolist() == list(range(6))
  assert counter.count == len(BAD_RECORDS)


def test_image_corrupt_inside_an_intact_start_and_end_fails_in_the_decoder(tmp_path):
  middle = len(PNGS[0]) // 2
  garbled = PNGS[0][:middle] + bytes(b ^ 0xFF for b in PNGS[0][middle:middle + 4]) + \
      PNGS[0][middle + 4:]
  path = _write_records(tmp_path / "inside.tfrecord", [(garbled, 1)])
  for bad_lines in ("error", "skip"):  # the documented limit: TF's own message, no file name
    message = error_message(_image_dataset(path, bad_lines=bad_lines))
    assert "Invalid PNG" in message and path not in message


def test_image_empty_file_is_an_error_naming_it_or_skipped_with_a_warning(tmp_path, caplog):
  empty = tmp_path / "train-0.tfrecord"
  empty.write_bytes(b"")
  _write_records(tmp_path / "train-1.tfrecord", [(PNGS[0], 7)])
  pattern = str(tmp_path / "train-*")
  with pytest.raises(criteo.DataError, match=re.escape(
      f"{empty}: empty file (0 bytes); remove it, or bind images.make_dataset.bad_lines = "
      "'skip'")):
    _image_dataset(pattern)
  with caplog.at_level("WARNING"):
    batches = list(_image_dataset(pattern, bad_lines="skip"))
  assert f"{empty}: empty file (0 bytes), skipped" in caplog.text
  assert [labels.numpy().tolist() for _, labels in batches] == [[7]]


def _trainer_error(dataset_fn, dataset):
  """The DataError the trainer makes of iterating ``dataset`` (from ``dataset_fn``)."""
  with pytest.raises(inputs.DataError) as info:
    with inputs.data_errors(dataset_fn):
      for _ in dataset:
        pass
  return str(info.value)


def test_trainer_reports_bad_text_and_image_records_naming_the_pipelines_binding(tmp_path):
  pattern = _text_dir(tmp_path, {"train-0.txt": [TEXT_LINES[0], NON_UTF8[2]]})
  message = _trainer_error(text_lm.make_dataset, text_lm.make_dataset(pattern, 4, vocab_size=8))
  assert message == (
      f"malformed text line {tmp_path}/train-0.txt:2: non-UTF-8 bytes in the line (got: cat "
      "\ufffd); fix the line, or bind text_lm.make_dataset.bad_lines = 'skip' to skip malformed "
      "lines")
  path = _write_records(tmp_path / "images.tfrecord", [(PNGS[0], 1), (PNGS[1], 10)])
  message = _trainer_error(images.make_dataset, _image_dataset(path))
  assert message == (
      f"malformed image record {path}:2: image/class/label not in [0, 10) (got: 10); fix the "
      "record, or bind images.make_dataset.bad_lines = 'skip' to skip malformed records")


# --- Training on bad data: the tf-codistill-train binary --------------------------------------

BAD_LINE_NUMBER = 5000  # deep enough that the pre-training checks do not reach it


@pytest.fixture(scope="module")
def bad_data_dir(criteo_dir, tmp_path_factory):
  """The shared Criteo files, with line 5000 of every training file replaced by a bad label."""
  path = tmp_path_factory.mktemp("bad_criteo")
  for name in os.listdir(criteo_dir):
    shutil.copy(os.path.join(criteo_dir, name), path / name)
    if name.startswith("train-"):
      lines = (path / name).read_text().splitlines()
      lines[BAD_LINE_NUMBER - 1] = tsv_line("7", [""] * 13, [""] * 26)
      write(path / name, lines)
  return str(path)


@pytest.mark.e2e
def test_training_stops_on_a_bad_line_naming_file_and_line(tmp_path, bad_data_dir):
  model_dir = tmp_path / "run"
  # A heartbeat every step: on an idle machine the bad line comes within the default 5 s.
  proc = run(train_args(str(model_dir), bad_data_dir,
                        bindings=["trainer.train.heartbeat_every_s = 0.0"]), timeout=600)
  assert proc.returncode == 3, proc.stderr[-3000:]  # bad input data: not retried by the launcher
  [line] = error_lines(proc.stderr)
  assert re.fullmatch(
      rf"tf-codistill-train: error: bad input data: malformed Criteo TSV line "
      rf"{re.escape(bad_data_dir)}/train-\d+-of-00004\.tsv:{BAD_LINE_NUMBER}: label not in "
      r"\{0,1\} \(got: 7\); fix the line, or bind criteo.make_dataset.bad_lines = 'skip' to "
      r"skip malformed lines", line), line
  assert "Traceback" not in proc.stderr
  # It stopped mid-training (the bad line is read after some steps), not before.
  heartbeat = json.loads((model_dir / "heartbeat.json").read_text())
  assert heartbeat["step"] > 0 and not (model_dir / "results.json").exists()


@pytest.mark.e2e
def test_training_with_skip_completes_and_logs_and_writes_the_skipped_count(tmp_path,
                                                                         bad_data_dir):
  model_dir = tmp_path / "run"
  proc = run(train_args(str(model_dir), bad_data_dir,
                        bindings=["criteo.make_dataset.bad_lines = 'skip'",
                                  "trainer.train.summary_every_steps = 10"]), timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((model_dir / "results.json").read_text())
  assert results["steps"] == 240 and results["skipped_lines"] >= 1
  assert re.search(r"data/skipped_lines: \d+ at step \d+", proc.stderr)
  assert f"skipped {results['skipped_lines']} malformed input lines" in proc.stderr
  scalars = tb_scalars(str(model_dir / "tb"))["data/skipped_lines"]
  assert max(scalars)[1] == results["skipped_lines"]  # the final count, at the last step
  assert len(scalars) > 1  # written during training too, not only at the end
