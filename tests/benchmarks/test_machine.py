"""benchmarks/machine.py: one benchmark at a time, refused above nproc load, CPUs handed out."""

import os
import threading
import time

import pytest

from benchmarks import machine


def test_a_second_benchmark_is_refused_naming_the_first(tmp_path):
  path = str(tmp_path / "lock")
  with machine.hold("suite A", path=path):
    with pytest.raises(machine.MachineBusy, match=r"suite A \(pid \d+"):
      with machine.hold("suite B", path=path):
        pass
  with machine.hold("suite B", path=path):  # released: B may go now
    pass


def test_the_test_suite_and_a_benchmark_exclude_each_other(tmp_path):
  path = str(tmp_path / "lock")
  with machine.hold("tests", shared=True, path=path):
    with pytest.raises(machine.MachineBusy, match="the test suite holds"):
      with machine.hold("suite A", path=path):
        pass
  with machine.hold("suite A", path=path):
    with pytest.raises(machine.MachineBusy, match="suite A"):
      with machine.hold("tests", shared=True, path=path):
        pass


def test_settle_refuses_above_nproc_load_unless_allowed(monkeypatch):
  monkeypatch.setattr(machine, "load_1m", lambda: 5.0)
  monkeypatch.setattr(machine, "cores", lambda: 2)
  with pytest.raises(machine.MachineLoaded, match="load average is 5.00, above the 2 usable"):
    machine.settle(False, max_wait_s=0.0)
  lines = []
  assert machine.settle(True, max_wait_s=0.0, log=lines.append) == (5.0, True)
  assert "started_above_nproc_load" in lines[0]


def test_settle_waits_for_the_load_to_fall(monkeypatch):
  loads = iter([3.0, 2.5, 1.5])
  monkeypatch.setattr(machine, "load_1m", lambda: next(loads))
  monkeypatch.setattr(machine, "cores", lambda: 2)
  assert machine.settle(False, max_wait_s=10.0, poll_s=0.0) == (1.5, False)


def test_cpu_pool_pins_each_holder_to_cpus_nobody_else_holds():
  cpus = sorted(os.sched_getaffinity(0))
  pool = machine.CpuPool(cpus[:1] * 1)  # one CPU: holders take turns
  seen, order = [], []

  def hold(name):
    with pool.take(1) as taken:
      seen.append((name, sorted(os.sched_getaffinity(0)), taken))
      order.append(("in", name))
      time.sleep(0.05)
      order.append(("out", name))

  threads = [threading.Thread(target=hold, args=(n,)) for n in "ab"]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert [s[1] for s in seen] == [cpus[:1], cpus[:1]]
  assert order[0][0] == "in" and order[1] == ("out", order[0][1])  # never both inside
  assert sorted(os.sched_getaffinity(0)) == cpus  # the caller's affinity is restored
  with pytest.raises(ValueError, match="needs 2 CPUs; this pool has 1"):
    with pool.take(2):
      pass
