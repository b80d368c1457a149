"""Soak (benchmarks/soak.py): 2-way codistillation on local parameter-server clusters with a
teacher refresh every few seconds; every process's RSS stays flat after warm-up (no leak from
reloading teachers) and plain steps meet soak.STEP_RULE (steps overlapping a refresh, a publish
or an epoch end are counted apart).

What the soak guards, memory that does not grow as teachers are reloaded, is checked here on a
real parameter-server cluster in about 30 s: a coordinator loads 100 versions of a peer into
teachers that live on the ps, the way a group's chief does, and neither it nor the ps grows. The
launch form (``soak``, deselected by default; ``pytest --soak``) runs the whole job: a reduced
one (150 s of training: every process's memory, refreshes, timelines, pinning) and the 20-minute
``python -m benchmarks.run soak``, whose result is in docs/reliability.md. The verdicts themselves
are tested on synthetic runs (tests/benchmarks/test_reliability_summaries.py).
"""

import json

import pytest

from benchmarks import soak
from tf_codistill.launch import launcher

from testing_utils import run_ps_coordinator

# A parameter-server group's coordinator (its own process) publishes one version of a CTR model
# (the soak's size), then publishes it again as 100 newer steps (copies of the SavedModel, as
# offline distillation publishes one) and loads each into its teacher on the ps, as the group's
# teacher refresh does. It samples its own and the ps task's RSS after every load past warm-up.
_PS_COORDINATOR = r"""
import os
from testing_utils import activate_all
from tf_codistill.exchange import directory as exchange
from tf_codistill.teachers import pool as teachers
from tf_codistill.training.model import CodistillModel
from tf_codistill.models import ctr

def rss_mib(pid):
  with open(f"/proc/{pid}/status") as f:
    return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

exchange_dir, warmup, loads = args[0], int(args[1]), int(args[2])
make = lambda seed: ctr.ctr_model(num_buckets=1000, embedding_dim=4, hidden_units=(32,), seed=seed)
spec = {"dense": tf.TensorSpec([None, 13], tf.float32),
        "categorical": tf.TensorSpec([None, 26], tf.int64)}
sample = {"dense": tf.zeros([1, 13]), "categorical": tf.zeros([1, 26], tf.int64)}
with strategy.scope():
  model = CodistillModel(make(0), 1)
  model(sample)
source = exchange.publish(make(1), os.path.join(exchange_dir, "source"), 1, 0, spec)
pool = teachers.TeacherPool(exchange_dir, [1], model, spec, [None, 1])
samples, loaded = [], 0
for step in range(1, warmup + loads + 1):
  exchange.publish_saved_model(source, exchange_dir, 1, step, keep_last=2)
  loaded += pool.poll_once()
  activate_all(model, pool)
  if step > warmup:
    samples.append([rss_mib(os.getpid()), rss_mib(ps_pid)])
print(json.dumps({"loaded": loaded, "rejections": pool.rejections, "samples": samples,
                  "teacher_steps": model.teacher_steps.numpy().tolist()}))
"""


@pytest.mark.cluster
def test_teacher_reloads_on_parameter_servers_leave_memory_flat(tmp_path):
  warmup, loads = 40, 100
  report = run_ps_coordinator(_PS_COORDINATOR, tmp_path, warmup, loads)
  assert report["loaded"] == warmup + loads and report["rejections"] == 0, report
  assert report["teacher_steps"] == [warmup + loads]
  # As soak.judge does: the median of the last fifth of the samples against the first fifth's.
  fifth = loads // 5
  for process, series in (("coordinator", 0), ("ps", 1)):
    values = [s[series] for s in report["samples"]]
    first, last = sorted(values[:fifth])[fifth // 2], sorted(values[-fifth:])[fifth // 2]
    # 80 loads apart: a leak of 0.1 MiB per load fails (a check of the teacher's values by eager
    # ops per variable grew the ps by 0.19 MiB per load; teachers.FinitenessCheck by 4 KiB).
    assert last - first < 6, (process, values)


def _run(tmp_path, duration_s, warmup_s, rss_tolerance_mib=40.0):
  run = soak.run_soak(str(tmp_path), duration_s, publish_every_steps=40, poll_interval_s=0.5,
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


@pytest.mark.soak
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
