"""The slow-link benchmark runs what a user runs on two machines joined by a slow link: a sync
group whose all-reduce crosses the link both ways, and two groups launched apart (--groups)
whose exchange traffic crosses it; what crossed is counted, and the projections use the
recorded steps with the measured seconds per step."""

import dataclasses
import json
import os

import gin
import pytest

from benchmarks import registry
from benchmarks import slow_link
from tf_codistill import layout
from tf_codistill.testing import faultfs
from tf_codistill.testing import netfaults

_UNAVAILABLE = netfaults.unavailable() or faultfs.unavailable()


def test_links_parse_and_a_bad_one_is_named():
  assert slow_link.Link.parse("100mbit_20ms") == slow_link.Link("100mbit_20ms", 12.5e6, 0.02)
  assert slow_link.Link.parse("1gbit_5ms").bytes_per_s == 1.25e8
  assert slow_link.Link.parse("1gbit_5ms").describe() == "1 Gbit/s, 5 ms each way"
  assert slow_link.Link.parse("none").bytes_per_s is None
  with pytest.raises(ValueError, match=r"bench\.slow_link\.links: '100mb' is not"):
    slow_link.Link.parse("100mb")


def test_seconds_per_step_span_the_first_to_the_last_evaluation():
  progress = [{"step": 80, "wall_time_s": 10.0}, {"step": 160, "wall_time_s": 18.0},
              {"step": 240, "wall_time_s": 30.0}]
  assert slow_link.seconds_per_step(progress) == (20.0 / 160, 160)
  with pytest.raises(ValueError, match=r"it has 1: raise bench\.slow_link\.steps"):
    slow_link.seconds_per_step(progress[:1])


def test_projections_take_recorded_steps_times_measured_seconds():
  curves = {"sync_b": [(100, 3.0), (200, 2.5)], "sync_2b": [(100, 2.8), (200, 2.2)],
            "codistill": [(100, 2.6), (200, 2.3)]}
  runs = [{"method": "sync_2b", "link": "100mbit_20ms", "seconds_per_step": 1.8},
          {"method": "codistill", "link": "100mbit_20ms", "seconds_per_step": 0.9},
          {"method": "diloco_h500", "link": "100mbit_20ms", "seconds_per_step": 0.9}]
  projected = slow_link.projections(runs, curves, ["sync_b", "sync_2b"])
  assert projected["target_loss"] == 2.2 and projected["common_loss"] == 2.3
  sync, codistill, diloco = projected["rows"]
  assert (sync["steps_to_target"], sync["hours_to_target"]) == (200, 0.1)
  assert sync["steps_to_common"] == 200
  assert codistill["steps_to_target"] is None and codistill["hours_to_target"] is None
  assert (codistill["steps_to_common"], codistill["hours_to_common"]) == (200, 0.05)
  assert diloco["steps_to_target"] is None and diloco["steps_to_common"] is None


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.mark.skipif(not os.path.isdir(os.path.join(registry.RESULTS_DIR, "english_lm", "runs")),
                    reason="the committed results are not here (Bazel runfiles hold the code)")
def test_the_committed_runs_so_far_are_summarized_without_running_or_building_data(clean_gin):
  # The suite's recorded tuning runs are named with the data paths they read: the work root is
  # the one they were taken under, and nothing may be made there.
  with open(os.path.join(registry.RESULTS_DIR, "english_lm", "runs", "sync_2b",
                         "config.json")) as f:
    tokens = json.load(f)["data"][0].split("'")[1]
  root = tokens.split(f"{os.sep}data{os.sep}")[0]
  existed = os.path.exists(root)
  ctx = registry.Context(name="slow_link",
                         results_dir=os.path.join(registry.RESULTS_DIR, "slow_link"),
                         work_dir=os.path.join(root, "slow_link"), command="test")
  so_far = slow_link.BENCHMARK.recorded(ctx)
  recorded = {f"{r['method']}_{r['link']}" for r in so_far["runs"]}
  assert recorded and so_far["complete"] is False and "codistill_none" in so_far["missing"]
  assert recorded.isdisjoint(so_far["missing"])
  assert len(recorded) + len(so_far["missing"]) == 9  # 3 methods x 3 links by default
  assert [row["method"] for row in so_far["projections"]["rows"]] == [
      r["method"] for r in so_far["runs"]]
  assert os.path.exists(root) == existed


