"""Launcher pieces: group shapes, ports on 127.0.0.1, task commands, gin, and the launch binary's
flags."""

import glob
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import gin
import pytest

from tf_codistill import layout
from tf_codistill.errors import ConfigurationError
from tf_codistill.launch import gin_config as config
from tf_codistill.launch import launcher
from tf_codistill.training import group as group_lib
from tf_codistill.training import strategies
from tf_codistill.training import train_config

import testing_utils

REPO = testing_utils.REPO


def test_cluster_spec_uses_distinct_free_ports_on_localhost_only():
  spec = launcher.cluster_spec(group_lib.Group("parameter_server", 3, 2))
  assert {k: len(v) for k, v in spec.items()} == {"chief": 1, "worker": 3, "ps": 2}
  addresses = [a for tasks in spec.values() for a in tasks]
  assert all(a.startswith("127.0.0.1:") for a in addresses)
  assert len(set(addresses)) == len(addresses)
  assert launcher.cluster_spec(group_lib.Group("one_device")) == {}


def test_groups_of_one_launch_never_share_a_port():
  taken = set()
  shape = group_lib.Group("parameter_server", 4, 2)
  ports = [int(a.rsplit(":", 1)[1]) for _ in range(20)
           for tasks in launcher.cluster_spec(shape, taken).values() for a in tasks]
  assert len(ports) == 20 * 7 and len(set(ports)) == len(ports) and taken == set(ports)
  # Outside the range the kernel gives outgoing connections, which could take a port first,
  # here and in the fresh network namespace isolated tasks run in (Linux's default range there).
  assert not set(ports) & set(launcher._ephemeral_ports())
  assert set(range(32768, 61000)) <= set(launcher._ephemeral_ports())


def test_a_port_another_process_holds_is_not_given_out(monkeypatch):
  # A TF server binds every interface: a port another process holds on one of them is taken.
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
    held.bind(("", 0))
    port = held.getsockname()[1]
    choices = itertools.chain([port, port], itertools.count(20000))
    monkeypatch.setattr(launcher.random, "choice", lambda candidates: next(choices))
    assert launcher.free_port(set()) != port


def test_every_task_resolves_its_role_from_the_generated_tf_config():
  shape = group_lib.Group("parameter_server", 2, 1)
  spec = launcher.cluster_spec(shape)
  roles = {task: strategies.task_info("parameter_server",
                                      {"cluster": spec,
                                       "task": {"type": task[0], "index": task[1]}})
           for task in shape.tasks()}
  assert [t for t, info in roles.items() if info.is_chief] == [("chief", 0)]
  assert [t for t, info in roles.items() if info.serves_only] == [
      ("worker", 0), ("worker", 1), ("ps", 0)]
  assert {info.num_workers for info in roles.values()} == {2}


def test_train_command_passes_group_exchange_and_gin():
  cmd = launcher.train_command("/m/group_1", 1, 2, "/m/exchange", ["a.gin"], ["x.y = 1"])
  assert cmd[:3] == [sys.executable, "-m", "tf_codistill.bin.train"]
  assert cmd[3:] == ["--model_dir=/m/group_1", "--group=1", "--num_groups=2",
                     "--exchange_dir=/m/exchange", "--gin_file=a.gin", "--gin_bindings=x.y = 1"]


@pytest.mark.parametrize("name,strategy,workers,ps,batch", [
    ("sync_1workers", "multi_worker_mirrored", 0, 0, 512),
    ("sync_2workers", "multi_worker_mirrored", 1, 0, 1024),
    ("sync_4workers", "multi_worker_mirrored", 3, 0, 2048),
    ("async_1workers", "parameter_server", 1, 1, 512),
    ("async_2workers", "parameter_server", 2, 1, 512),
    ("async_4workers", "parameter_server", 4, 2, 512),
    ("codistill_2way_sync", "multi_worker_mirrored", 1, 0, 1024),
    ("codistill_2way_async", "parameter_server", 2, 1, 512),
])
def test_sync_and_async_configs_give_the_group_shape(name, strategy, workers, ps, batch):
  gin.clear_config()
  try:
    config.parse_gin([os.path.join(REPO, "gin", "criteo", f"{name}.gin")])
    assert train_config.TrainConfig().shape == group_lib.Group(strategy, workers, ps)
    assert gin.query_parameter("tfc.Data.batch_size") == batch
    if name.startswith("codistill"):
      assert gin.query_parameter("trainer.train.exchange").selector == "tfc.Exchange"
    else:  # trains alone: the trainer's default
      with pytest.raises(ValueError, match="no value bound for parameter 'exchange'"):
        gin.query_parameter("trainer.train.exchange")
  finally:
    gin.clear_config()


