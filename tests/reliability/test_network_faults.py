"""Network and exchange faults on real local clusters (benchmarks/net_fault_trials): a
parameter server cut off for 30 seconds, a synchronous group's worker for 5, a worker whose
every connection is 200 ms slower each way for the whole run, and the exchange directory of a
2-way codistillation job stalled for 30 seconds. Each finishes its steps within its bound, without
a hang and without a group restart (a synchronous group's coordination service waits
``strategies.make_strategy.heartbeat_timeout_s`` for a silent task, not TF's default, about 20 s
here).

The reduced form (one trial of each, marked ``cluster``); the repeated trials of every case are
``python -m benchmarks.run net_fault_trials``, whose summary is the network table of
docs/reliability.md.
"""

import pytest

from benchmarks import fault_trials
from benchmarks import net_fault_trials
from tf_codistill.testing import faultfs
from tf_codistill.testing import netfaults

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(netfaults.unavailable() is not None,
                                 reason=str(netfaults.unavailable()))]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
  work = tmp_path_factory.mktemp("netfaults")
  fault_trials.ensure_data(str(work / "data"))
  return work


def _trial(work, case, restarts=0):
  record = net_fault_trials.run_trial(case, 0, str(work), str(work / "data"))
  shown = {k: v for k, v in record.items() if k != "stderr_tail"}
  assert not record["hung"], shown
  assert record["finished"] and record["ok"], (shown, record.get("stderr_tail", "")[-3000:])
  assert record["restarts_used"] == restarts, shown
  return record


def test_a_parameter_server_cut_off_for_30_seconds_costs_no_restart(work):
  # gRPC's servers drop a connection unanswered for 20 s (the first request after the heal was
  # reset and the group restarted); tfc.Group.connection_timeout_s (120 s) holds it.
  record = _trial(work, "cut_ps_30s")
  assert record["packets_dropped"] >= 1, record  # the cut was real
  assert record["recovery_s"] is not None, record  # the group stepped again after the heal


def test_a_synchronous_worker_cut_off_for_5_seconds_costs_no_restart(work):
  # TF's default heartbeat timeout (about 20 s here) took it for dead and the group restarted;
  # strategies.make_strategy.heartbeat_timeout_s (120 s) waits for it.
  record = _trial(work, "sync_cut_worker_5s")
  assert record["packets_dropped"] >= 1, record
  assert record["recovery_s"] is not None, record


def test_a_worker_200_ms_away_finishes_through_the_relay(work):
  record = _trial(work, "latency_worker")
  assert record["relayed_connections"] >= 1, record  # its connections went through the delay


@pytest.mark.skipif(faultfs.unavailable() is not None, reason=str(faultfs.unavailable()))
def test_a_stalled_exchange_holds_no_group_for_good(work):
  record = _trial(work, "exchange_stalled_30s")
  assert record["steps_during_fault"] is not None and record["recovery_s"] is not None, record
  assert all(loads >= 1 for loads in record["teacher_loads"].values()), record
