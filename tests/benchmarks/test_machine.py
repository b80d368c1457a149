"""benchmarks/machine.py: one benchmark at a time, refused above nproc load, CPUs handed out."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

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


def test_quiet_waits_as_long_as_it_says_and_no_longer(monkeypatch):
  monkeypatch.setattr(machine, "load_1m", lambda: 5.0)
  monkeypatch.setattr(machine, "cores", lambda: 2)
  waited = []
  monkeypatch.setattr(machine.time, "sleep", waited.append)
  lines = []
  start = time.time()
  assert machine.Quiet(allow_load=True, settle_s=0).settle("run", log=lines.append) == (5.0, True)
  assert not waited and time.time() - start < 1 and "run starts at load 5.00" in lines[0]
  with pytest.raises(machine.MachineLoaded, match="run: .* after waiting 0 s"):
    machine.Quiet(settle_s=0).settle("run")


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


@pytest.mark.exclusive  # measures every process's CPU time: never beside another test
def test_foreign_cpu_share_counts_work_of_other_processes_not_the_benchmarks_own():
  session = machine.Session("b", False, 0.0, machine.cores())
  deadline = time.monotonic() + 1.0
  while time.monotonic() < deadline:  # the benchmark's own work
    pass
  own_only = session.foreign_cpu_share()
  # Another process, not this benchmark's child: started detached and never waited for here.
  other = subprocess.Popen([sys.executable, "-c",
                            "import time\nd = time.monotonic() + 1.5\n"
                            "while time.monotonic() < d: pass"],
                           start_new_session=True)
  time.sleep(1.6)
  busy = session.foreign_cpu_share()
  other.wait()  # after the reading: its time is not the session's own at the reading
  record = session.record()
  assert own_only < 0.45, own_only  # one busy thread of its own would be 0.5 if counted
  assert busy > own_only + 0.1, (own_only, busy)
  assert 0.0 <= record["foreign_cpu_share"] <= 1.0


@pytest.mark.parametrize("load_before, foreign, started_above, others_busy", [
    (0.5, 0.001, False, False), (2.5, 0.001, True, False), (0.5, 0.2, False, True)])
def test_a_figure_is_marked_when_it_started_above_nproc_load_or_others_were_busy(
    monkeypatch, load_before, foreign, started_above, others_busy):
  session = machine.Session("b", False, load_before, 2)
  monkeypatch.setattr(session, "foreign_cpu_share", lambda: foreign)
  record = session.record()
  assert (record["started_above_nproc_load"], record["others_busy"]) == (started_above, others_busy)
  assert record["above_nproc_load"] == (started_above or others_busy)
  assert record["load_avg_1m_before"] == load_before and record["foreign_cpu_share"] == foreign
  assert record["cpu_model"] == machine.cpu_model() and record["cpu_model"] != "unknown"
  assert record["tensorflow"] == tf.__version__


def test_json_is_written_whole_into_a_new_directory(tmp_path):
  path = str(tmp_path / "new" / "summary.json")
  machine.write_json(path, {"b": 1, "a": [1, 2]})
  assert json.load(open(path)) == {"a": [1, 2], "b": 1}
  assert os.listdir(tmp_path / "new") == ["summary.json"]  # no temporary file left
  with pytest.raises(TypeError):
    machine.write_json(path, {"a": object()})
  assert os.listdir(tmp_path / "new") == ["summary.json"]
  assert json.load(open(path)) == {"a": [1, 2], "b": 1}  # the previous summary is intact


def test_the_code_commit_is_this_checkouts_head_and_says_when_files_changed(tmp_path):
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True)
  if head.returncode:
    pytest.skip(f"not a git checkout here: {head.stderr.strip()}")
  changed = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
  assert machine.code_commit() == head.stdout.strip() + ("+changes" if changed else "")
