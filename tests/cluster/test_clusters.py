"""Each group a real local TF cluster: sync (MultiWorkerMirrored) and async (ParameterServer)."""

import glob
import json
import os
import re
import signal
import socket

import pytest

import tf_codistill as tfc
from tf_codistill import layout
from tf_codistill.launch import launcher

from testing_utils import TRANSIENT_PS_FAULTS
from testing_utils import Launch
from testing_utils import alive
from testing_utils import launch_args
from testing_utils import progress_steps
from testing_utils import tsv_line
from testing_utils import write_lines

pytestmark = pytest.mark.cluster


def _results(model_dir, group):
  with open(layout.group_run(model_dir, group).results) as f:
    return json.load(f)


def _loaded_peers(log_path):
  with open(log_path) as f:
    return [int(s) for s in re.findall(r"teacher: loaded peer group \d step (\d+)", f.read())]


def test_parameter_server_groups_train_and_distill_from_each_other(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  launch = Launch(launch_args(model_dir, criteo_dir, "--num_groups=2",
                              "--strategy=parameter_server", "--workers_per_group=2",
                              "--ps_per_group=1"))
  assert launch.wait(timeout=420) == 0, launch.stderr[-4000:]
  launch.assert_no_restarts(except_after=TRANSIENT_PS_FAULTS)
  for group in (0, 1):
    group_dir = os.path.join(model_dir, f"group_{group}")
    assert sorted(os.path.basename(p) for p in glob.glob(f"{group_dir}/*.log")) == [
        "chief_0.log", "ps_0.log", "worker_0.log", "worker_1.log"]
    results = _results(model_dir, group)
    assert results["strategy"] == "parameter_server" and results["num_workers"] == 2
    assert results["steps"] == 240
    # The workers' pipelines run where the chief's counter of skipped lines cannot reach.
    assert results["skipped_training_lines_counted"] is False
    assert results["teacher_loads"] >= 1 and _loaded_peers(f"{group_dir}/chief_0.log")
    # The steps run on the workers, and they really used the teacher after burn-in.
    assert results["history"]["distill_loss"][-1] > 0
    worker_log = open(f"{group_dir}/worker_0.log").read()
    assert "serving worker:0 of parameter_server" in worker_log


def test_a_multi_worker_mirrored_group_counts_the_lines_every_worker_skipped(tmp_path,
                                                                            criteo_dir):
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  for name in os.listdir(criteo_dir):
    lines = open(os.path.join(criteo_dir, name)).read().splitlines()
    if name.startswith("train-"):  # two bad lines in each file, early enough to be read
      for number in (100, 2000):
        lines[number - 1] = tsv_line("7", [""] * 13, [""] * 26)
    write_lines(data_dir / name, lines)
  model_dir = str(tmp_path / "job")
  launch = Launch(launch_args(model_dir, str(data_dir), "--num_groups=1",
                              "--strategy=multi_worker_mirrored", "--workers_per_group=1",
                              gin="baseline.gin",
                              bindings=["criteo.make_dataset.bad_lines = 'skip'"]))
  assert launch.wait(timeout=420) == 0, launch.stderr[-4000:]
  results = _results(model_dir, 0)
  # The two workers read disjoint shards: only their sum is every bad line of the 4 files.
  assert results["skipped_lines"] == 8 and results["skipped_training_lines_counted"] is True
  chief_log = open(os.path.join(model_dir, "group_0", "chief_0.log")).read()
  assert "skipped 8 malformed input lines (bad_lines='skip')" in chief_log


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_parameter_server_groups_pinned_to_one_cpu_each_train(tmp_path, criteo_dir):
  # With one CPU a task's TF thread pools have one thread each; the serving tasks still need
  # two inter-op threads (strategies.server_config), or the group hangs after its first step.
  cpus = sorted(os.sched_getaffinity(0))[:2]
  model_dir = str(tmp_path / "job")
  launch = Launch(launch_args(model_dir, criteo_dir, "--num_groups=2", "--pin_groups",
                              "--strategy=parameter_server",
                              "--workers_per_group=1", "--ps_per_group=1",
                              bindings=["trainer.train.save_step_timeline = True",
                                        "trainer.train.train_steps = 160"]),
                  cpus=set(cpus))
  launch.wait_for(lambda: len(launch.pids) == 6, 60, "6 tasks to start")
  pinned = {key: os.sched_getaffinity(pid) for key, pid in launch.pids.items()}
  assert pinned == {(g, t, 0): {cpus[g]} for g in (0, 1) for t in ("chief", "worker", "ps")}
  assert launch.wait(timeout=420) == 0, launch.stderr[-4000:]
  launch.assert_no_restarts(except_after=TRANSIENT_PS_FAULTS)
  events = launch.events()
  restarted = {e["group"] for e in events if e["event"] == "restarted"}
  # The group that finished last loaded its peer's versions (the other may finish first on a
  # busy machine, before its peer's first version is out: no wait holds parameter servers).
  finished = [e["group"] for e in events if e["event"] == "finished"]
  assert sorted(finished) == [0, 1]
  assert _results(model_dir, finished[-1])["teacher_loads"] >= 1
  for group in (0, 1):
    results = _results(model_dir, group)
    assert results["steps"] == 160, results
    # Every step the chief scheduled on its one worker is timed from the previous step's finish
    # to its own: 160 steps, the first 5 (tracing) not counted; 1 epoch end among them.
    with open(layout.group_run(model_dir, group).step_timeline) as f:
      intervals = json.load(f)["intervals"]
    assert all(steps == 1 and end > start for start, end, steps, _ in intervals)
    if group not in restarted:
      assert len(intervals) == 155 and sum(epoch_end for *_, epoch_end in intervals) == 1


def test_multi_worker_mirrored_groups_load_teachers_on_every_worker(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  launch = Launch(launch_args(model_dir, criteo_dir, "--num_groups=2",
                              "--strategy=multi_worker_mirrored", "--workers_per_group=1",
                              bindings=["trainer.train.train_steps = 160"]))
  assert launch.wait(timeout=480) == 0, launch.stderr[-4000:]
  for group in (0, 1):
    group_dir = os.path.join(model_dir, f"group_{group}")
    digests = {}
    for task in ("chief_0", "worker_0"):
      log = open(f"{group_dir}/{task}.log").read()
      assert re.search(rf"teacher: loaded peer group {1 - group} step \d+", log), task
      digest = re.search(r"final student weights digest \(\w+:\d\): (\w+)", log)
      assert digest, (f"group {group} {task} logged no final digest; its log (tail):\n"
                      f"{log[-4000:]}\nlauncher stderr (tail):\n{launch.stderr[-3000:]}")
      digests[task] = digest.group(1)
    # Synchronous replicas end bitwise identical, whatever step each refreshed its teacher at.
    assert len(set(digests.values())) == 1, digests
    results = _results(model_dir, group)
    assert results["weights_digest"] == digests["chief_0"]
    assert results["num_workers"] == 2 and results["steps"] == 160
    assert results["skipped_lines"] == 0 and results["skipped_training_lines_counted"] is True
    # Values every replica shares are reported once per group, not summed over its 2 replicas.
    with open(f"{group_dir}/progress.jsonl") as f:
      records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [80, 160]
    for record in records:
      assert record["alpha"] in (0.0, 1.0), record
      # Negative while the peer runs ahead (its version is from a later step than this group's).
      assert -160 <= record["teacher_staleness"] <= 160, record
    assert records[-1]["alpha"] == 1.0 and records[-1]["teacher_staleness"] >= 0, records
    assert set(results["history"]["alpha"]) <= {0.0, 1.0}, results["history"]


def test_killed_parameter_server_worker_is_rescheduled_and_training_completes(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  # The default fault policy (no --max_restarts): a lost worker must not stop the job.
  launch = Launch(launch_args(model_dir, criteo_dir, "--num_groups=1",
                              "--strategy=parameter_server", "--workers_per_group=2",
                              "--ps_per_group=1", gin="baseline.gin"))
  group_dir = os.path.join(model_dir, "group_0")
  launch.wait_for(lambda: progress_steps(group_dir), 240, "the first epoch")
  worker_log = f"{group_dir}/worker_0.log"
  # The coordinator is held while the worker dies and its replacement starts, so the job cannot
  # end (on worker:1 alone) before the replacement serves: the rejoin is then always exercised.
  chief = launch.pids[(0, "chief", 0)]
  os.kill(chief, signal.SIGSTOP)
  try:
    os.kill(launch.pids[(0, "worker", 0)], signal.SIGKILL)
    launch.wait_for(lambda: open(worker_log).read().count("serving worker:0 of") == 2, 240,
                    "the restarted worker:0 serving")
  finally:
    os.kill(chief, signal.SIGCONT)
  assert launch.wait(timeout=420) == 0, launch.stderr[-4000:]
  # Every scheduled step ran; ClusterCoordinator retries a step the dead worker was running, so
  # one that had already bumped the step counter on the ps task may count (and apply) twice.
  assert 240 <= _results(model_dir, 0)["steps"] <= 241
  assert "group 0: worker:0 exited with signal SIGKILL; restarting it" in launch.stderr
  launch.assert_restart_scopes(["task"])
  chief_log = open(f"{group_dir}/chief_0.log").read()
  assert re.search(r"worker.*(fail|unavailable|Unavailable)", chief_log, re.I)
  # The restarted worker served once, in the log its first run started (appended, not replaced).
  assert open(worker_log).read().count("serving worker:0 of") == 2


# A synchronous group's chief takes the path its worker (the next test) and the other chiefs
# take: the launcher restarts the whole group whichever task died. It runs with --soak (56 s on 2
# cores).
@pytest.mark.parametrize("strategy,extra,victim", [
    ("parameter_server", ["--workers_per_group=1", "--ps_per_group=1"], "chief"),
    ("one_device", [], "chief"),
    pytest.param("multi_worker_mirrored", ["--workers_per_group=1"], "chief",
                 marks=pytest.mark.soak),
])  # a sync group's killed worker: the next test
def test_killed_task_restarts_its_group_from_its_last_checkpoint(tmp_path, criteo_dir, strategy,
                                                                 extra, victim):
  # The default fault policy (no --max_restarts).
  model_dir = str(tmp_path / "job")
  launch = Launch(launch_args(model_dir, criteo_dir, "--num_groups=1", f"--strategy={strategy}",
                              *extra, gin="baseline.gin",
                              bindings=["tfc.Checkpoints.every_steps = 80"]))
  group_dir = os.path.join(model_dir, "group_0")
  launch.wait_for(lambda: tfc.resume_step(group_dir), 240, "the first checkpoint")
  first_pid = launch.pids[(0, victim, 0)]
  os.kill(first_pid, signal.SIGKILL)
  saved = tfc.resume_step(group_dir)  # the newest checkpoint when the task died
  assert launch.wait(timeout=420) == 0, launch.stderr[-4000:]
  assert (f"group 0: {victim}:0 exited with signal SIGKILL; restarting the group from its last "
          "checkpoint (restart 1/3)") in launch.stderr
  restarts = [e for e in launch.events() if e["event"] == "restarted"]
  assert [(e["task"], e["status"], e["scope"]) for e in restarts] == [(victim, -9, "group")]
  assert launch.pids[(0, victim, 0)] != first_pid
  # The restarted group resumed from the newest checkpoint (less than one checkpoint interval
  # of work redone), and its progress log reads as one run: each evaluation once.
  assert _results(model_dir, 0)["steps"] == 240
  assert _results(model_dir, 0)["resumed_from_step"] == saved >= 80
  assert progress_steps(group_dir) == [80, 160, 240]


def test_a_synchronous_group_restarted_after_a_kill_ends_as_if_it_had_not_stopped(tmp_path,
                                                                                  criteo_dir):
  # The restarted group resumes its checkpoint and its input (tfc.Checkpoints.resume_input): the
  # same batches at the same steps, so the uninterrupted run's curve and final weights.
  def args(model_dir):
    return launch_args(model_dir, criteo_dir, "--num_groups=1",
                       "--strategy=multi_worker_mirrored", "--workers_per_group=1",
                       gin="baseline.gin", bindings=["tfc.Checkpoints.every_steps = 80"])
  whole = str(tmp_path / "whole")
  uninterrupted = Launch(args(whole))
  assert uninterrupted.wait(timeout=420) == 0, uninterrupted.stderr[-4000:]
  model_dir = str(tmp_path / "job")
  launch = Launch(args(model_dir))
  group_dir = os.path.join(model_dir, "group_0")
  launch.wait_for(lambda: tfc.resume_step(group_dir), 240, "the first checkpoint")
  os.kill(launch.pids[(0, "worker", 0)], signal.SIGKILL)
  assert launch.wait(timeout=420) == 0, launch.stderr[-4000:]
  assert ("group 0: worker:0 exited with signal SIGKILL; restarting the group from its last "
          "checkpoint (restart 1/3)") in launch.stderr
  restarts = [e for e in launch.events() if e["event"] == "restarted"]
  assert [(e["task"], e["status"], e["scope"]) for e in restarts] == [("worker", -9, "group")]
  restarted, expected = _results(model_dir, 0), _results(whole, 0)
  assert restarted["resumed_from_step"] >= 80 and expected["resumed_from_step"] == 0
  assert progress_steps(group_dir) == progress_steps(os.path.join(whole, "group_0"))
  assert restarted["val_logloss"] == expected["val_logloss"]
  assert restarted["weights_digest"] == expected["weights_digest"]


def test_dead_group_does_not_stop_its_peer_which_reports_growing_staleness(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  launch = Launch(launch_args(model_dir, criteo_dir, "--num_groups=2",
                              "--on_group_failure=continue", "--max_restarts=0",
                              bindings=["trainer.train.train_steps = 480"]))
  launch.wait_for(lambda: glob.glob(f"{model_dir}/exchange/group_1/step_*/COMPLETE"), 240,
           "group 1's first published version")
  launch.wait_for(lambda: _loaded_peers(f"{model_dir}/group_0/chief_0.log"), 120,
           "group 0 loading group 1's version")
  os.kill(launch.pids[(1, "chief", 0)], signal.SIGKILL)
  code = launch.wait(timeout=420)
  assert code == 1 and ("group 1 chief:0 exited with signal SIGKILL; out of restarts "
                        "(--max_restarts=0)") in launch.stderr, launch.stderr
  results = _results(model_dir, 0)
  assert results["steps"] == 480
  last_teacher = results["teacher_steps"][0]
  assert last_teacher < 480 and results["final_teacher_staleness"] == 480 - last_teacher
  history = results["history"]["teacher_staleness"]
  assert history[-1] > history[len(history) // 2] > 0


def test_sigterm_to_the_launcher_stops_every_task_it_started(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  launch = Launch(launch_args(model_dir, criteo_dir, "--num_groups=2",
                              "--strategy=parameter_server", "--workers_per_group=2",
                              "--ps_per_group=1", bindings=["trainer.train.train_steps = 100000"]))
  launch.wait_for(lambda: len(launch.pids) == 8, 60, "8 tasks to start")
  # Interrupt mid-training, while the parameter-server workers and ps tasks serve.
  launch.wait_for(lambda: progress_steps(os.path.join(model_dir, "group_0")), 420,
                  "the first epoch")
  pids = list(launch.pids.values())
  launch.proc.send_signal(signal.SIGTERM)
  assert launch.wait(timeout=60) == 128 + signal.SIGTERM, launch.stderr[-4000:]
  assert "interrupted by SIGTERM: stopped every group" in launch.stderr
  assert not [pid for pid in pids if alive(pid)], pids
  assert launcher.read_events(model_dir)[-1]["event"] == "interrupted"


def _listening_ports(net_tcp_path):
  """Ports in state LISTEN in a /proc/<pid>/net/tcp{,6} table (that process's network)."""
  ports = set()
  for path in (net_tcp_path, net_tcp_path + "6"):
    with open(path) as f:
      for line in f.readlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":
          ports.add(int(local.rsplit(":", 1)[1], 16))
  return ports


def test_a_launchs_servers_listen_only_inside_its_own_network_namespace(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  launch = Launch(launch_args(model_dir, criteo_dir, "--num_groups=2",
                              "--strategy=parameter_server", "--workers_per_group=1",
                              "--ps_per_group=1", bindings=["trainer.train.train_steps = 100000"]))
  launch.wait_for(lambda: progress_steps(os.path.join(model_dir, "group_0")), 240,
                  "the first epoch")
  events = launch.events()
  assert events[0]["event"] == "network" and events[0]["isolated"], events[0]
  tasks = {(e["group"], e["task"], e["index"]): e for e in events if e["event"] == "launched"}
  assert len(tasks) == 6
  host_net = os.readlink("/proc/self/ns/net")
  namespaces = {os.readlink(f"/proc/{e['pid']}/ns/net") for e in tasks.values()}
  assert len(namespaces) == 1 and host_net not in namespaces  # one private namespace, all groups
  pid = next(iter(tasks.values()))["pid"]
  inside, outside = _listening_ports(f"/proc/{pid}/net/tcp"), _listening_ports("/proc/self/net/tcp")
  for key, event in tasks.items():
    port = int(event["address"].rsplit(":", 1)[1])
    assert port in inside, (key, port, inside)  # the server is up, in the launch's namespace
    assert port not in outside, (key, port)
    with pytest.raises(ConnectionRefusedError):
      socket.create_connection(("127.0.0.1", port), timeout=5).close()
  launch.stop()
