"""`python -m benchmarks.run quick_lm_protocol`: english_lm's protocol end to end at toy
size, on a corpus the runner builds from small .deb files of every english package."""

import json
import subprocess
import sys

import pytest

import debian_fixtures
from testing_utils import REPO

pytestmark = pytest.mark.e2e


def test_lm_protocol_suite_builds_its_corpus_and_accounts_for_every_token(tmp_path):
  debs = tmp_path / "debs"
  debs.mkdir()
  for package, files in debian_fixtures.every_english_package().items():
    debian_fixtures.make_deb(str(debs), package, files)
  results, work = tmp_path / "results", tmp_path / "work"
  command = [sys.executable, "-m", "benchmarks.run", "quick_lm_protocol",
             f"--results_dir={results}", f"--work_dir={work}", "--allow_load",
             f"--gin_bindings=bench.Suite.debs_dir = '{debs}'"]
  proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
  assert proc.returncode == 0, proc.stderr[-4000:]
  manifest = json.loads((work / "data" / "debian_english" / "manifest.json").read_text())
  assert len(manifest["packages"]) == 11 and manifest["tokenizer"]["vocab_size"] == 400
  summary = json.loads((results / "quick_lm_protocol" / "summary.json").read_text())
  assert summary["protocol"]["scaling"]["b_star"] == 4
  arms, goals = summary["arms"], summary["goals"]
  half = manifest["splits"]["train"]["tokens"] // 2
  for run in arms["codistill"]["runs"]:
    assert run["train_targets"] == 60 * 4 * 8 and abs(run["share_tokens"] - half) < half // 2
    assert run["repeated_tokens"] == 0
  for run in arms["sync_2b"]["runs"] + arms["sync_2b_cluster"]["runs"]:
    assert run["train_targets"] == 60 * 8 * 8
    assert run["share_tokens"] == manifest["splits"]["train"]["tokens"]
  assert goals["repeated_tokens"] == 0 and summary["goal_verdicts"]["repeated_tokens"]["met"]
  # The ensemble's gain bounds codistillation's; the wall-clock ratio compares it with a cluster.
  assert "ensemble_gain_captured" in goals
  assert goals["codistill_wall_time_ratio"] is None or goals["codistill_wall_time_ratio"] > 0
  cluster = json.loads((results / "quick_lm_protocol" / "runs" / "sync_2b_cluster"
                        / "seed_0_group_0.json").read_text())
  assert cluster["strategy"] == "multi_worker_mirrored" and cluster["num_workers"] == 2
  churn = arms["codistill"]["churn"]
  assert churn["pairs"][0]["total_variation"] > 0
