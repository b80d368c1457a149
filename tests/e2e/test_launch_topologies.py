"""End to end: 3 groups in a ring, each loading only its predecessor's published models."""

import json
import os
import re
import subprocess

import pytest

from tf_codistill import layout

from testing_utils import REPO
from testing_utils import launch_args

pytestmark = pytest.mark.e2e


def test_three_groups_in_a_ring_learn_from_their_predecessor_only(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  args = launch_args(model_dir, criteo_dir, "--num_groups=3", "--teacher_graph=ring",
                     bindings=["trainer.train.train_steps = 120",
                               "trainer.train.steps_per_epoch = 40",
                               # On a busy machine a group could finish before its predecessor's
                               # first version: each waits for it (as the other e2e tests do).
                               "tfc.Exchange.wait_for_first_teachers_s = 120.0"])
  proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  for group in range(3):
    predecessor = (group - 1) % 3
    group_dir = os.path.join(model_dir, f"group_{group}")
    with open(layout.RunDir(group_dir).results) as f:
      results = json.load(f)
    assert results["teacher_graph"] == "ring" and results["teacher_groups"] == [predecessor]
    assert results["teacher_loads"] >= 1 and len(results["teacher_steps"]) == 1
    assert results["teacher_loads_by_group"] == {str(predecessor): results["teacher_loads"]}
    # What the log says agrees (the log is for people: the results above are the record).
    log = open(os.path.join(group_dir, "chief_0.log")).read()
    loaded = set(re.findall(r"teacher: loaded peer group (\d+) step", log))
    assert loaded <= {str(predecessor)}, log[-3000:]
