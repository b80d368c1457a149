"""End to end: 2-way codistillation of a language model on a Debian-format corpus built by the
corpus builder from real .deb files (a toy fortunes package), and the refusal to repeat data."""

import json
import math
import os
import subprocess
import sys

import pytest

from benchmarks import runner
from benchmarks import suite_spec as spec
from data_pipelines import corpus
from data_pipelines import debian_text
from tf_codistill import layout

import debian_fixtures
from testing_utils import REPO

pytestmark = pytest.mark.e2e
VOCAB = 400
BINDINGS = (
    f"VOCAB_SIZE = {VOCAB}",
    "token_lm.make_dataset.sequence_length = 8",
    "models.lstm_lm.embedding_dim = 16",
    "models.lstm_lm.lstm_units = (32,)",
    "tfc.Data.batch_size = 4",
    "trainer.train.train_steps = 60",
    "trainer.train.steps_per_epoch = 20",
    "tfc.Data.shuffle_buffer = 100",
    "trainer.train.exchange = @tfc.Exchange",
    "tfc.Exchange.publish_every_steps = 20",
    "tfc.Distillation.burn_in_steps = 20",
    "tfc.Exchange.poll_interval_s = 0.2",
    "tfc.Exchange.wait_for_first_teachers_s = 120.0",
    "tfc.Checkpoints.every_steps = 60",
    "trainer.train.verbose = 0",
    "trainer.train.intra_op_threads = 1",
    "trainer.train.inter_op_threads = 1",
)


@pytest.fixture(scope="module")
def toy_corpus(tmp_path_factory):
  base = tmp_path_factory.mktemp("toy")
  debian_fixtures.make_deb(str(base), "fortunes", debian_fixtures.fortunes_package(12_000))
  sources = [s for s in debian_text.CORPORA["english"] if s.package == "fortunes"]
  out = str(base / "debian_english")
  manifest = corpus.build(out, sources, vocab_size=VOCAB, debs_dir=str(base), train_shards=4,
                          eval_shards=1, eval_fraction=0.2)
  return out, manifest


def _launch(model_dir, corpus_dir, extra=()):
  tokens = os.path.join(corpus_dir, "tokens")
  bindings = list(BINDINGS) + list(extra) + [
      f"tfc.Data.train_files = ['{tokens}/train-*']",
      f"tfc.Data.eval_files = ['{tokens}/eval-*']"]
  args = [sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={model_dir}",
          "--num_groups=2", f"--gin_file={REPO}/gin/lm/debian.gin"]
  return subprocess.run(args + [f"--gin_bindings={b}" for b in bindings], cwd=REPO,
                        capture_output=True, text=True, timeout=300)


def test_codistillation_on_a_built_corpus_reads_each_token_once(tmp_path, toy_corpus):
  corpus_dir, manifest = toy_corpus
  proc = _launch(str(tmp_path / "job"), corpus_dir)
  assert proc.returncode == 0, proc.stderr[-4000:]
  suite = spec.Suite(name="s", arms=[spec.Arm("a")], data="debian_english")
  paths = spec.RunPaths(str(tmp_path), str(tmp_path), data_dir=os.path.dirname(corpus_dir))
  for group in range(2):
    with open(layout.group_run(str(tmp_path / "job"), group).results) as f:
      result = json.load(f)
    assert result["steps"] == 60 and result["teacher_loads"] >= 1
    assert result["train_targets"] == 60 * 4 * 8
    assert result["val_loss"] < math.log(VOCAB)
    use = runner._data_use(suite, paths, result)
    assert use["share_tokens"] == corpus.share_tokens(manifest, group, 2)
    assert use["repeated_tokens"] == 0


def test_a_group_that_would_repeat_its_share_fails_saying_so(tmp_path, toy_corpus):
  corpus_dir, manifest = toy_corpus
  share = corpus.share_tokens(manifest, 0, 2)
  steps = share // (4 * 8) + 40  # more windows than the group's half holds
  proc = _launch(str(tmp_path / "job"), corpus_dir,
                 [f"trainer.train.train_steps = {steps}",
                  f"trainer.train.steps_per_epoch = {steps}",
                  f"tfc.Checkpoints.every_steps = {steps}",
                  "trainer.train.exchange = None"])
  assert proc.returncode != 0
  logs = proc.stderr + "".join(
      open(os.path.join(root, name), errors="replace").read()
      for root, _, names in os.walk(tmp_path / "job") for name in names if name.endswith(".log"))
  assert "training data exhausted: 1 pass(es) over 2 token shard(s)" in logs


@pytest.mark.cluster
def test_sync_sgd_on_a_multi_worker_mirrored_cluster_splits_the_shards(tmp_path, toy_corpus):
  corpus_dir, manifest = toy_corpus
  tokens = os.path.join(corpus_dir, "tokens")
  bindings = list(BINDINGS) + [
      "trainer.train.exchange = None", "tfc.Data.batch_size = 8",
      f"tfc.Data.train_files = ['{tokens}/train-*']",
      f"tfc.Data.eval_files = ['{tokens}/eval-*']"]
  args = [sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={tmp_path / 'job'}",
          "--num_groups=1", "--strategy=multi_worker_mirrored", "--workers_per_group=1",
          f"--gin_file={REPO}/gin/lm/debian.gin"]
  proc = subprocess.run(args + [f"--gin_bindings={b}" for b in bindings], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  with open(layout.group_run(str(tmp_path / "job"), 0).results) as f:
    result = json.load(f)
  assert result["strategy"] == "multi_worker_mirrored" and result["num_workers"] == 2
  assert result["steps"] == 60 and result["train_targets"] == 60 * 8 * 8
  assert result["val_loss"] < math.log(VOCAB)
