"""serving: the raw-line signature parses inside the SavedModel exactly as the pipeline does."""

import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_codistill as tfc
from data_pipelines import criteo
from data_pipelines import make_criteo_like
from tf_codistill import serving
from tf_codistill.exchange import directory as exchange
from tf_codistill.models import ctr

from testing_utils import GOOD_LINES
from testing_utils import write_lines

BUCKETS = 1000


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory):
  """A generated Criteo TSV file of 300 rows (missing values included)."""
  path = str(tmp_path_factory.mktemp("serving"))
  make_criteo_like.generate(path, 300, num_files=1, seed=3, prefix="eval", vocab_size=500)
  return glob.glob(f"{path}/eval-*")[0]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, eval_file):
  """A small CTR model exported with ``serving_raw`` (and the model itself)."""
  model = ctr.ctr_model(num_buckets=BUCKETS, embedding_dim=4, hidden_units=(8,))
  features, _ = next(iter(criteo.make_dataset(eval_file, 8, num_buckets=BUCKETS)))
  model(features)
  path = str(tmp_path_factory.mktemp("export") / "model")
  tfc.export(model, path, raw_parser=criteo.raw_parser(BUCKETS))
  return path, model


def _lines(path):
  with open(path) as f:
    return f.read().splitlines()


def _pipeline_features(path, batch_size):
  return next(iter(criteo.make_dataset(path, batch_size, num_buckets=BUCKETS)))[0]


def test_raw_parser_gives_the_pipelines_features_with_or_without_the_label(tmp_path, eval_file):
  lines = GOOD_LINES + _lines(eval_file)[:50]
  path = write_lines(tmp_path / "rows.tsv", lines)
  expected = _pipeline_features(path, len(lines))
  parse = criteo.raw_parser(BUCKETS)
  unlabeled = [line.split("\t", 1)[1] for line in lines]
  mixed = [line if i % 2 else unlabeled[i] + "\n" for i, line in enumerate(lines)]
  for raw in (lines, unlabeled, mixed):
    got = parse(tf.constant(raw))
    np.testing.assert_array_equal(got["categorical"], expected["categorical"])
    np.testing.assert_array_equal(got["dense"], expected["dense"])


@pytest.mark.parametrize("line, reason", [
    ("\t".join(["1", "x"] + ["0"] * 12 + ["a"] * 26), "non-numeric integer field I1 (got: x)"),
    ("\t".join(["0"] * 13 + ["a"] * 24), "expected 39 (or 40 with the label first) "
     "tab-separated fields, got 37"),
    ("\t".join(["2"] + ["0"] * 13 + ["a"] * 26), "label not in {0,1} (got: 2)"),
])
def test_raw_parser_names_the_malformed_line_of_the_batch(line, reason):
  with pytest.raises(tf.errors.InvalidArgumentError, match="malformed raw Criteo line 1: "
                     + reason.replace("(", r"\(").replace(")", r"\)").replace("{", r"\{")):
    criteo.raw_parser(BUCKETS)(tf.constant([GOOD_LINES[0], line]))