@pytest.mark.e2e
@pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))
def test_sync_and_codistillation_across_a_capped_link(tmp_path, clean_gin):
  ctx = registry.Context(name="slow_link", results_dir=str(tmp_path / "results" / "slow_link"),
                         work_dir=str(tmp_path / "work" / "slow_link"), command="test",
                         progress=lambda line: None)
  summary = slow_link.measure_links(ctx, suite="quick", methods=("baseline", "codistill"),
                                    links=("200mbit_5ms",), steps=75)
  sync, codistill = summary["runs"]
  assert sync["steps_timed"] == codistill["steps_timed"] == 50
  assert sync["seconds_per_step"] > 0 and codistill["seconds_per_step"] > 0
  # The all-reduce crossed the link both ways, in about equal amounts (a 2-worker ring).
  sent, received = sync["link_bytes"]["worker_sent"], sync["link_bytes"]["worker_received"]
  assert sent > 50 * 1000 and received > 50 * 1000, sync
  assert 0.7 < sent / received < 1.4, sync
  assert sync["relayed_connections"] >= 2, sync  # the worker's own, and the chief's to it
  # Group 1 published its versions across the link and read group 0's from across it.
  exchange = os.path.join(ctx.work_dir, "codistill_200mbit_5ms", "exchange")
  assert not os.path.exists(exchange)  # a recorded run's work is removed
  moved = codistill["link_bytes"]
  assert moved["group_1_wrote"] > 0 and moved["group_1_read"] > 0, moved
  assert codistill["link_bytes_per_step"] == pytest.approx(sum(moved.values()) / 75)
  # Nothing is recorded for the quick suite: no projection, said as such.
  assert summary["projections"]["target_loss"] is None
  assert all(r["steps_to_common"] is None for r in summary["projections"]["rows"])
  # A second invocation reuses both recorded runs.
  again = slow_link.measure_links(ctx, suite="quick", methods=("baseline", "codistill"),
                                  links=("200mbit_5ms",), steps=75)
  assert [r["finished_utc"] for r in again["runs"]] == [r["finished_utc"] for r in summary["runs"]]
  slow_link.BENCHMARK.write_report(summary, ctx.results_dir)
  report = open(os.path.join(ctx.results_dir, "report.md")).read()
  assert "200 Mbit/s, 5 ms each way" in report and "never" in report


@pytest.mark.e2e
def test_each_side_runs_only_its_own_group(tmp_path, clean_gin):
  ctx = registry.Context(name="slow_link", results_dir=str(tmp_path / "r" / "slow_link"),
                         work_dir=str(tmp_path / "w" / "slow_link"), command="test",
                         progress=lambda line: None)
  with pytest.raises(ValueError, match=r"bench\.slow_link\.methods: \['bogus'\] are not arms"):
    slow_link.measure_links(ctx, suite="quick", methods=("bogus",), links=("none",), steps=50)
  concrete, _, data = slow_link._suite("quick", str(tmp_path / "r"), str(tmp_path / "w"))
  arm = next(a for a in concrete.arms if a.name == "codistill")
  arm = dataclasses.replace(arm, gin_bindings=[*arm.gin_bindings,
                                               "tfc.Exchange.wait_for_first_teachers_s = 120.0"])
  model_dir = str(tmp_path / "apart")
  record = slow_link.run_method(arm, concrete, slow_link.Link.parse("none"), model_dir, data,
                                steps=50, seed=0)
  assert record["link_bytes"] == {"group_1_read": 0, "group_1_wrote": 0}
  for group in (0, 1):
    machine_dir = os.path.join(model_dir, f"machine_{group}")
    assert sorted(d for d in os.listdir(machine_dir) if d.startswith("group_")) == [
        f"group_{group}"]
    with open(layout.group_run(machine_dir, group).results) as f:
      results = json.load(f)
    assert results["steps"] == 50 and results["teacher_loads"] >= 1, results
