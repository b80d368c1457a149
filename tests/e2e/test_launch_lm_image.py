"""End to end: tf-codistill-launch runs 2-way codistillation on the LM and image tasks from their
gin configs (real data: the King James Bible, Fashion-MNIST), at test sizes."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from data_pipelines import images
from data_pipelines import text_lm
from tf_codistill import layout

from testing_utils import REPO
from testing_utils import require_fashion_mnist
from testing_utils import require_kjv

pytestmark = pytest.mark.e2e

COMMON = (
    "trainer.train.train_steps = 120",
    "trainer.train.steps_per_epoch = 40",
    "tfc.Exchange.publish_every_steps = 40",
    "tfc.Distillation.burn_in_steps = 40",
    "tfc.Exchange.poll_interval_s = 0.2",
    # On a loaded machine one group can finish all its steps before its peer's first publish.
    "tfc.Exchange.wait_for_first_teachers_s = 120.0",
    "tfc.Checkpoints.every_steps = 120",
    "trainer.train.verbose = 0",
    "trainer.train.intra_op_threads = 1",
    "trainer.train.inter_op_threads = 1",
    "trainer.train.save_eval_predictions = True",
)
LM = (
    "VOCAB_SIZE = 500",
    "text_lm.make_dataset.sequence_length = 16",
    "models.lstm_lm.embedding_dim = 16",
    "models.lstm_lm.lstm_units = (32,)",
    "tfc.Data.batch_size = 16",
    "trainer.train.eval_steps = 10",
    "trainer.train.prediction_batches = 2",
    "tfc.Data.shuffle_buffer = 200",
)
IMAGE = (
    "models.resnet.widths = (8, 16)",
    "tfc.Data.batch_size = 32",
    "tfc.Data.shuffle_buffer = 500",
)


def _launch(model_dir, gin_file, data_dir, bindings):
  args = [sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={model_dir}",
          "--num_groups=2", f"--gin_file={REPO}/gin/{gin_file}"]
  bindings = list(COMMON) + list(bindings) + [
      f"tfc.Data.train_files = ['{data_dir}/train-*']",
      f"tfc.Data.eval_files = ['{data_dir}/eval-*']"]
  proc = subprocess.run(args + [f"--gin_bindings={b}" for b in bindings], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  results = []
  for group in range(2):
    with open(layout.group_run(model_dir, group).results) as f:
      results.append(json.load(f))
  for group, result in enumerate(results):
    assert result["steps"] == 120
    assert result["teacher_loads"] >= 1 and result["teacher_rejections"] == 0
    assert result["first_teachers_wait_s"] is not None  # the wait point (step 40) was reached
    assert result["teacher_groups"] == [1 - group]
    assert result["history"]["alpha"][-1] == 1.0 and result["history"]["distill_loss"][-1] > 0
  return results


def test_lm_two_way_codistillation(tmp_path):
  require_kjv()
  data_dir = str(tmp_path / "kjv")
  text_lm.prepare(data_dir, vocab_size=500, num_train_files=4)
  results = _launch(str(tmp_path / "job"), "lm/codistill_2way.gin", data_dir, LM)
  for result in results:
    # Better than a uniform guess over 500 tokens (log 500 = 6.2) after 120 steps.
    assert result["val_loss"] < math.log(500)
    assert result["val_perplexity"] == pytest.approx(math.exp(result["val_xent"]), rel=1e-4)
    assert 0 < result["val_accuracy"] < 1
  with np.load(layout.group_run(str(tmp_path / "job"), 0).eval_predictions) as npz:
    assert npz["probs"].shape == (32, 16, 500) and npz["labels"].shape == (32, 16)
  # Churn between the two groups' exports, with the LM config's pipeline and softmax outputs.
  churn_json = str(tmp_path / "churn.json")
  proc = subprocess.run(
      [sys.executable, "-m", "tf_codistill.bin.churn", f"--json_out={churn_json}",
       f"--saved_model={tmp_path}/job/group_0/export",
       f"--saved_model={tmp_path}/job/group_1/export",
       f"--data={data_dir}/eval-*", "--batch_size=256", f"--gin_file={REPO}/gin/lm/common.gin",
       "--gin_bindings=VOCAB_SIZE = 500",
       "--gin_bindings=text_lm.make_dataset.sequence_length = 16"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(churn_json) as f:
    churn = json.load(f)
  # (After 120 steps both may still predict the most frequent token everywhere: no disagreement.)
  assert (churn["examples"] > 1000 and 0 < churn["mean_abs_diff"] < 0.01
          and 0 <= churn["disagreement"] < 1)


def test_image_two_way_codistillation(tmp_path):
  require_fashion_mnist()
  data_dir = tmp_path / "fashion"
  data_dir.mkdir()
  for part, count, files in (("train", 2400, 4), ("eval", 400, 1)):
    names = images._PARTS[part]
    pixels, labels = images.read_idx(os.path.join(images.FASHION_MNIST_DIR, names[0]),
                                     os.path.join(images.FASHION_MNIST_DIR, names[1]))
    for k, chunk in enumerate(np.array_split(np.arange(count), files)):
      images.write_tfrecords(pixels[chunk], labels[chunk],
                             str(data_dir / f"{part}-{k:05d}-of-{files:05d}.tfrecord"))
  results = _launch(str(tmp_path / "job"), "image/codistill_2way.gin", str(data_dir), IMAGE)
  for result in results:
    assert result["val_accuracy"] > 0.2  # 10 classes: chance is 0.1
    assert result["val_loss"] < math.log(10)