def test_serving_raw_predicts_what_the_model_predicts_on_the_pipelines_features(
    exported, eval_file):
  path, model = exported
  lines = _lines(eval_file)[:64]
  features = _pipeline_features(eval_file, 64)
  loaded = tf.saved_model.load(path)
  raw = loaded.signatures[serving.RAW_SIGNATURE_KEY](lines=tf.constant(lines))
  default = loaded.signatures[exchange.SIGNATURE_KEY](**features)
  np.testing.assert_allclose(raw["logits"], default["logits"], rtol=1e-6)
  np.testing.assert_allclose(raw["logits"], model(features), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(raw[serving.PROBABILITIES_KEY], tf.sigmoid(default["logits"]),
                             rtol=1e-6)


def test_predict_probabilities_reads_raw_lines_through_serving_raw(exported, eval_file):
  path, _ = exported
  raw = tfc.predict_probabilities(path, serving.raw_lines(eval_file, 64))
  parsed = tfc.predict_probabilities(
      path, criteo.make_dataset(eval_file, 64, num_buckets=BUCKETS))
  assert raw.shape == (300, 1)
  np.testing.assert_allclose(raw, parsed, rtol=1e-6)


def test_raw_lines_of_a_model_without_serving_raw_are_a_clear_error(tmp_path, eval_file):
  model = ctr.ctr_model(num_buckets=BUCKETS, embedding_dim=4, hidden_units=(8,))
  model(_pipeline_features(eval_file, 4))
  path = str(tmp_path / "plain")
  tfc.export(model, path)
  with pytest.raises(ValueError, match="has no 'serving_raw' signature .*raw_parser"):
    tfc.predict_probabilities(path, serving.raw_lines(eval_file, 64))


def test_check_raw_parser_accepts_the_pipelines_settings_and_refuses_others(tmp_path,
                                                                            eval_file):
  def dataset_fn(files, batch_size):
    return criteo.make_dataset(files, batch_size, num_buckets=BUCKETS)

  assert serving.check_raw_parser(criteo.raw_parser(BUCKETS), dataset_fn, eval_file)
  with pytest.raises(tfc.ConfigurationError,
                     match=r"raw_parser differs .* feature 'categorical' differs on \d+ of 64 "
                           r"lines .*NUM_BUCKETS"):
    serving.check_raw_parser(criteo.raw_parser(BUCKETS + 1), dataset_fn, eval_file)
  other = write_lines(tmp_path / "other.tsv", ["just one field"])
  with pytest.raises(tfc.ConfigurationError, match="cannot parse the first lines of .*other.tsv"):
    serving.check_raw_parser(criteo.raw_parser(BUCKETS), dataset_fn, other)


def test_check_raw_parser_checks_nothing_on_files_that_are_not_text(tmp_path):
  make_criteo_like.generate(str(tmp_path), 50, file_format="parquet", prefix="eval")
  path = glob.glob(f"{tmp_path}/eval-*")[0]
  assert not serving.check_raw_parser(criteo.raw_parser(BUCKETS), None, path)


def test_saved_model_cli_run_on_a_raw_line_gives_the_pipelines_probability(exported, eval_file):
  path, model = exported
  line = _lines(eval_file)[0].split("\t", 1)[1]  # as a server gets it: no label
  cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
  done = subprocess.run([cli, "run", "--dir", path, "--tag_set", "serve", "--signature_def",
                         serving.RAW_SIGNATURE_KEY, "--input_exprs", f"lines=[{line!r}]"],
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  printed = re.search(r"Result for output key probabilities:\s*\[\[([0-9.e+-]+)\]\]",
                      done.stdout)
  assert printed, done.stdout[-2000:]
  expected = float(tf.sigmoid(model(_pipeline_features(eval_file, 1)))[0, 0])
  assert float(printed.group(1)) == pytest.approx(expected, rel=1e-5)


def test_a_language_model_serves_raw_text_through_its_vocabulary(tmp_path):
  from data_pipelines import text_lm
  from tf_codistill.models import lm
  text = tmp_path / "eval-00000-of-00001.txt"
  text.write_text("the cat sat on the mat .\nthe dog sat .\na cat ran on the mat\n" * 20)
  vocab = str(tmp_path / "vocab-word-10.tsv")
  text_lm.write_vocab(text_lm.build_vocab([str(text)], 10), vocab)
  parser = text_lm.raw_parser(vocab)

  def dataset_fn(files, batch_size):
    return text_lm.make_dataset(files, batch_size, vocab_size=10, sequence_length=8)

  assert serving.check_raw_parser(parser, dataset_fn, str(text))
  with pytest.raises(tfc.ConfigurationError, match="feature 'tokens' differs"):
    serving.check_raw_parser(text_lm.raw_parser(vocab, level="char"), dataset_fn, str(text))

  model = lm.lstm_lm(vocab_size=10, embedding_dim=8, lstm_units=(8,))
  features = next(iter(dataset_fn(str(text), 4)))[0]
  model(features)
  path = str(tmp_path / "lm")
  tfc.export(model, path, raw_parser=parser, output="softmax")
  serve = tf.saved_model.load(path).signatures[serving.RAW_SIGNATURE_KEY]
  lines = ["the cat sat on the mat .", "a dog"]
  out = serve(lines=tf.constant(lines))
  ids = parser(tf.constant(lines))["tokens"]
  assert out["logits"].shape == (2, 8, 10)
  np.testing.assert_allclose(out["logits"], model({"tokens": ids}), rtol=1e-5, atol=1e-6)
  # The short line's own positions (3 tokens: a, dog, <eos>) do not see its padding.
  np.testing.assert_allclose(out["logits"][1, :3],
                             model({"tokens": ids[1:, :3]})[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tf.reduce_sum(out["probabilities"], -1), 1.0, rtol=1e-5)


def test_check_raw_parser_leaves_malformed_lines_to_the_pipelines_policy(tmp_path):
  bad = "\t".join(["1", "x"] + ["0"] * 12 + ["a"] * 26)
  path = write_lines(tmp_path / "eval.tsv", [GOOD_LINES[0], bad, *GOOD_LINES[1:]])

  def dataset_fn(bad_lines):
    return lambda files, batch_size: criteo.make_dataset(files, batch_size, num_buckets=BUCKETS,
                                                         bad_lines=bad_lines)

  # 'skip': both drop the bad line, and the good ones agree.
  assert serving.check_raw_parser(criteo.raw_parser(BUCKETS), dataset_fn("skip"), path)
  with pytest.raises(tfc.ConfigurationError, match="differs on 3 of 3 lines"):
    serving.check_raw_parser(criteo.raw_parser(7), dataset_fn("skip"), path)
  # 'error': the pipeline names the line when it reads it; nothing is checked here.
  assert not serving.check_raw_parser(criteo.raw_parser(BUCKETS), dataset_fn("error"), path)