def test_launch_refuses_a_parameter_server_group_without_workers_or_ps(tmp_path):
  with pytest.raises(ConfigurationError, match="needs tfc.Group.workers_per_group >= 1"):
    launcher.launch_groups(str(tmp_path / "m"), 1, shape=group_lib.Group("parameter_server"))
  assert not os.path.exists(tmp_path / "m")


def test_launch_with_impossible_shape_is_a_usage_error_naming_the_flag(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={tmp_path}/m",
       f"--gin_file={REPO}/gin/criteo/async_2workers.gin", "--ps_per_group=0"],
      capture_output=True, text=True, cwd=REPO, timeout=120)
  assert proc.returncode == 2  # a configuration error: one line, exit status 2
  assert ("tfc.Group.strategy='parameter_server' needs tfc.Group.workers_per_group >= 1 and "
          "ps_per_group >= 1 (--workers_per_group, --ps_per_group)") in proc.stderr
  assert not glob.glob(f"{tmp_path}/m/group_*")


def test_pinned_groups_get_disjoint_equal_shares_of_the_cpus():
  assert launcher.split_cpus(2, {0, 1, 2, 3}) == [{0, 1}, {2, 3}]
  assert launcher.split_cpus(2, {4, 5, 6}) == [{4}, {5}]  # the odd CPU is left idle
  assert launcher.split_cpus(1) == [os.sched_getaffinity(0)]
  with pytest.raises(ValueError, match=r"--pin_groups needs a CPU per group: 3 groups, 2 CPUs"):
    launcher.split_cpus(3, {0, 1})


def test_pin_groups_with_fewer_cpus_than_groups_is_a_usage_error(tmp_path):
  groups = len(os.sched_getaffinity(0)) + 1
  proc = subprocess.run(
      [sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={tmp_path}/m",
       f"--gin_file={REPO}/gin/criteo/codistill_2way.gin", f"--num_groups={groups}",
       "--pin_groups"], capture_output=True, text=True, cwd=REPO, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert f"--pin_groups needs a CPU per group: {groups} groups" in proc.stderr
  assert not glob.glob(f"{tmp_path}/m/group_*")


def test_launch_with_only_train_files_bound_is_a_usage_error_naming_the_binding(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={tmp_path}/m",
       f"--gin_file={REPO}/gin/criteo/codistill_2way_async.gin",
       "--gin_bindings=tfc.Data.train_files = ['data/train-*']"],
      capture_output=True, text=True, cwd=REPO, timeout=120)
  assert proc.returncode == 2  # a configuration error: one line, exit status 2
  assert "tfc.Data.train_files is bound but tfc.Data.eval_files is not" in proc.stderr
  assert not glob.glob(f"{tmp_path}/m/group_*")


def test_launch_without_data_trains_on_generated_sample_data(tmp_path):
  model_dir = tmp_path / "m"
  proc = subprocess.run(
      [sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={model_dir}",
       "--num_groups=1", f"--gin_file={REPO}/gin/criteo/baseline.gin",
       "--gin_bindings=trainer.train.train_steps = 20",
       "--gin_bindings=trainer.train.steps_per_epoch = 10",
       "--gin_bindings=trainer.train.eval_steps = 2", "--gin_bindings=NUM_BUCKETS = 1000"],
      capture_output=True, text=True, cwd=REPO, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"generated Criteo-format sample data in {model_dir}/data" in proc.stderr
  assert sorted(os.listdir(model_dir / "data")) == [
      "eval-00000-of-00001.tsv"] + [f"train-{i:05d}-of-00004.tsv" for i in range(4)]
  results = json.loads((model_dir / "group_0" / "results.json").read_text())
  assert results["steps"] == 20
  # What the launcher did, as structured events.
  events = launcher.read_events(str(model_dir))
  assert [(e["event"], e.get("group")) for e in events] == [
      ("network", None), ("launched", 0), ("finished", 0)]
  assert not events[0]["isolated"]  # one process per group: no server to isolate
  assert events[1]["task"] == "chief" and events[1]["index"] == 0 and events[1]["address"] is None
  assert events[1]["log"] == layout.group_run(str(model_dir), 0).task_log("chief", 0)
  assert launcher.task_pids(events) == {(0, "chief", 0): events[1]["pid"]}
  assert events[1]["monotonic"] <= events[2]["monotonic"]


def test_event_log_is_read_back_without_a_line_still_being_written(tmp_path):
  log = launcher.EventLog(layout.launch_events(str(tmp_path)))
  log.write("launched", group=1, task="worker", index=0, pid=11)
  log.write("restarted", group=1, task="worker", index=0, status=-9, scope="task", restart=1,
            max_restarts=3)
  log.write("launched", group=1, task="worker", index=0, pid=12)
  with open(log.path, "a") as f:
    f.write('{"event": "launch')  # a line the launcher is writing right now
  events = launcher.read_events(str(tmp_path))
  assert [e["event"] for e in events] == ["launched", "restarted", "launched"]
  assert events[1]["scope"] == "task" and events[1]["status"] == -9
  assert launcher.task_pids(events) == {(1, "worker", 0): 12}
  assert launcher.read_events(str(tmp_path / "nothing")) == []


def test_servers_on_this_machines_network_only_with_allow_exposed_ports(tmp_path, criteo_dir):
  args = [sys.executable, "-m", "tf_codistill.bin.launch", f"--model_dir={tmp_path}/m",
          f"--gin_file={REPO}/gin/criteo/async_2workers.gin", "--noisolate_network",
          f"--gin_bindings=tfc.Data.train_files = ['{criteo_dir}/train-*']",
          f"--gin_bindings=tfc.Data.eval_files = ['{criteo_dir}/eval-*']"]
  proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]  # a configuration error, before any task
  assert ("tf-codistill-launch: error: isolate_network is off: the tasks' TF servers would listen "
          "on every interface of this machine") in proc.stderr
  assert "--allow_exposed_ports" in proc.stderr
  assert not glob.glob(f"{tmp_path}/m/group_*")


