"""Suite files: the library settings they bind (unscoped, or in an arm's scope) become the runs'
bindings, checked by gin when the suite is read."""

import dataclasses
import json
import os
from typing import Optional

import gin
import pytest

from benchmarks import registry
from benchmarks import reuse
from benchmarks import suite_spec as spec
from tf_codistill.launch import gin_config

SUITE = """
include 'shared.gin'
bench.Suite.name = 's'
bench.Suite.arms = [@base/bench.Arm(), @codistill/bench.Arm()]
trainer.train.train_steps = 100
base/bench.Arm.name = 'base'
base/tfc.Data.batch_size = %B_STAR
codistill/bench.Arm.name = 'codistill'
codistill/bench.Arm.num_groups = 2
codistill/tfc.Data.batch_size = %TWO_B_STAR
codistill/trainer.train.exchange = @tfc.Exchange
codistill/tfc.Exchange.publish_every_steps = 50
codistill/tfc.Data.split = 'disjoint'
"""


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _suite_file(tmp_path, text=SUITE):
  (tmp_path / "shared.gin").write_text("NUM_BUCKETS = 500\nmodels.ctr_model.hidden_units = (8,)\n")
  path = tmp_path / "s.gin"
  path.write_text(text)
  return str(path)


def test_unscoped_settings_go_to_every_arm_and_scoped_ones_to_their_arm(tmp_path):
  suite = spec.load_suite([_suite_file(tmp_path)])
  assert suite.common_bindings == ["NUM_BUCKETS = 500", "models.ctr_model.hidden_units = (8,)",
                                   "trainer.train.train_steps = 100"]
  base, codistill = suite.arms
  assert (base.scope, base.gin_bindings) == ("base", ["tfc.Data.batch_size = {B*}"])
  assert codistill.gin_bindings == ["tfc.Data.batch_size = {2B*}",
                                    "trainer.train.exchange = @tfc.Exchange",
                                    "tfc.Exchange.publish_every_steps = 50",
                                    "tfc.Data.split = 'disjoint'"]
  # The arm's scope is how it was built, not part of the configuration its runs record.
  assert "scope" not in reuse.arm_config(codistill, suite, [])["arm"]


def test_a_later_binding_replaces_a_setting_where_it_was_first_written(tmp_path):
  suite = spec.load_suite([_suite_file(tmp_path)],
                          ["codistill/tfc.Exchange.publish_every_steps = 10",
                           "trainer.train.train_steps = 7"])
  assert suite.arms[1].gin_bindings[2] == "tfc.Exchange.publish_every_steps = 10"
  assert suite.common_bindings[2] == "trainer.train.train_steps = 7"
  assert len(suite.arms[1].gin_bindings) == 4


def test_settings_in_a_scope_that_builds_no_arm_are_refused_naming_them(tmp_path):
  text = SUITE + "codistil/tfc.Distillation.alpha = 0.5\n"
  with pytest.raises(ValueError, match=r"tfc\.Distillation\.alpha is bound in scope "
                                       r"'codistil', but no arm is built in that scope or "
                                       r"one nested in it \(arms: @base/bench"):
    spec.load_suite([_suite_file(tmp_path, text)])


def test_an_arm_the_suite_does_not_run_may_keep_its_settings(tmp_path):
  text = SUITE + "spare/bench.Arm.name = 'spare'\nspare/tfc.Distillation.alpha = 0.5\n"
  suite = spec.load_suite([_suite_file(tmp_path, text)])
  assert [arm.name for arm in suite.arms] == ["base", "codistill"]


def test_an_arm_nested_in_a_scope_takes_its_settings_and_replaces_them_with_its_own(tmp_path):
  arms = "@codistill/bench.Arm(), @codistill/same/bench.Arm(), @template/h50/bench.Arm()]"
  text = SUITE.replace("@codistill/bench.Arm()]", arms) + """
codistill/same/bench.Arm.name = 'codistill_same'
codistill/same/tfc.Data.split = 'same'
codistill/same/tfc.Distillation.alpha = 0.5
template/tfc.Exchange.publish_every_steps = 500
template/bench.Arm.num_groups = 2
template/h50/bench.Arm.name = 'h50'
template/h50/tfc.Exchange.publish_every_steps = 50
"""
  suite = spec.load_suite([_suite_file(tmp_path, text)])
  codistill, same, h50 = suite.arms[1:]
  # Its parent's settings in their places, its own value replacing the parent's in place, then
  # its own new settings; the Arm fields nest by gin's own scoping.
  assert same.gin_bindings == ["tfc.Data.batch_size = {2B*}",
                               "trainer.train.exchange = @tfc.Exchange",
                               "tfc.Exchange.publish_every_steps = 50",
                               "tfc.Data.split = 'same'", "tfc.Distillation.alpha = 0.5"]
  assert (same.name, same.num_groups, same.scope) == ("codistill_same", 2, "codistill/same")
  assert codistill.gin_bindings[-1] == "tfc.Data.split = 'disjoint'"  # the parent is unchanged
  # A scope that builds no arm itself (a template) configures the arms nested in it.
  assert (h50.gin_bindings, h50.num_groups) == (["tfc.Exchange.publish_every_steps = 50"], 2)


