"""Bad input data: every kind of malformed record or file, in each input pipeline, under both
policies. ``bad_lines='error'``: a clear error naming file and line; ``'skip'``: the record is
dropped and counted (and a training run completes, logging the count and writing it to
TensorBoard).

Pipelines covered: Criteo TSV (and Parquet rows in tests/data_pipelines), UCI Adult Parquet. The
text (language-model) and image pipelines arrive with issue 5; their cases (empty text file,
corrupt image bytes) are listed below as skipped placeholders until then.
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
from testing_utils import (GOOD_LINES, collect, error_lines, run, tb_scalars, train_args,
                           tsv_line)
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


# --- Text and image pipelines: issue 5 ---------------------------------------------------------


@pytest.mark.skip(reason="the text (language-model) pipeline does not exist yet (issue 5)")
def test_text_empty_file_and_non_utf8_bytes():
  """Empty text file, non-UTF-8 bytes, over-long document: error naming the file, or skipped."""


@pytest.mark.skip(reason="the image pipeline does not exist yet (issue 5)")
def test_image_corrupt_bytes():
  """Corrupt image bytes and a wrong label: error naming the file/record, or skipped and counted."""


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
  proc = run(train_args(str(model_dir), bad_data_dir), timeout=600)
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