def test_a_negative_stall_timeout_is_refused_naming_the_flag(tmp_path):
  with pytest.raises(ConfigurationError, match=r"--stall_timeout_s=-1 must be >= 0"):
    launcher.launch_groups(str(tmp_path / "m"), 1, stall_timeout_s=-1)
  assert not glob.glob(f"{tmp_path}/m/group_*")


def test_a_time_the_whole_job_was_stopped_is_not_counted_as_a_stall(tmp_path, monkeypatch):
  events = launcher.EventLog(str(tmp_path / "events.jsonl"))
  groups = [types.SimpleNamespace(progress_at=100.0, events=events) for _ in range(2)]
  clock = [1002.0]
  monkeypatch.setattr(launcher.time, "monotonic", lambda: clock[0])
  # A poll on time (or late by the launcher's own work): the stall clocks run on.
  assert launcher._discount_suspension(groups, polled=1000.0, poll_seconds=1.0) == 1002.0
  assert [g.progress_at for g in groups] == [100.0, 100.0]
  # Stopped for 10 minutes (SIGSTOP of the job, then SIGCONT): the groups were stopped with it.
  clock[0] = 1002.0 + 601.0
  assert launcher._discount_suspension(groups, polled=1002.0, poll_seconds=1.0) == 1603.0
  assert [g.progress_at for g in groups] == [700.0, 700.0]
  with open(tmp_path / "events.jsonl") as f:
    (event,) = [json.loads(line) for line in f]
  assert event["event"] == "suspended" and event["seconds"] == 600.0


def test_tasks_that_die_moments_apart_cost_one_restart_of_their_group(tmp_path):
  # A parameter-server group of real processes (sleepers in place of training): its worker dies,
  # then its chief half a second later, as when a machine goes down task by task.
  shape = group_lib.Group(strategy="parameter_server", workers_per_group=2, ps_per_group=1)
  events = launcher.EventLog(layout.launch_events(str(tmp_path)))
  group = launcher._Group(0, 1, shape, str(tmp_path), str(tmp_path / "exchange"), [], [],
                          set(), events)
  group.command = [sys.executable, "-c", "import time; time.sleep(120)"]
  try:
    group.start_all()
    first = dict(group.procs)
    first[("worker", 0)].kill()
    first[("worker", 0)].wait()
    threading.Timer(0.5, first[("chief", 0)].kill).start()
    launcher._supervise(group, max_restarts=3)
    restarts = [e for e in launcher.read_events(str(tmp_path)) if e["event"] == "restarted"]
    # One restart of the whole group, naming the task that died first.
    assert [(e["scope"], e["restart"], e["task"], e["status"]) for e in restarts] == [
        ("group", 1, "worker", -9)], restarts
    assert all(group.procs[t].pid != first[t].pid and group.procs[t].poll() is None
               for t in shape.tasks())
  finally:
    group.stop_all()



