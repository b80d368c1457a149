"""End to end through tf-codistill-launch: groups that average parameters (DiLoCo) and distill
between rounds, configured in gin, end every round with the same parameters."""

import json
import os
import re
import subprocess

import pytest

from tf_codistill import layout

from testing_utils import REPO
from testing_utils import launch_args

pytestmark = pytest.mark.e2e

AVERAGING = ["tfc.Exchange.averaging = @tfc.ParameterAveraging()",
             "tfc.ParameterAveraging.every_steps = 40",
             "tfc.ParameterAveraging.encoding = 'int8'"]


def _results(model_dir, group):
  with open(layout.RunDir(os.path.join(model_dir, f"group_{group}")).results) as f:
    return json.load(f)


def test_groups_average_every_round_and_distill_between_rounds(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  proc = subprocess.run(
      launch_args(model_dir, criteo_dir, "--num_groups=2", bindings=AVERAGING),
      cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  a, b = _results(model_dir, 0), _results(model_dir, 1)
  for results in (a, b):
    assert results["steps"] == 240 and results["averaging"]["every_steps"] == 40
    assert results["averaging"]["encoding"] == "int8"
  rounds_a, rounds_b = a["averaging_rounds"], b["averaging_rounds"]
  assert rounds_a["rounds"] == rounds_b["rounds"] == 6
  assert rounds_a["digests"] == rounds_b["digests"]
  assert rounds_a["rounds_short_of_groups"] == 0 and rounds_a["bytes_sent"] > 0
  # The last round is at the last step: both groups end with the same weights.
  assert a["weights_digest"] == b["weights_digest"]
  # Distillation ran between rounds.
  assert a["teacher_loads"] >= 1 and a["history"]["distill_loss"][-1] > 0
  log = open(os.path.join(model_dir, "group_0", "chief_0.log")).read()
  # Rounds are logged (the count is results.json's: a loaded machine once lost a log line).
  assert re.search(r"averaging: round \d+ at step \d+: members \[0, 1\], waited", log)
