"""Synchronous groups with a reduced-precision gradient all-reduce (and fused updates) converge,
and their replicas stay bitwise identical."""

import json
import os
import re

import pytest

from tf_codistill import layout

from testing_utils import Launch
from testing_utils import launch_args

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("dtype,fusion", [("float16", "forward"), ("bfloat16", "backward")])
def test_compressed_allreduce_training_converges_on_a_local_cluster(tmp_path, criteo_dir, dtype,
                                                                     fusion):
  model_dir = str(tmp_path / "job")
  launch = Launch(launch_args(
      model_dir, criteo_dir, "--num_groups=1", "--strategy=multi_worker_mirrored",
      "--workers_per_group=1", gin="baseline.gin",
      bindings=["trainer.train.train_steps = 160", f"tfc.Group.allreduce_dtype = '{dtype}'",
                f"trainer.train.fusion = '{fusion}'"]))
  assert launch.wait(timeout=300) == 0, launch.stderr[-4000:]
  group_dir = os.path.join(model_dir, "group_0")
  digests = {}
  for task in ("chief_0", "worker_0"):
    log = open(f"{group_dir}/{task}.log").read()
    assert re.search(rf"gradient all-reduce over 2 replicas in {dtype}: 4 dense, 26 IndexedSlices",
                     log), task
    digests[task] = re.search(r"final student weights digest \(\w+:\d\): (\w+)", log).group(1)
  assert len(set(digests.values())) == 1, digests
  with open(layout.RunDir(group_dir).results) as f:
    results = json.load(f)
  assert results["steps"] == 160
  losses = results["history"]["loss"]
  # Started at log(2) = 0.693 (balanced labels, small initial weights) and kept going down.
  assert losses[-1] < losses[0] < 0.69, losses
  assert results["val_logloss"] < 0.6
