"""tf-codistill-evaluate scores each SavedModel and their ensemble on the gin-bound eval data."""

import glob
import json
import sys

import numpy as np
import pytest

import tf_codistill as tfc
from data_pipelines import criteo
from data_pipelines import make_criteo_like
from tf_codistill.models import ctr

from testing_utils import error_lines
from testing_utils import run

BUCKETS = 1000
BINDINGS = [f"criteo.make_dataset.num_buckets = {BUCKETS}", "tfc.Data.batch_size = 64"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  import tf_keras as keras
  root = tmp_path_factory.mktemp("evaluate")
  make_criteo_like.generate(str(root), 300, seed=7, prefix="eval", vocab_size=500)
  eval_file = glob.glob(f"{root}/eval-*")[0]
  paths = []
  for seed in range(2):
    keras.utils.set_random_seed(seed)
    model = ctr.ctr_model(num_buckets=BUCKETS, embedding_dim=4, hidden_units=(8,))
    model(next(iter(criteo.make_dataset(eval_file, 8, num_buckets=BUCKETS)))[0])
    paths.append(str(root / f"m{seed}"))
    tfc.export(model, paths[-1])
  return eval_file, paths


def _evaluate(tmp_path, *flags):
  out = str(tmp_path / "scores.json")
  done = run([sys.executable, "-m", "tf_codistill.bin.evaluate", f"--json_out={out}",
              *[f"--gin_bindings={b}" for b in BINDINGS], *flags], timeout=300)
  return done, out


def test_scores_of_the_members_and_the_ensemble_on_the_bound_eval_files(models, tmp_path):
  eval_file, paths = models
  npz = str(tmp_path / "ensemble.npz")
  done, out = _evaluate(tmp_path, f"--gin_bindings=tfc.Data.eval_files = ['{eval_file}']",
                        *[f"--saved_model={p}" for p in paths], f"--predictions_out={npz}",
                        "--prediction_batches=2")
  assert done.returncode == 0, done.stderr[-2000:]
  with open(out) as f:
    scores = json.load(f)
  expected = tfc.ensemble_scores(paths, criteo.make_dataset(eval_file, 100,
                                                            num_buckets=BUCKETS))
  assert scores["examples"] == 300 and scores["data"] == [eval_file]
  for got, want in zip(scores["members"] + [scores["ensemble"]],
                       expected["members"] + [expected["ensemble"]]):
    assert got == pytest.approx(want, rel=1e-5)
  assert "ensemble of 2: val_auc=" in done.stdout
  with np.load(npz) as kept:  # the first 2 batches of 64
    assert kept["probs"].shape == (128, 1) and kept["labels"].shape == (128, 1)


def test_a_missing_model_or_no_data_is_a_clear_error(models, tmp_path):
  eval_file, paths = models
  done, _ = _evaluate(tmp_path, f"--data={eval_file}", f"--saved_model={paths[0]}",
                      f"--saved_model={tmp_path}/nowhere")
  assert done.returncode == 2
  assert any("nowhere" in line for line in error_lines(done.stderr)), done.stderr[-2000:]
  done, _ = _evaluate(tmp_path, f"--saved_model={paths[0]}")
  assert done.returncode != 0 and "bind tfc.Data.eval_files" in done.stderr