def test_settings_in_a_scope_no_arm_is_built_in_or_nested_in_are_refused(tmp_path):
  text = SUITE + "template/tfc.Distillation.alpha = 0.5\nother/h50/tfc.Distillation.alpha = 0.1\n"
  with pytest.raises(ValueError, match=r"tfc\.Distillation\.alpha is bound in scope 'other/h50'"
                                       r", but no arm is built in that scope or one nested in it"):
    spec.load_suite([_suite_file(tmp_path, text)])


def test_b_star_outside_an_arm_scope_is_refused(tmp_path):
  with pytest.raises(ValueError, match=r"tfc\.Data\.batch_size is bound to %B_STAR or "
                                       r"%TWO_B_STAR outside an arm's scope"):
    spec.load_suite([_suite_file(tmp_path, SUITE + "tfc.Data.batch_size = %B_STAR\n")])


def test_an_include_is_found_where_gin_finds_it_under_gin(tmp_path):
  text = SUITE.replace("include 'shared.gin'", "include 'criteo/common.gin'")
  suite = spec.load_suite([_suite_file(tmp_path, text)])
  with open(os.path.join(gin_config.REPO_GIN_DIR, "criteo", "common.gin")) as f:
    assert "NUM_BUCKETS" in f.read()
  assert any(b.startswith("NUM_BUCKETS = ") for b in suite.common_bindings)


@pytest.mark.parametrize("binding,message", [
    ("codistill/tfc.Distillation.alpah = 1.0", "doesn't have a parameter named 'alpah'"),
    ("codistill/tfc.Distillation.alpha = 'high'",
     r"codistill/tfc\.Distillation\.alpha = 'high': expected a number"),
])
def test_a_wrong_arm_setting_fails_when_the_suite_is_read(tmp_path, binding, message):
  with pytest.raises(gin_config.ConfigError, match=message):
    spec.load_suite([_suite_file(tmp_path, SUITE + binding + "\n")])


def _b_star(suite: spec.Suite, recorded: dict) -> Optional[int]:
  """The suite's B*: given, or the batch its first B* arm's recorded runs used."""
  if suite.b_star is not None:
    return suite.b_star
  for arm in suite.arms:
    if "tfc.Data.batch_size = {B*}" in arm.gin_bindings and arm.name in recorded:
      values = dict(b.split(" = ", 1)
                    for b in reuse.as_current(recorded[arm.name]["arm"]["gin_bindings"]))
      return int(values["tfc.Data.batch_size"])
  return None


def _as_recorded_there(arm: spec.Arm, recorded: dict, b_star: Optional[int]) -> spec.Arm:
  """``arm`` with B* (and 2B*) and the learning rate its recorded runs were resolved to."""
  bindings = [b.replace("{2B*}", str(2 * b_star)).replace("{B*}", str(b_star))
              if b_star is not None else b for b in arm.gin_bindings]
  values = dict(b.split(" = ", 1) for b in reuse.as_current(recorded["arm"]["gin_bindings"]))
  rate = "trainer.train.learning_rate"
  if rate in values and not any(b.startswith(rate) for b in bindings):
    bindings.append(f"{rate} = {values[rate]}")
  return dataclasses.replace(arm, gin_bindings=bindings)


@pytest.mark.parametrize("name", registry.suites())
def test_each_suite_as_written_today_is_the_configuration_its_recorded_runs_used(name):
  """A recorded arm whose configuration no longer matches would be run again, hours of it."""
  suite = spec.load_suite([os.path.join(registry.SUITES_DIR, f"{name}.gin")])
  runs = os.path.join(registry.RESULTS_DIR, suite.name, "runs")
  recorded = {}
  for arm in suite.arms:
    path = os.path.join(runs, arm.name, "config.json")
    if os.path.exists(path):
      with open(path) as f:
        recorded[arm.name] = json.load(f)
  b_star = _b_star(suite, recorded)
  for arm in suite.arms:
    if arm.name in recorded:
      today = reuse.arm_config(_as_recorded_there(arm, recorded[arm.name], b_star), suite,
                               recorded[arm.name]["data"])
      assert reuse.same_config(recorded[arm.name], today), (arm.name, recorded[arm.name], today)
  if name == "english_lm":
    assert b_star == 64 and {"sync_b", "sync_2b", "codistill", "codistill_long"} <= set(recorded)


def test_an_arm_is_named_after_its_scope_unless_it_binds_a_name(tmp_path):
  text = SUITE.replace("base/bench.Arm.name = 'base'\n", "")
  suite = spec.load_suite([_suite_file(tmp_path, text)])
  assert [(arm.name, arm.scope) for arm in suite.arms] == [("base", "base"),
                                                           ("codistill", "codistill")]


def test_a_nested_arm_without_a_name_is_refused_naming_the_binding(tmp_path):
  text = (SUITE.replace("@codistill/bench.Arm()]", "@codistill/same/bench.Arm()]")
          .replace("codistill/bench.Arm.name = 'codistill'\n", ""))
  with pytest.raises(ValueError, match=r"the arm built in scope 'codistill/same' needs a name: "
                                       r"bind codistill/same/bench\.Arm\.name"):
    spec.load_suite([_suite_file(tmp_path, text)])
