"""`python -m benchmarks.run NAME`: one entry point for every benchmark, its errors and its
output, run as users run it (subprocesses, marked e2e)."""

import importlib
import json
import os
import subprocess
import sys

import gin
import pytest

from benchmarks import machine
from benchmarks import registry
from tf_codistill.launch import gin_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args, env=None):
  return subprocess.run([sys.executable, "-m", "benchmarks.run", *args], cwd=REPO,
                        capture_output=True, text=True, env=env, timeout=300)


def test_every_registered_benchmark_loads_under_its_name_with_a_report_and_gin_settings():
  for name, module in registry.MODULES.items():
    benchmark = registry.load(name)
    assert benchmark.name == name and callable(benchmark.write_report)
    assert (benchmark.title and callable(benchmark.tables)) or callable(benchmark.report), name
    assert importlib.import_module(module).BENCHMARK is benchmark
    assert gin.config._REGISTRY.get_match(f"bench.{name}") is not None, name  # gin 0.5.0
  assert set(registry.suites()) & set(registry.MODULES) == set()
  assert "quick" in registry.names() and "_criteo_small" not in registry.names()


@pytest.mark.e2e
def test_an_unknown_name_or_none_is_a_usage_error_listing_the_benchmarks():
  for args in (["nope"], []):
    done = _run(*args)
    assert done.returncode != 0
    assert "fusion" in done.stderr and "quick" in done.stderr, done.stderr
  assert "unknown benchmark 'nope'" in _run("nope").stderr


@pytest.mark.e2e
def test_a_wrong_setting_names_the_binding_before_anything_runs(tmp_path):
  done = _run("tf_versions", f"--results_dir={tmp_path}",
              "--gin_bindings=bench.tf_versions.nope = 1")
  assert done.returncode != 0 and "nope" in done.stderr, done.stderr
  assert not (tmp_path / "tf_versions").exists()


@pytest.mark.e2e
def test_a_benchmark_refuses_to_start_while_the_machine_is_held(tmp_path):
  lock = str(tmp_path / "lock")
  env = {**os.environ, machine.LOCK_ENV: lock}
  with machine.hold("another benchmark", path=lock):
    done = _run("parse_throughput", f"--results_dir={tmp_path}", "--settle_s=0", env=env)
  assert done.returncode != 0 and "the machine is busy" in done.stderr, done.stderr
  assert "another benchmark" in done.stderr
  assert not (tmp_path / "parse_throughput" / "summary.json").exists()


def _part(results, version, name, summary):
  path = results / "tf_versions" / f"tf{version}" / name / "summary.json"
  path.parent.mkdir(parents=True)
  path.write_text(json.dumps(summary))


@pytest.mark.e2e
def test_a_run_writes_summary_report_and_index_and_report_only_rewrites_the_report(tmp_path):
  version = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; "
                            "print(m.version('tensorflow'))"], capture_output=True,
                           text=True, check=True).stdout.strip()
  _part(tmp_path, version, "parse_throughput", {
      "goals": {"parquet_over_tsv_per_core": 0.7},
      "results": {"tsv": {"examples_per_cpu_second": 1000.0}},
      "machine": {"load_avg_1m_before": 0.25, "load_avg_1m_after": 1.0}})
  done = _run("tf_versions", f"--results_dir={tmp_path}",
              "--gin_bindings=bench.tf_versions.rerun = False",
              "--gin_bindings=bench.tf_versions.benchmarks = ['parse_throughput']",
              f"--gin_bindings=bench.tf_versions.pythons = ['{sys.executable}']")
  assert done.returncode == 0, done.stderr
  folder = tmp_path / "tf_versions"
  summary = json.loads((folder / "summary.json").read_text())
  assert summary["versions"] == [version]
  assert summary["benchmarks"]["parse_throughput"][version]["figures"] == {
      "parquet_over_tsv_per_core": 0.7, "tsv examples_per_cpu_second": 1000.0}
  assert summary["command"].startswith("python -m benchmarks.run tf_versions --gin_bindings=")
  report = (folder / "report.md").read_text()
  assert "| parquet_over_tsv_per_core | 0.7 |" in report and summary["command"] in report
  assert "[`tf_versions`](tf_versions/report.md)" in (tmp_path / "README.md").read_text()

  (folder / "report.md").unlink()
  (tmp_path / "README.md").unlink()
  # --noindex (how tf_versions runs its parts): the report again, and no index.
  done = _run("tf_versions", f"--results_dir={tmp_path}", "--report_only", "--noindex")
  assert done.returncode == 0, done.stderr
  assert (folder / "report.md").read_text() == report
  assert not (tmp_path / "README.md").exists()


