"""The forward_fusion_ps benchmark (``python -m benchmarks.run forward_fusion_ps``) on real local
parameter-server clusters: forward fusion's pending protocol applies every gradient exactly once
with one worker; with two, every gradient is accounted for as applied once, lost or applied more
often."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import forward_fusion_ps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_accounting_sorts_gradients_into_applied_once_lost_and_applied_more_often():
  summary = forward_fusion_ps.accounting(np.array([1, 0, 2, 1, 3, 0, 0, 1]))
  assert (summary["steps"], summary["applied_once"], summary["lost"],
          summary["applied_twice_or_more"], summary["lost_fraction"]) == (8, 3, 3, 2, 3 / 8)


@pytest.mark.cluster
def test_one_worker_applies_every_gradient_once_and_two_are_all_accounted_for(tmp_path):
  env = {**os.environ, "TF_CODISTILL_BENCH_LOCK": str(tmp_path / "lock")}
  done = subprocess.run([sys.executable, "-m", "benchmarks.run", "forward_fusion_ps",
                         f"--results_dir={tmp_path}", "--allow_load", "--settle_s=0",
                         "--gin_bindings=bench.forward_fusion_ps.steps = 150"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((tmp_path / "forward_fusion_ps" / "summary.json").read_text())
  arms = summary["arms"]
  one = arms["1_workers"]
  assert (one["steps"], one["applied_once"], one["lost"], one["applied_twice_or_more"]) == (
      150, 150, 0, 0)
  two = arms["2_workers"]
  assert two["applied_once"] + two["lost"] + two["applied_twice_or_more"] == two["steps"] == 150
  assert summary["config"] == {"steps": 150, "work": 4}
  report = (tmp_path / "forward_fusion_ps" / "report.md").read_text()
  assert "2_workers" in report and "applied twice or more" in report
