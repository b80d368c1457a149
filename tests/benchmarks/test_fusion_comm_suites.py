"""The fusion and comm benchmarks' code paths at toy sizes (their full sizes are not run in CI),
and fusion run as users run it (``python -m benchmarks.run fusion``), each group in a child."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import comm as comm_suite
from benchmarks import fusion as fusion_suite
from benchmarks import lean_exchange
from benchmarks import machine
from benchmarks import registry
from benchmarks import standalone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_fusion_suite_measures_every_arm_and_what_each_part_buys(tmp_path):
  modes = ["none", "kernels", "backward", "forward", "grads_only"]
  steps = fusion_suite.measure(["ctr_adam", "lstm_lm_adam"], modes, [False], steps=3, rounds=2,
                               scale=0.01)
  assert len(steps) == 10 and all(s["ms_per_step_best"] > 0 for s in steps.values())
  assert all(len(s["steps_per_sec"]) == 2 for s in steps.values())  # one figure per round
  ratios = fusion_suite.speedups(steps)
  assert set(ratios) == {"ctr_adam/graph", "lstm_lm_adam/graph"}
  ctr = ratios["ctr_adam/graph"]
  assert set(ctr) >= {"kernels", "backward", "forward", "update_share_best",
                      "schedule_backward_over_kernels"}
  low, high = ctr["kernels"]["interval90"]
  assert low <= ctr["kernels"]["paired"] <= high
  goals = fusion_suite._goals(ratios)
  assert set(goals["best_fusion_speedup_by_model"]) == {"ctr_adam", "lstm_lm_adam"}
  assert goals["goals"]["models_with_fusion_speedup"] == sum(
      v >= fusion_suite.GOAL for v in goals["best_fusion_speedup_by_model"].values())
  summary = {"command": "python -m benchmarks.run fusion", "step_time": steps,
             "speedup_unfused_over_fused": ratios, "load_avg_before": [0.1] * 3,
             "load_avg_after": [0.2] * 3, "wall_s": 1.0, "skipped_groups": {},
             "groups": {g: {"load_avg_1min": 0.1, "peak_rss_mb": 1.0} for g in ratios},
             "config": {"rounds": 2, "steps": 3, "scale": 0.01, "tensorflow": "2.17.1",
                        "cpus": 2}, **goals}
  fusion_suite.write_report(summary, str(tmp_path))
  report = (tmp_path / "report.md").read_text()
  assert "| model/jit | kernels | backward | forward | schedule |" in report
  assert "`models_with_fusion_speedup`" in report


def test_comm_bytes_table_compares_allreduce_with_codistillation():
  table = comm_suite.bytes_table(batch_per_worker=8, exchange_every=100, scale=0.01)
  ctr = table["ctr"]
  assert ctr["sparse_gradients"] == 26 and ctr["gradients"] == 26 + 6
  two = ctr["allreduce"]["2"]
  assert two["plain"]["bytes_per_step"] == two["packed"]["bytes_per_step"]
  assert two["float16"]["bytes_per_step"] < two["packed"]["bytes_per_step"]
  reduction = ctr["reduction_at_default_interval"]["2"]["vs_packed_float32_as_sent"]
  assert reduction == pytest.approx(two["packed"]["bytes_per_step"]
                                    / ctr["codistill"]["100"]["bytes_per_step"])


def test_publish_formats_are_measured_on_versions_read_back_and_reported(tmp_path):
  data = standalone.ensure_ctr_data(str(tmp_path / "data"), 4000, eval_rows=100)
  lean = lean_exchange.measure(data, steps=40, batch=32, intervals=[5, 20], num_buckets=500)
  formats = lean["formats"]
  assert set(formats) == set(lean_exchange.FORMATS)
  k5 = {name: f["by_interval"]["5"] for name, f in formats.items()}
  # 8 publishes at K=5: whole-only formats write 8 whole versions; deltas 1 whole + 7 deltas.
  assert len(k5["int8"]["whole_bytes"]) == 8 and not k5["int8"]["delta_bytes"]
  assert len(k5["int8_deltas"]["whole_bytes"]) == 1 and len(k5["int8_deltas"]["delta_bytes"]) == 7
  # Each step narrower: float32 > bfloat16 > int8 bytes per version, deltas below whole ones.
  per_step = {name: f["bytes_per_step"] for name, f in k5.items()}
  assert per_step["float32"] > per_step["bfloat16"] > per_step["int8"] > per_step["int8_deltas"]
  assert per_step["saved_model"] > per_step["float32"]
  assert per_step["int8_deltas"] == pytest.approx(lean_exchange.amortized_bytes_per_step(
      k5["int8_deltas"], 5, 10))
  # Error-bounded deltas (checked against their bound as they were read back) send fewer rows.
  assert per_step["int8_tolerant20_w100"] < per_step["int8_deltas_w100"]
  assert formats["int8_tolerant20_w100"]["row_tolerance"] == 0.2
  table = comm_suite.bytes_table(batch_per_worker=16, exchange_every=100, scale=0.025)
  goals = comm_suite._goals(table, lean)
  assert goals["codistill_traffic_reduction"] is None  # K = 100 was not measured here
  summary = {"command": "python -m benchmarks.run comm", "bytes": table, "goals": goals,
             "goal_verdicts": {}, "cluster_throughput": {}, "publish_formats": lean,
             "load_avg_before": [0.1] * 3, "load_avg_after": [0.2] * 3,
             "config": {"publish_every_steps": 100, "variants": {}, "workers": [2],
                        "batch_per_worker": 16, "tensorflow": "2.17.1",
                        "headline_format": comm_suite.HEADLINE_FORMAT}}
  comm_suite.write_report(summary, str(tmp_path))
  report = (tmp_path / "report.md").read_text()
  assert "## Publish formats (CTR model)" in report and "`int8_deltas` | 10 | 0.0 | 20 |" in report
  assert "| missing | >= 100 | **no** |" in report  # a goal whose value is missing is missed


def test_fusion_runs_each_group_in_a_child_and_writes_summary_and_report(tmp_path):
  env = {**os.environ, machine.LOCK_ENV: str(tmp_path / "lock")}
  settings = ["steps = 2", "rounds = 2", "scale = 0.01", "models = ['mlp_adam']",
              "modes = ['none', 'kernels', 'grads_only']", "jit = [False]"]
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.run", "fusion", f"--results_dir={tmp_path}",
       f"--work_dir={tmp_path / 'work'}", "--allow_load", "--settle_s=0",
       *[f"--gin_bindings=bench.fusion.{s}" for s in settings]],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((tmp_path / "fusion" / "summary.json").read_text())
  assert set(summary["step_time"]) == {f"mlp_adam/graph/{m}" for m in ("none", "kernels",
                                                                       "grads_only")}
  assert summary["groups"]["mlp_adam/graph"]["peak_rss_mb"] > 0  # measured in its own process
  assert set(summary["speedup_unfused_over_fused"]["mlp_adam/graph"]) >= {"kernels",
                                                                          "update_share_paired"}
  assert summary["command"].startswith("python -m benchmarks.run fusion --gin_bindings=")
  assert "machine" in summary and summary["config"]["steps"] == 2
  report = (tmp_path / "fusion" / "report.md").read_text()
  assert "`best_fusion_speedup`" in report and summary["command"] in report


@pytest.mark.parametrize("measure,setting,value", [
    (fusion_suite.measure_fusion, "models", ["ctr_adam", "nope"]),
    (fusion_suite.measure_fusion, "modes", ["fast"]),
    (fusion_suite.measure_fusion, "jit", ["1"]),
    (comm_suite.measure_comm, "lean_intervals", [100, 0]),
])
def test_a_wrong_setting_is_refused_before_anything_is_measured(tmp_path, measure, setting,
                                                                value):
  ctx = registry.Context(name="x", results_dir=str(tmp_path / "results"),
                         work_dir=str(tmp_path / "work"), command="x")
  name = "fusion" if measure is fusion_suite.measure_fusion else "comm"
  with pytest.raises(ValueError, match=f"bench.{name}.{setting}="):
    measure(ctx, **{setting: value})
  assert not (tmp_path / "work").exists()
