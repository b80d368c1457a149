"""End to end through the console scripts: 2 groups really exchange SavedModels; failures are loud."""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from data_pipelines import make_criteo_like

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = [
    "NUM_BUCKETS = 1000",
    "models.ctr_model.embedding_dim = 4",
    "models.ctr_model.hidden_units = (32,)",
    "trainer.train.batch_size = 128",
    "trainer.train.train_steps = 240",
    "trainer.train.steps_per_epoch = 80",
    "trainer.train.exchange_every_steps = 40",
    "trainer.train.burn_in_steps = 40",
    "trainer.train.poll_interval_s = 0.2",
    "trainer.train.shuffle_buffer = 1000",
    "trainer.train.verbose = 0",
    "trainer.train.intra_op_threads = 1",
    "trainer.train.inter_op_threads = 1",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("data"))
  make_criteo_like.generate(path, 40_000, num_files=2, seed=0, prefix="train", vocab_size=2000)
  make_criteo_like.generate(path, 4_000, num_files=1, seed=1, prefix="eval", vocab_size=2000)
  return path


def _cli(name):
  return [sys.executable, "-m", f"tf_codistill.bin.{name}"]


def _data_bindings(data_dir, train="train-*"):
  return [f"trainer.train.train_files = ['{data_dir}/{train}']",
          f"trainer.train.eval_files = ['{data_dir}/eval-*']"]


def _launch_args(model_dir, bindings, gin="codistill_2way.gin"):
  args = _cli("launch") + [f"--model_dir={model_dir}", "--num_groups=2",
                           f"--gin_file={REPO}/gin/criteo/{gin}"]
  return args + [f"--gin_bindings={b}" for b in bindings]


def _tb_scalars(logdir):
  tags = {}
  for path in glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        tags.setdefault(value.tag, []).append(event.step)
  return tags


def test_two_groups_load_each_others_published_models(tmp_path, data_dir):
  model_dir = str(tmp_path / "job")
  proc = subprocess.run(_launch_args(model_dir, SMALL + _data_bindings(data_dir)), cwd=REPO,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  for group, peer in ((0, 1), (1, 0)):
    group_dir = os.path.join(model_dir, f"group_{group}")
    with open(os.path.join(group_dir, "results.json")) as f:
      results = json.load(f)
    assert results["steps"] == 240
    assert results["teacher_loads"] >= 1 and results["teacher_rejections"] == 0
    assert results["teacher_steps"][0] >= 40
    log = open(os.path.join(group_dir, "chief_0.log")).read()
    peer_dir = os.path.join(model_dir, "exchange", f"group_{peer}")
    loaded = re.findall(rf"teacher: loaded peer group {peer} step (\d+) from {re.escape(peer_dir)}"
                        rf"/step_\d+", log)
    assert loaded, log[-3000:]
    tags = _tb_scalars(os.path.join(group_dir, "tb"))
    for tag in (f"teacher/group_{peer}_step", "teacher_staleness", "distill_loss", "alpha",
                "task_loss", "examples_per_sec"):
      assert tag in tags, sorted(tags)
    # The exchange keeps only the newest versions, each with a completeness marker.
    versions = sorted(os.listdir(os.path.join(model_dir, "exchange", f"group_{group}")))
    assert versions == ["step_200", "step_240"]
    # Distillation was really on after burn-in.
    history = results["history"]
    assert history["alpha"][-1] == 1.0 and history["distill_loss"][-1] > 0

  churn_json = str(tmp_path / "churn.json")
  proc = subprocess.run(
      _cli("churn") + [f"--saved_model={model_dir}/group_0/export",
                       f"--saved_model={model_dir}/group_1/export",
                       f"--data={data_dir}/eval-*", f"--json_out={churn_json}",
                       f"--gin_file={REPO}/gin/criteo/common.gin", "--gin_bindings=NUM_BUCKETS = 1000"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert "mean over pairs" in proc.stdout
  summary = json.load(open(churn_json))
  assert summary["examples"] == 4000 and 0 < summary["mean_abs_diff"] < 0.5


def test_a_failing_group_fails_the_launcher_with_its_log(tmp_path, data_dir):
  model_dir = str(tmp_path / "job")
  bindings = SMALL + _data_bindings(data_dir, train="no-such-file-*")
  proc = subprocess.run(_launch_args(model_dir, bindings), cwd=REPO, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 1
  assert re.search(r"group \d chief:0 exited with status 1; log .*group_\d/chief_0.log", proc.stderr)
  assert "no-such-file-*" in proc.stderr  # the group's own error, shown from its log


def test_bad_gin_binding_is_a_one_line_error_before_anything_starts(tmp_path):
  proc = subprocess.run(_launch_args(str(tmp_path / "job"), ["trainer.train.no_such_param = 3"]),
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert "no_such_param" in proc.stderr
  assert not os.path.exists(tmp_path / "job" / "group_0")


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def test_ctrl_c_stops_every_group(tmp_path, data_dir):
  model_dir = str(tmp_path / "job")
  long_run = SMALL + _data_bindings(data_dir) + ["trainer.train.train_steps = 100000"]
  proc = subprocess.Popen(_launch_args(model_dir, long_run), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  pids = []
  deadline = time.time() + 120
  while len(pids) < 2 and time.time() < deadline:
    line = proc.stderr.readline()
    pids += [int(p) for p in re.findall(r"launched group \d \w+:\d \(pid (\d+)\)", line)]
  assert len(pids) == 2
  time.sleep(3)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 130, err[-2000:]
  assert "interrupted" in err
  for pid in pids:
    for _ in range(50):
      if not _alive(pid):
        break
      time.sleep(0.1)
    assert not _alive(pid), f"group process {pid} outlived the launcher"