def _sleeper_group(tmp_path, code: str, shape=None):
  """A group of real processes running ``code`` (Python) in place of training."""
  shape = shape or group_lib.Group(strategy="one_device", workers_per_group=0, ps_per_group=0)
  events = launcher.EventLog(layout.launch_events(str(tmp_path)))
  group = launcher._Group(0, 1, shape, str(tmp_path), str(tmp_path / "exchange"), [], [],
                          set(), events)
  group.command = [sys.executable, "-c", code]
  return group


def _wait_until(condition, timeout_s: float) -> None:
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert time.monotonic() < deadline, f"not within {timeout_s} s"
    time.sleep(0.05)


def _gone(pid: int) -> bool:
  """Whether ``pid`` has ended (no process, or a zombie nobody reaped yet)."""
  try:
    with open(f"/proc/{pid}/status") as f:
      return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
  except FileNotFoundError:
    return True


def test_a_task_that_dies_as_its_chief_finishes_costs_no_restart(tmp_path):
  # A synchronous worker exits (killed) in its clean-up and the chief ends with status 0 a
  # moment later, inside the settle window: the group finished, neither restarted nor failed.
  shape = group_lib.Group(strategy="multi_worker_mirrored", workers_per_group=1, ps_per_group=0)
  group = _sleeper_group(tmp_path, "import json, os, time; task = json.loads(os.environ["
                         "'TF_CONFIG'])['task']['type']; time.sleep(1.0 if task == 'chief' "
                         "else 120)", shape)
  try:
    group.start_all()
    group.procs[("worker", 0)].kill()
    group.procs[("worker", 0)].wait()
    launcher._supervise(group, max_restarts=0)
    assert not group.failed and group.restarts == 0 and not group.done
    launcher._supervise(group, max_restarts=0)
    assert group.done and not group.failed
    events = [e["event"] for e in launcher.read_events(str(tmp_path))]
    assert "restarted" not in events and "failed" not in events and events[-1] == "finished"
  finally:
    group.stop_all()


def test_a_parameter_server_task_that_ends_while_its_chief_trains_is_restarted(tmp_path):
  # A ps task serves until stopped: one that exits with status 0 while its chief trains left the
  # chief waiting on it (until the stall watchdog, if any). It costs a restart of the group now.
  shape = group_lib.Group(strategy="parameter_server", workers_per_group=1, ps_per_group=1)
  group = _sleeper_group(tmp_path, "import json, os, time; task = json.loads(os.environ["
                         "'TF_CONFIG'])['task']['type']; time.sleep(0.2 if task == 'ps' else 120)",
                         shape)
  try:
    group.start_all()
    first = dict(group.procs)
    first[("ps", 0)].wait()
    launcher._supervise(group, max_restarts=3)
    restarts = [e for e in launcher.read_events(str(tmp_path)) if e["event"] == "restarted"]
    assert [(e["scope"], e["task"], e["status"]) for e in restarts] == [("group", "ps", 0)]
    assert group.procs[("chief", 0)].pid != first[("chief", 0)].pid
  finally:
    group.stop_all()


def test_stopping_a_task_stops_the_children_it_leaves_behind(tmp_path):
  # The task exits on SIGTERM; its child ignores SIGTERM: SIGKILL of the task's process group
  # after the grace period still reaches the child.
  child_pid = tmp_path / "child.pid"
  code = (f"import os, signal, time\n"
          f"if os.fork() == 0:\n"
          f"  signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
          f"  open({str(child_pid)!r}, 'w').write(str(os.getpid()))\n"
          f"  time.sleep(120)\n"
          f"else:\n"
          f"  time.sleep(120)\n")
  proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
  _wait_until(lambda: child_pid.exists() and child_pid.read_text(), 30)
  pid = int(child_pid.read_text())
  launcher.stop_processes([proc], grace=0.5)
  assert proc.poll() is not None
  _wait_until(lambda: _gone(pid), 10)


def _launch_one_task(tmp_path, task: str) -> subprocess.Popen:
  """A launcher process supervising one group of one task (the Python code ``task``), exiting
  128 + the signal that interrupted it."""
  script = (f"import sys\n"
            f"sys.path.insert(0, {REPO!r})\n"
            f"from tf_codistill import layout\n"
            f"from tf_codistill.launch import launcher\n"
            f"from tf_codistill.training import group as group_lib\n"
            f"shape = group_lib.Group('one_device', 0, 0)\n"
            f"events = launcher.EventLog(layout.launch_events({str(tmp_path)!r}))\n"
            f"group = launcher._Group(0, 1, shape, {str(tmp_path)!r}, {str(tmp_path)!r}, [], [],"
            f" set(), events)\n"
            f"group.command = [sys.executable, '-c', {task!r}]\n"
            f"try:\n"
            f"  launcher._run([group], 0, 'stop_all', 0.2)\n"
            f"except launcher.Interrupted as e:\n"
            f"  sys.exit(128 + e.signum)\n")
  return subprocess.Popen([sys.executable, "-c", script], cwd=REPO)


