"""Soak (benchmarks/soak.py): 2-way codistillation on local parameter-server clusters with a
teacher refresh every few seconds; every process's RSS stays flat after warm-up (no leak from
reloading teachers) and plain steps meet soak.STEP_RULE (steps overlapping a refresh, a publish
or an epoch end are counted apart).

The reduced form (150 s of training, marked ``cluster``: memory, refreshes, timelines, pinning) runs with the
other cluster tests; the 20-minute form (``soak``, deselected by default; ``pytest --soak``) is
``python -m benchmarks.soak --duration_s=1200``, whose result is in docs/reliability.md.
"""

import json

import pytest

from benchmarks import soak
from tf_codistill import launcher


def _run(tmp_path, duration_s, warmup_s, rss_tolerance_mib=40.0):
  run = soak.run_soak(str(tmp_path), duration_s, exchange_every_steps=40, poll_interval_s=0.5,
                      sample_s=2.0, warmup_s=warmup_s)
  verdict = soak.judge(run, rss_tolerance_mib=rss_tolerance_mib)
  shown = json.dumps({"verdict": verdict, "groups": run["groups"]}, indent=1)[:6000]
  assert verdict["finished"], run["stderr_tail"]
  # Teachers really were reloaded many times (every few seconds).
  assert min(verdict["refreshes"]) >= 5, shown
  # 7 processes sampled: the launcher and chief, worker, ps of each group.
  assert len(verdict["rss"]) == 7, shown
  assert verdict["rss_flat"], shown
  # Both chiefs wrote their step timelines, one interval per step, with their refresh and
  # publish windows.
  for timeline in run["timelines"].values():
    assert timeline["intervals"] and timeline["windows"]["refresh"], shown
    assert all(steps == 1 for _, _, steps, _ in timeline["intervals"]), shown
    assert timeline["windows"]["publish"], shown
  # Each group ran on its own CPUs.
  shares = launcher.split_cpus(2)
  assert run["group_cpus"] == {str(g): sorted(cpus) for g, cpus in enumerate(shares)}, shown
  return verdict, shown


@pytest.mark.cluster
def test_short_soak_keeps_memory_flat_while_teachers_reload(tmp_path):
  # A chief's RSS climbs for its first ~85 s (first teacher loads and publishes) and then
  # swings +-30 MiB around a plateau as teachers are swapped: warm-up must cover the climb.
  # Over 60 s the medians of the first and last fifth (12 s each) still differ by up to ~36 MiB
  # (the committed 20-minute runs cut to this window), so this form allows 60 MiB: a leak of
  # 1 MiB per teacher load (~60 loads here) still fails it; the 20-minute form keeps 40 MiB.
  # The step-time rule (per-step percentiles) is judged by the 20-minute form on a quiet machine;
  # over 150 s on a CI machine it would be a flaky check.
  _run(tmp_path, duration_s=150, warmup_s=90, rss_tolerance_mib=60.0)


@pytest.mark.soak
def test_twenty_minute_soak(tmp_path):
  verdict, shown = _run(tmp_path, duration_s=1200, warmup_s=180)
  assert verdict["step_times_ok"], shown