@pytest.mark.e2e
def test_a_child_part_runs_without_the_lock_or_gin(tmp_path):
  lock = str(tmp_path / "lock")
  with machine.hold("the parent benchmark", path=lock):
    done = subprocess.run(registry.child_command("fusion", {"not": "a spec"}), cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, machine.LOCK_ENV: lock})
  assert done.returncode != 0, done.stderr  # the spec lacks what the part needs
  assert "the machine is busy" not in done.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("binding", ["bench.tf_versions.benchmarks = ['nope']"])
def test_settings_are_checked_by_the_benchmark_that_owns_them(tmp_path, binding):
  done = _run("tf_versions", f"--results_dir={tmp_path}", f"--gin_bindings={binding}")
  assert done.returncode != 0 and "bench.tf_versions.benchmarks" in done.stderr, done.stderr


def test_the_reduced_sizes_tf_versions_runs_name_real_settings_of_each_benchmark():
  from benchmarks import tf_versions  # pylint: disable=g-import-not-at-top
  for name, bindings in tf_versions.BENCHMARKS.items():
    registry.load(name)
    gin.clear_config()
    gin_config.parse_gin([], bindings)
  gin.clear_config()


@pytest.mark.e2e
def test_arms_names_a_suites_arms_only(tmp_path):
  done = _run("quick", f"--results_dir={tmp_path}", "--arms=codistill,nope")
  assert done.returncode != 0 and "has no arm(s) ['nope']; its arms: [" in done.stderr, done.stderr
  both = _run("quick", f"--results_dir={tmp_path}", "--arms=codistill", "--report_only")
  assert both.returncode != 0 and "give one of them" in both.stderr, both.stderr
  measuring = _run("fusion", f"--results_dir={tmp_path}", "--arms=codistill")
  assert measuring.returncode != 0 and "--arms is for suites" in measuring.stderr
  assert not (tmp_path / "quick").exists()


@pytest.mark.e2e
def test_report_only_writes_an_in_progress_summary_from_the_records_so_far(tmp_path):
  settings = {"train_steps": 240, "steps_per_epoch": 40, "stall_timeout_s": 120.0}
  machine.write_json(str(tmp_path / "net_fault_trials" / "trials" / "cut_worker_5s_0.json"), {
      "case": "cut_worker_5s", "seed": 0, "wall_s": 50.0, "ok": True, "finished": True,
      "restarts_used": 0, "hung": False, "recovery_s": 2.0, "steps_during_fault": 10,
      "settings": settings})
  done = _run("net_fault_trials", f"--results_dir={tmp_path}", "--report_only",
              "--gin_bindings=bench.net_fault_trials.cases = ['cut_worker_5s', 'cut_ps_5s']",
              "--gin_bindings=bench.net_fault_trials.trials = 1")
  assert done.returncode == 0, done.stderr
  summary = json.loads((tmp_path / "net_fault_trials" / "summary.json").read_text())
  assert summary["complete"] is False and summary["missing"] == ["cut_ps_5s_0"]
  assert summary["command"].startswith("python -m benchmarks.run net_fault_trials")
  text = (tmp_path / "net_fault_trials" / "report.md").read_text()
  assert "**in progress**: 1 run(s) not recorded yet (cut_ps_5s_0)" in text
  assert "| worker cut off for 5 s, then healed" in text
  nothing = _run("fusion", f"--results_dir={tmp_path}", "--report_only")
  assert nothing.returncode != 0 and "nothing to report" in nothing.stderr, nothing.stderr