def test_a_second_signal_does_not_cut_the_clean_up_short(tmp_path):
  # The launcher is sent SIGTERM twice, the second while it waits for a task that ignores
  # SIGTERM: it still kills the task, records the interruption, and exits 128 + SIGTERM.
  task_pid = tmp_path / "task.pid"
  task = (f"import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
          f"open({str(task_pid)!r}, 'w').write(str(os.getpid())); time.sleep(120)")
  proc = _launch_one_task(tmp_path, task)
  try:
    _wait_until(lambda: task_pid.exists() and task_pid.read_text(), 60)
    pid = int(task_pid.read_text())
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # the launcher now waits out the task's grace period
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert _gone(pid)
    events = launcher.read_events(str(tmp_path))
    assert {"event": "interrupted", "signal": "SIGTERM"}.items() <= events[-1].items()
  finally:
    proc.kill()


def test_ctrl_z_stops_every_task_with_the_launcher_and_continuing_it_continues_them(tmp_path):
  # Each task runs in a process group of its own, which a terminal's SIGTSTP does not reach: the
  # launcher must stop them itself, or they would train on while it is stopped.
  task_pid, ticks = tmp_path / "task.pid", tmp_path / "ticks"
  task = (f"import os, time\n"
          f"open({str(task_pid)!r}, 'w').write(str(os.getpid()))\n"
          f"n = 0\n"
          f"while True:\n"
          f"  n += 1\n"
          f"  open({str(ticks)!r}, 'w').write(str(n))\n"
          f"  time.sleep(0.05)\n")
  proc = _launch_one_task(tmp_path, task)

  def tick():
    text = ticks.read_text() if ticks.exists() else ""
    return int(text) if text else 0
  try:
    _wait_until(lambda: task_pid.exists() and task_pid.read_text() and tick() > 0, 60)
    pid = int(task_pid.read_text())
    state = testing_utils.process_state
    proc.send_signal(signal.SIGTSTP)
    _wait_until(lambda: state(proc.pid) == "T" and state(pid) == "T", 10)
    stopped_at = tick()
    time.sleep(1.0)
    assert tick() == stopped_at and state(pid) == "T"
    proc.send_signal(signal.SIGCONT)
    _wait_until(lambda: state(pid) != "T" and tick() > stopped_at, 10)
    assert state(proc.pid) != "T"
    proc.send_signal(signal.SIGTERM)  # and it still stops every task at the end
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert _gone(pid)
    # The stop is recorded, and the stall clocks skip it, short as it was (60 s for other stops).
    stops = [e for e in launcher.read_events(str(tmp_path)) if e["event"] == "suspended"]
    assert len(stops) == 1 and stops[0]["signal"] == "SIGTSTP" and stops[0]["seconds"] >= 1.0
  finally:
    proc.kill()
    if task_pid.exists() and task_pid.read_text():
      try:
        os.kill(int(task_pid.read_text()), signal.SIGKILL)
      except ProcessLookupError:
        pass


def test_a_chief_evaluating_or_exporting_between_steps_is_not_taken_for_a_stalled_one(
    tmp_path, monkeypatch):
  group = _sleeper_group(tmp_path, "import time; time.sleep(120)")
  heartbeat = layout.RunDir(group.dir).heartbeat
  os.makedirs(group.dir, exist_ok=True)
  clock = [1000.0]
  monkeypatch.setattr(launcher.time, "monotonic", lambda: clock[0])
  monkeypatch.setattr(launcher.time, "sleep", lambda seconds: None)

  def beat(step, phase, beats):
    with open(heartbeat, "w") as f:
      json.dump({"step": step, "phase": phase, "beats": beats}, f)
  beat(40, "training", 0)
  group.progress_mark, group.progress_at = group.heartbeat(), clock[0]
  # The step stands for 3 stall timeouts, but an evaluation (then the export) pulses.
  for beats, phase in ((1, "evaluating"), (2, "evaluating"), (3, "exporting")):
    clock[0] += 50.0
    beat(40, phase, beats)
    launcher._check_progress(group, stall_timeout_s=60.0, max_restarts=0)
  assert not group.failed
  clock[0] += 61.0  # nothing since: a hang
  launcher._check_progress(group, stall_timeout_s=60.0, max_restarts=0)
  assert "made no progress for 60 s (no step, evaluation or export; at step 40" in group.failed

