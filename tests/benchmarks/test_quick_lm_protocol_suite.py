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
             f"--results_dir={results}", f"--work_dir={work}", "--allow_load", "--settle_s=0",
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
  # The ensemble and its members are scored on every validation token, the same ones the
  # members' runs scored themselves on: their losses are the runs' final validation losses.
  recorded = results / "quick_lm_protocol" / "runs" / "ensemble"
  ensemble = [json.loads((recorded / f"seed_{s}_group_0.json").read_text())
              for s in range(arms["ensemble"]["seeds"])]
  finals = {r["seed"]: r["final_val_loss"] for r in arms["sync_b"]["runs"]}
  for run in ensemble:
    assert run["member_losses"] == pytest.approx([finals[m] for m in run["members"]], abs=1e-4)
    assert run["ensemble_gain"] == pytest.approx(sum(run["member_losses"]) / 2 - run["val_loss"])
  assert len({run["examples"] for run in ensemble}) == 1 and ensemble[0]["examples"] > 0
  assert goals["ensemble_gain"] == pytest.approx(
      sum(run["ensemble_gain"] for run in ensemble) / len(ensemble))
  assert goals["codistill_wall_time_ratio"] is None or goals["codistill_wall_time_ratio"] > 0
  cluster = json.loads((results / "quick_lm_protocol" / "runs" / "sync_2b_cluster"
                        / "seed_0_group_0.json").read_text())
  assert cluster["strategy"] == "multi_worker_mirrored" and cluster["num_workers"] == 2
  churn = arms["codistill"]["churn"]
  assert churn["pairs"][0]["total_variation"] > 0
  # On a machine without the members' models (another work dir), the ensemble trains its
  # members again from their recorded configuration and says how far their curves are.
  run_dir = work / "quick_lm_protocol" / "runs"
  subprocess.run(["rm", "-rf", str(run_dir / "sync_b" / "seed_0"),
                  str(results / "quick_lm_protocol" / "runs" / "ensemble")], check=True)
  # ... and without the corpus, after Debian moved a package on: the runner builds the corpus
  # again from the package versions its results record, not the newest.
  subprocess.run(["rm", "-rf", str(work / "data" / "debian_english")], check=True)
  debian_fixtures.make_deb(str(debs), "fortunes", {"usr/share/games/fortunes/new": b"new\n" * 9},
                           version="2.0-1")
  again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
  assert again.returncode == 0, again.stderr[-4000:]
  rebuilt = json.loads((work / "data" / "debian_english" / "manifest.json").read_text())
  assert rebuilt["packages"] == manifest["packages"]
  rescored = json.loads((results / "quick_lm_protocol" / "runs" / "ensemble"
                         / "seed_0_group_0.json").read_text())
  assert [(r["seed"], r["trained_now"]) for r in rescored["member_runs"]] == [(0, True),
                                                                              (1, False)]
  assert all(r["steps_compared"] >= 1 for r in rescored["member_runs"])
  assert rescored["member_runs"][0]["max_abs_loss_diff"] < 0.05
  assert rescored["member_runs"][1]["max_abs_loss_diff"] == 0  # the recorded run's own model
