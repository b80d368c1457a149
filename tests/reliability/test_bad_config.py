"""Bad configuration: a one-line error that says what to fix, before any training starts.

Every case runs the real binary (tf-codistill-launch or tf-codistill-train); they run all at
once (each is mostly a TensorFlow import) and each test checks one outcome: exit status 2 (a
configuration error, which the launcher never retries), exactly one ``<binary>: error: ...``
line naming what to change, no traceback, and nothing started (no group, no checkpoint, no
summaries).
"""

import json
import os
import subprocess
import sys

import gin
import pytest

from tf_codistill.launch import gin_config as config

from testing_utils import REPO
from testing_utils import SMALL_BINDINGS
from testing_utils import error_lines
from testing_utils import make_unwritable

PS_TF_CONFIG = json.dumps({"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
                                       "ps": ["127.0.0.1:3"]},
                           "task": {"type": "chief", "index": 0}})

# id -> (binary, extra flags, gin file, extra bindings, environment, expected error text)
CASES = {
    "unknown_gin_binding": (
        "launch", [], "codistill_2way.gin", ["trainer.train.no_such_param = 3"], {},
        "gin configuration error: Configurable 'trainer.train' doesn't have a parameter named "
        "'no_such_param'"),
    "wrong_type": (
        "launch", [], "codistill_2way.gin", ["trainer.train.train_steps = '240'"], {},
        "gin binding trainer.train.train_steps = '240': expected an int, got str; fix it in the "
        "gin file or --gin_bindings"),
    "unknown_flag": (
        "launch", ["--num_group=2"], "codistill_2way.gin", [], {},
        "Unknown command line flag 'num_group'. Did you mean: num_groups ?"),
    "strategy_does_not_match_tf_config": (
        "train", [], "baseline.gin", [], {"TF_CONFIG": PS_TF_CONFIG},
        "strategy='one_device' runs in one process, but TF_CONFIG describes a cluster of 1 chief, "
        "1 worker, 1 ps tasks: use 'multi_worker_mirrored' or 'parameter_server', or unset "
        "TF_CONFIG"),
    "cluster_strategy_without_tf_config": (
        "train", [], "baseline.gin",
        ["tfc.Group.strategy = 'parameter_server'", "tfc.Group.workers_per_group = 1",
         "tfc.Group.ps_per_group = 1"], {},
        "strategy='parameter_server' needs TF_CONFIG with a 'cluster' (and 'task')"),
    "sync_strategy_with_ps_in_tf_config": (
        "train", [], "baseline.gin", ["tfc.Group.strategy = 'multi_worker_mirrored'"],
        {"TF_CONFIG": PS_TF_CONFIG},
        "strategy='multi_worker_mirrored' but TF_CONFIG has ps tasks: use 'parameter_server'"),
    "one_group_with_codistillation_train": (
        "train", ["--group=0", "--num_groups=1", "--exchange_dir={root}/exchange"],
        "codistill_2way.gin", [], {},
        "trainer.train.exchange (codistillation, parameter averaging) needs --num_groups >= 2 "
        "(or unbind trainer.train.exchange)"),
    "negative_group": (
        "train", ["--group=-1", "--num_groups=2"], "codistill_2way.gin", [], {},
        "--group=-1 is out of range for --num_groups=2"),
    "unknown_flag_train": (
        "train", ["--grup=1"], "baseline.gin", [], {}, "Unknown command line flag 'grup'"),
    "one_group_with_codistillation": (
        "launch", ["--num_groups=1"], "codistill_2way.gin", [], {},
        "trainer.train.exchange (codistillation, parameter averaging) needs --num_groups >= 2 "
        "(or unbind trainer.train.exchange)"),
    "groups_not_indices_launch": (
        "launch", ["--groups=one"], "codistill_2way.gin", [], {},
        "--groups=one: give group indices, e.g. --groups=1 or --groups=0,2"),
    "groups_out_of_range_launch": (
        "launch", ["--groups=0,2"], "codistill_2way.gin", [], {},
        "--groups=0,2 is out of range for --num_groups=2"),
    "group_out_of_range": (
        "train", ["--group=2", "--num_groups=2"], "codistill_2way.gin", [], {},
        "--group=2 is out of range for --num_groups=2"),
    "wait_for_first_teachers_under_parameter_server": (
        "launch", ["--workers_per_group=1", "--ps_per_group=1"], "codistill_2way.gin",
        ["tfc.Group.strategy = 'parameter_server'",
         "tfc.Exchange.wait_for_first_teachers_s = 30.0"],
        {}, "tfc.Exchange.wait_for_first_teachers_s cannot hold a ParameterServerStrategy group"),
    "one_group_with_averaging": (
        "launch", ["--num_groups=1"], "baseline.gin",
        ["trainer.train.exchange = @tfc.Exchange", "tfc.Exchange.distill = False",
         "tfc.Exchange.averaging = @tfc.ParameterAveraging()"], {},
        "trainer.train.exchange (codistillation, parameter averaging) needs --num_groups >= 2 "
        "(or unbind trainer.train.exchange)"),
    "averaging_interval_zero": (
        "launch", [], "codistill_2way.gin",
        ["tfc.Exchange.averaging = @tfc.ParameterAveraging()",
         "tfc.ParameterAveraging.every_steps = 0"], {},
        "ParameterAveraging.every_steps=0 must be >= 1"),
    "averaging_unknown_outer_optimizer": (
        "launch", [], "codistill_2way.gin",
        ["tfc.Exchange.averaging = @tfc.ParameterAveraging()",
         "tfc.ParameterAveraging.outer_optimizer = 'adam'"], {},
        "ParameterAveraging.outer_optimizer='adam' is not one of ['nesterov', 'momentum', "
        "'average']"),
    "distillation_temperature_zero": (
        "launch", [], "codistill_2way.gin", ["tfc.Distillation.temperature = 0.0"], {},
        "tfc.Distillation.temperature=0.0 must be > 0"),
    "distillation_setting_by_its_old_name": (
        "launch", [], "codistill_2way.gin", ["trainer.train.alpha = 0.5"], {},
        "trainer.train.alpha is now tfc.Distillation.alpha (the distillation term is "
        "tfc.Distillation's): rename the binding"),
    "exchange_dir_not_writable_launch": (
        "launch", ["--exchange_dir={locked}/exchange"], "codistill_2way.gin", [], {},
        "--exchange_dir: cannot write to {locked}/exchange"),
    "exchange_dir_not_writable_train": (
        "train", ["--group=0", "--num_groups=2", "--exchange_dir={locked}/exchange"],
        "codistill_2way.gin", [], {}, "--exchange_dir: cannot write to {locked}/exchange/group_0"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, criteo_dir):
  """Runs every case's binary at once; {case: (returncode, stderr, model_dir)} (None: skipped)."""
  root = tmp_path_factory.mktemp("bad_config")
  locked = root / "locked"
  locked.mkdir()
  undo = make_unwritable(str(locked))
  procs = {}
  try:
    for case, (binary, flags, gin_file, bindings, env, _) in CASES.items():
      if "{locked}" in " ".join(flags) and undo is None:
        continue
      model_dir = root / case
      args = [sys.executable, "-m", f"tf_codistill.bin.{binary}", f"--model_dir={model_dir}",
              f"--gin_file={REPO}/gin/criteo/{gin_file}"]
      args += [flag.format(locked=locked, root=root) for flag in flags]
      all_bindings = list(SMALL_BINDINGS) + [
          f"tfc.Data.train_files = ['{criteo_dir}/train-*']",
          f"tfc.Data.eval_files = ['{criteo_dir}/eval-*']", *bindings]
      args += [f"--gin_bindings={b}" for b in all_bindings]
      environment = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
      procs[case] = (subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      env={**environment, **env}), model_dir)
    results = {}
    for case, (proc, model_dir) in procs.items():
      _, stderr = proc.communicate(timeout=600)
      results[case] = (proc.returncode, stderr, model_dir)
  finally:
    if undo is not None:
      undo()
  return {case: results.get(case) for case in CASES}, str(locked)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_configuration_is_a_one_line_error_before_training(outcomes, case):
  results, locked = outcomes
  if results[case] is None:
    pytest.skip("cannot make a directory unwritable on this machine")
  code, stderr, model_dir = results[case]
  expected = CASES[case][-1].format(locked=locked)
  assert code == 2, stderr[-3000:]
  lines = error_lines(stderr)
  assert len(lines) == 1 and expected in lines[0], (expected, lines, stderr[-3000:])
  assert "Traceback" not in stderr
  # Nothing started: no group of the launcher, no checkpoint, summaries or heartbeat.
  started = [p for p in ("group_0", "group_1", "tb", "backup", "heartbeat.json")
             if (model_dir / p).exists()]
  assert not started, started


