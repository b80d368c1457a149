"""Every script in examples/ runs at toy size, one process per group, and really codistills."""

import ast
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from testing_utils import REPO
from testing_utils import require_fashion_mnist
from testing_utils import run

pytestmark = pytest.mark.e2e


def _example(name):
  return os.path.join(REPO, "examples", name)


def _run_groups(args_of_group, timeout=600):
  """Group 1 alone, then group 0, which finds group 1's published versions at its first poll:
  the second run certainly distills from its peer. Returns each group's completed process."""
  done = {}
  for group in (1, 0):
    done[group] = run(args_of_group(group), timeout=timeout)
    assert done[group].returncode == 0, done[group].stderr[-4000:]
  return done


def _write_csv(path, rows, seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(rows, 20))
  y = (x[:, :5].sum(axis=1) + 0.3 * rng.normal(size=rows) > 0).astype(int)
  with open(path, "w") as f:
    for label, features in zip(y, x):
      f.write(",".join([str(label)] + [f"{v:.5f}" for v in features]) + "\n")


def test_own_model_and_data_example_distills_from_its_peer(tmp_path):
  for i in range(2):
    _write_csv(tmp_path / f"train-{i}.csv", 2000, seed=i)
  _write_csv(tmp_path / "eval.csv", 500, seed=9)
  exchange_dir = tmp_path / "exchange"
  done = _run_groups(lambda group: [
      sys.executable, _example("own_model_and_data.py"), f"--group={group}",
      f"--exchange_dir={exchange_dir}", f"--train_files={tmp_path}/train-*.csv",
      f"--eval_files={tmp_path}/eval.csv", "--steps=150", "--steps_per_epoch=50",
      "--publish_every_steps=25", "--batch_size=64"])
  last = {g: ast.literal_eval(re.search(rf"^group {g}: (\{{.*\}})$", done[g].stdout, re.M).group(1))
          for g in (0, 1)}
  # Group 1 ran alone: no teacher. Group 0 distilled from group 1's versions after burn-in.
  assert last[1]["distill_loss"] == 0.0 and last[1]["teacher_staleness"] == -1.0, last[1]
  assert last[0]["distill_loss"] > 0 and last[0]["alpha"] == 1.0, last[0]
  assert last[0]["val_auc"] > 0.8, last[0]
  assert sorted(os.listdir(exchange_dir)) == ["group_0", "group_1"]


def test_fashion_mnist_applications_example_codistills_and_reports_churn(tmp_path):
  require_fashion_mnist()
  exchange_dir = tmp_path / "exchange"
  done = _run_groups(lambda group: [
      sys.executable, _example("fashion_mnist_mobilenet.py"), f"--group={group}",
      f"--exchange_dir={exchange_dir}", "--steps=20", "--batch_size=16",
      "--publish_every_steps=10", "--max_examples=256"])
  for group in (0, 1):
    assert re.search(rf"group {group}: validation accuracy \d\.\d+, exported to ",
                     done[group].stdout)
    assert os.path.exists(tmp_path / f"export_{group}" / "saved_model.pb")
  distill = [float(v) for v in re.findall(r"(?<!val_)distill_loss: ([\d.e+-]+)",
                                           done[0].stdout)]
  assert distill and distill[-1] > 0, done[0].stdout[-2000:]
  churn = re.search(r"group 0: churn against group 1's export: (\{.*\})", done[0].stdout)
  values = ast.literal_eval(churn.group(1))
  assert 0 < values["mean_abs_diff"] < 1 and 0 <= values["disagreement"] <= 1, values


def test_diloco_example_ends_every_group_with_the_same_parameters(tmp_path):
  exchange_dir = tmp_path / "exchange"
  groups = [subprocess.Popen([sys.executable, _example("diloco.py"), f"--group={g}",
                              f"--exchange_dir={exchange_dir}", "--steps=200",
                              "--every_steps=50", "--encoding=int8", "--distill"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for g in (0, 1)]
  said = {}
  for g, process in enumerate(groups):
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-4000:]
    said[g] = re.search(rf"^group {g}: rounds (\d+), bytes sent (\d+), final parameters (\w+)$",
                        stdout, re.M).groups()
  assert said[0][0] == said[1][0] == "4" and int(said[0][1]) > 0
  assert said[0][2] == said[1][2]
  assert sorted(os.listdir(exchange_dir)) == ["averaging", "group_0", "group_1"]
