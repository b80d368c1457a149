"""tf-codistill-churn on raw lines (--raw, through serving_raw) agrees with the parsed path."""

import glob
import json
import sys

import pytest

import tf_codistill as tfc
from data_pipelines import criteo
from data_pipelines import make_criteo_like
from tf_codistill.models import ctr

from testing_utils import error_lines
from testing_utils import run

BUCKETS = 1000


def _export(path, eval_file, seed, raw):
  import tf_keras as keras
  keras.utils.set_random_seed(seed)
  model = ctr.ctr_model(num_buckets=BUCKETS, embedding_dim=4, hidden_units=(8,))
  model(next(iter(criteo.make_dataset(eval_file, 8, num_buckets=BUCKETS)))[0])
  tfc.export(model, path, raw_parser=criteo.raw_parser(BUCKETS) if raw else None)
  return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  root = tmp_path_factory.mktemp("churn")
  make_criteo_like.generate(str(root), 500, seed=5, prefix="eval", vocab_size=500)
  eval_file = glob.glob(f"{root}/eval-*")[0]
  return eval_file, [_export(str(root / f"m{i}"), eval_file, i, raw=i < 2) for i in range(3)]


def _churn(eval_file, paths, tmp_path, *flags):
  out = str(tmp_path / "churn.json")
  done = run([sys.executable, "-m", "tf_codistill.bin.churn", f"--data={eval_file}",
              f"--json_out={out}", f"--gin_bindings=criteo.make_dataset.num_buckets = {BUCKETS}",
              *[f"--saved_model={p}" for p in paths], *flags], timeout=300)
  return done, out


def test_raw_lines_give_the_churn_of_the_parsed_features(models, tmp_path):
  eval_file, paths = models
  summaries = []
  for flags in ((), ("--raw",)):
    done, out = _churn(eval_file, paths[:2], tmp_path, *flags)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(out) as f:
      summaries.append(json.load(f))
  parsed, raw = summaries
  assert raw["examples"] == parsed["examples"] == 500
  assert raw["mean_abs_diff"] == pytest.approx(parsed["mean_abs_diff"], rel=1e-5)
  assert 0 < raw["mean_abs_diff"] and raw["disagreement"] == parsed["disagreement"]


def test_raw_lines_for_a_model_without_serving_raw_name_the_model(models, tmp_path):
  eval_file, paths = models
  done, _ = _churn(eval_file, [paths[0], paths[2]], tmp_path, "--raw")
  assert done.returncode == 2
  assert any("m2 has no 'serving_raw' signature" in line for line in error_lines(done.stderr)), \
      done.stderr[-2000:]