@pytest.mark.parametrize("binding,message", [
    ("tfc.Exchange.distill = 1", "expected a bool (True/False), got int"),
    ("tfc.Data.train_files = 'data/train-*'", "expected a list (str items)"),
    ("models.ctr_model.hidden_units = (32, 'x')", "expected a list (int items)"),
    ("NUM_BUCKETS = 'many'", "criteo.make_dataset.num_buckets = 'many' (through %NUM_BUCKETS)"),
    ("trainer.train.eval_steps = 1.5", "expected an int or None, got float"),
])
def test_gin_values_of_the_wrong_type_are_refused_naming_the_binding(binding, message):
  gin.clear_config()
  try:
    with pytest.raises(config.ConfigError, match=".*".join(map(_escape, message.split("(", 1)))):
      config.parse_gin([os.path.join(REPO, "gin", "criteo", "codistill_2way.gin")], [binding])
  finally:
    gin.clear_config()


def _escape(text):
  import re
  return re.escape(text)


@pytest.mark.parametrize("binding", [
    "trainer.train.learning_rate = 1",  # an int where a float is expected is fine
    "trainer.train.eval_steps = None",
    "trainer.train.learning_rate = @schedules.PiecewiseConstantDecay()",
    "models.ctr_model.hidden_units = [64, 32]",
])
def test_gin_values_of_the_right_type_pass(binding):
  gin.clear_config()
  try:
    config.parse_gin([os.path.join(REPO, "gin", "criteo", "codistill_2way.gin")], [binding])
  finally:
    gin.clear_config()
