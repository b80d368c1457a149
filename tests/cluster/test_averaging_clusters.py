"""Parameter averaging between MultiWorkerMirrored groups on real local clusters: every worker of
every group holds the same parameters after every round."""

import json
import os
import re

import pytest

from tf_codistill import layout

from testing_utils import Launch
from testing_utils import launch_args

pytestmark = pytest.mark.cluster


def test_multi_worker_mirrored_groups_average_on_every_worker(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  launch = Launch(launch_args(
      model_dir, criteo_dir, "--num_groups=2", "--strategy=multi_worker_mirrored",
      "--workers_per_group=1",
      bindings=["trainer.train.exchange = @tfc.Exchange", "tfc.Exchange.distill = False",
                "trainer.train.train_steps = 160",
                "tfc.Exchange.averaging = @tfc.ParameterAveraging()",
                "tfc.ParameterAveraging.every_steps = 40",
                "tfc.ParameterAveraging.outer_optimizer = 'average'"]))
  assert launch.wait(timeout=480) == 0, launch.stderr[-4000:]
  finals, rounds = set(), {}
  for group in (0, 1):
    group_dir = os.path.join(model_dir, f"group_{group}")
    for task in ("chief_0", "worker_0"):
      log = open(f"{group_dir}/{task}.log").read()
      rounds[(group, task)] = re.findall(r"averaging: round (\d+) at step \d+: members \[0, 1\], "
                                         r"waited [\d.]+s, sent \d+ B, received \d+ B, "
                                         r"parameters (\w+)", log)
      finals.add(re.search(r"final student weights digest \(\w+:\d\): (\w+)", log).group(1))
    with open(layout.RunDir(group_dir).results) as f:
      results = json.load(f)
    assert results["averaging_rounds"]["rounds"] == 4 and results["teacher_groups"] == []
  assert len(set(map(tuple, rounds.values()))) == 1, rounds
  assert [r for r, _ in rounds[(0, "chief_0")]] == ["1", "2", "3", "4"]
  assert len(finals) == 1, finals


def test_parameter_server_groups_average_from_the_coordinator(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "job")
  launch = Launch(launch_args(
      model_dir, criteo_dir, "--num_groups=2", "--strategy=parameter_server",
      "--workers_per_group=1", "--ps_per_group=1",
      bindings=["trainer.train.train_steps = 160",
                "tfc.Exchange.averaging = @tfc.ParameterAveraging()",
                "tfc.ParameterAveraging.every_steps = 40"]))
  assert launch.wait(timeout=600) == 0, launch.stderr[-4000:]
  results = []
  for group in (0, 1):
    with open(layout.RunDir(os.path.join(model_dir, f"group_{group}")).results) as f:
      results.append(json.load(f))
  a, b = (r["averaging_rounds"] for r in results)
  assert a["rounds"] == b["rounds"] == 4 and a["digests"] == b["digests"]
  assert a["rounds_short_of_groups"] == 0
  # The last round ran at the last scheduled step with no step in flight, so both groups' ps
  # tasks end holding the same parameters; the groups also distilled between rounds.
  assert results[0]["weights_digest"] == results[1]["weights_digest"]
  assert results[0]["teacher_loads"] >= 1
