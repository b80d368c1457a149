"""Benchmark runner pieces that need no training: suite validation, steps to target, reuse."""

import dataclasses
import json
import os
import re
import threading
import time

import pytest

from benchmarks import machine
from benchmarks import reuse
from benchmarks import runner
from benchmarks import suite_spec as spec


def test_first_reaching_gives_the_first_evaluation_at_or_below_the_target():
  curve = [{"step": 50, "wall_time_s": 1.0, "val_logloss": 0.50},
           {"step": 100, "wall_time_s": 2.0, "val_logloss": 0.47},
           {"step": 150, "wall_time_s": 3.0, "val_logloss": 0.46}]
  assert runner.first_reaching(curve, 0.47) == (100, 2.0)
  assert runner.first_reaching(curve, 0.40) == (None, None)


@pytest.mark.parametrize("kwargs,message", [
    (dict(arms=[spec.Arm("a"), spec.Arm("a")]), "arm names repeat"),
    (dict(arms=[spec.Arm("e", kind="ensemble", source_arm="b"), spec.Arm("b")]),
     "needs source_arm 'b' among the arms before it"),
    (dict(arms=[spec.Arm("a")], target_from_arm="x"), "target_from_arm='x' is not an arm"),
    (dict(arms=[spec.Arm("a")], data="imagenet"), "data='imagenet' is not one of"),
])
def test_bad_suites_are_refused_with_a_message_naming_the_problem(kwargs, message):
  with pytest.raises(ValueError, match=message):
    spec.Suite(name="s", **kwargs)


def test_bad_arms_are_refused():
  with pytest.raises(ValueError, match="kind='ensemble' needs source_arm"):
    spec.Arm("e", kind="ensemble")
  with pytest.raises(ValueError, match="kind='bagging' is not one of"):
    spec.Arm("e", kind="bagging")


def test_bytes_per_step_counts_versions_and_averaging_changes_of_multi_group_runs():
  codistill = {"num_groups": 2, "steps": 100, "codistill": True, "publish_bytes": 5000}
  both = dict(codistill, averaging_rounds={"bytes_sent": 3000})
  assert runner.bytes_sent_per_step(codistill) == 50
  assert runner.bytes_sent_per_step(both) == 80
  assert runner.bytes_sent_per_step({"num_groups": 2, "steps": 100,
                                     "averaging_rounds": {"bytes_sent": 1000}}) == 10
  assert runner.bytes_sent_per_step({"num_groups": 1, "steps": 100}) is None
  # A codistillation run recorded before versions were counted says nothing.
  assert runner.bytes_sent_per_step(dict(codistill, publish_bytes=None)) is None
  # A run resumed at step 60 counted what its last process sent, over the 40 steps it trained;
  # one resumed at its end trained nothing and says nothing.
  assert runner.bytes_sent_per_step(dict(codistill, resumed_from_step=60)) == 125
  assert runner.bytes_sent_per_step(dict(codistill, resumed_from_step=100)) is None
  # Averaging every 500 of 1500 steps, resumed at 1200: its last part took round 3 alone; the
  # run sent one change of 1000 bytes a round, 3 rounds in 1500 steps, not 1 in 300.
  averaged = {"num_groups": 2, "steps": 1500, "resumed_from_step": 1200,
              "averaging_rounds": {"bytes_sent": 1000, "rounds": 1, "last_round": 3}}
  assert runner.bytes_sent_per_step(averaged) == 2
  assert runner.bytes_sent_per_step(dict(averaged, resumed_from_step=0)) == 1000 / 1500


def test_a_resumed_runs_rate_is_read_from_every_part_of_its_curve():
  curve = [{"step": s, "examples_per_sec": r} for s, r in ((10, 50.0), (20, 60.0), (30, 40.0))]
  assert runner.examples_per_sec({"examples_per_sec": 45.0}, curve) == 45.0
  assert runner.examples_per_sec({"examples_per_sec": 40.0, "resumed_from_step": 20}, curve) == 50
  assert runner.examples_per_sec({"resumed_from_step": 30}, [{"step": 30}]) is None


def _one_arm(tmp_path, seeds):
  """Result paths, an arm "a" of ``seeds`` seeds, its suite, data bindings and configuration."""
  paths = spec.RunPaths(work_dir=str(tmp_path / "work"), results_dir=str(tmp_path / "results"))
  arm = spec.Arm("a", seeds=seeds)
  suite = spec.Suite(name="s", arms=[arm], common_bindings=["trainer.train.train_steps = 10"])
  data = ["tfc.Data.train_files = ['x']"]
  return paths, arm, suite, data, reuse.arm_config(arm, suite, data)


def test_recorded_runs_are_reused_only_while_the_arm_configuration_is_unchanged(tmp_path):
  paths, arm, suite, data, config = _one_arm(tmp_path, seeds=1)
  for path in (paths.result("a", 0, 0), paths.curve("a", 0, 0)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write("{}\n")
  assert not runner._arm_done(arm, paths, config)  # runs without a recorded configuration
  with open(runner._config_path(arm, paths), "w") as f:
    json.dump(config, f)
  assert runner._arm_done(arm, paths, config)
  relabelled = spec.Arm("a", seeds=1, label="new words")
  assert runner._arm_done(relabelled, paths, reuse.arm_config(relabelled, suite, data))
  changed = spec.Suite(name="s", arms=[arm], common_bindings=["trainer.train.train_steps = 20"])
  assert not runner._arm_done(arm, paths, reuse.arm_config(arm, changed, data))
  more_seeds = spec.Arm("a", seeds=2)
  assert not runner._arm_done(more_seeds, paths, reuse.arm_config(more_seeds, suite, data))


def test_an_arm_setting_added_later_leaves_recorded_configurations_and_tuning_folders_as_they_were(
    tmp_path, monkeypatch):
  paths, arm, suite, data, config = _one_arm(tmp_path, seeds=1)
  folder = runner._tuning_arms(arm, suite, data, rates=[0.001])[0.001].name
  # As if Arm had gained ensemble_size after these records: not recorded at its default ...
  monkeypatch.setattr(reuse, "RECORDED_ARM_FIELDS",
                      tuple(f for f in reuse.RECORDED_ARM_FIELDS if f != "ensemble_size"))
  later = reuse.arm_config(arm, suite, data)
  assert "ensemble_size" not in later["arm"] and later["arm"] == {
      k: v for k, v in config["arm"].items() if k != "ensemble_size"}
  # ... and recorded where an arm sets it.
  bigger = spec.Arm("a", seeds=1, ensemble_size=3)
  assert reuse.arm_config(bigger, suite, data)["arm"]["ensemble_size"] == 3
  monkeypatch.undo()
  assert runner._tuning_arms(arm, suite, data, rates=[0.001])[0.001].name == folder
  # The first records predate tune_learning_rate, seed_offset and learning_rate_from: they match
  # an arm that leaves them at their defaults, and no other.
  first = {**config, "arm": {k: v for k, v in config["arm"].items()
                             if k not in ("tune_learning_rate", "seed_offset",
                                          "learning_rate_from")}}
  assert reuse.same_config(first, config) and not reuse.same_config(None, config)
  offset = spec.Arm("a", seeds=1, seed_offset=10)
  assert not reuse.same_config(first, reuse.arm_config(offset, suite, data))
  assert not reuse.same_config({**first, "data": ["other"]}, config)


def test_tuning_runs_recorded_under_other_data_paths_are_named_in_the_error(tmp_path):
  # A suite run with another --work_dir reads its data from other paths, so its runs differ.
  paths = spec.RunPaths(str(tmp_path), str(tmp_path))
  arm = spec.Arm("sync_b", tune_learning_rate=True, gin_bindings=["tfc.Data.batch_size = 512"])
  suite = spec.Suite(name="s", arms=[arm], learning_rates=[0.001], loss_key="val_loss")
  before = ["tfc.Data.train_files = ['/tmp/one/data/train-*']"]
  recorded = runner._tuning_arms(arm, suite, before)[0.001].name
  machine.write_json(os.path.join(tmp_path, "runs", recorded, "config.json"), {"data": before})
  now = ["tfc.Data.train_files = ['/work/two/data/train-*']"]
  with pytest.raises(FileNotFoundError, match=r"is not recorded .*: run the suite; runs of these "
                     r"settings are recorded with the data bindings \[\"tfc.Data.train_files = "
                     r"\['/tmp/one/data/train-\*'\]\"\] .*: pass the --work_dir they were made"):
    runner.tune(arm, suite, paths, data=now, run=lambda arms: None)
  # Under the same data bindings nothing else is suggested.
  with pytest.raises(FileNotFoundError, match=r"run the suite$"):
    runner.tune(arm, suite, paths, data=before, run=lambda arms: None)


def test_tuning_runs_are_named_by_their_settings_and_told_apart_by_a_digest(tmp_path):
  _, _, suite, data, _ = _one_arm(tmp_path, seeds=1)
  at_128 = spec.Arm("a", seeds=1, gin_bindings=["tfc.Data.batch_size = 128"])
  name = runner._tuning_arms(at_128, suite, data, rates=[0.001])[0.001].name
  assert re.fullmatch(r"tuning/batch_size_128-[0-9a-f]{12}/lr_0.001", name), name
  # Another arm of the same configuration (a scaling batch and the arm at B*) shares them ...
  same = spec.Arm("b", seeds=3, gin_bindings=["tfc.Data.batch_size = 128"],
                  tune_learning_rate=True, label="other words")
  assert runner._tuning_arms(same, suite, data, rates=[0.001])[0.001].name == name
  # ... one of other files, or other data, has runs of its own under the same readable name.
  for other_arm, other_data in ((dataclasses.replace(at_128, gin_files=["adult/baseline.gin"]),
                                 data), (at_128, ["tfc.Data.train_files = ['y']"])):
    other = runner._tuning_arms(other_arm, suite, other_data, rates=[0.001])[0.001].name
    assert other.startswith("tuning/batch_size_128-") and other != name
  # Groups and a strategy off their defaults are named; values are kept to safe characters and
  # the readable part to its length.
  config = {"arm": {"gin_bindings": ["trainer.train.exchange = @tfc.Exchange",
                                     "tfc.Exchange.publish_format = 'int8'"],
                    "num_groups": 2, "strategy": "one_device"}}
  assert re.fullmatch(r"exchange_tfc.Exchange\+publish_format_int8\+num_groups_2-[0-9a-f]{12}",
                      reuse.tuning_name(config)), reuse.tuning_name(config)
  long = {"arm": {"gin_bindings": [f"trainer.train.setting_{i} = {i}" for i in range(30)]}}
  readable, digest = reuse.tuning_name(long).rsplit("-", 1)
  assert len(readable) <= 60 and len(digest) == 12
  assert re.fullmatch(r"[0-9a-f]{12}", reuse.tuning_name({"arm": {}}))  # nothing to read
  odd = {"arm": {"gin_bindings": ["include 'dir/../other file.gin'", "x = ['a b', \"c/d\"]"]}}
  assert re.fullmatch(r"[A-Za-z0-9._+-]*\+x_a_b_c_d-[0-9a-f]{12}",  # one safe folder name
                      reuse.tuning_name(odd)), reuse.tuning_name(odd)


def test_a_renamed_gin_setting_keeps_recorded_configurations_and_tuning_folders(tmp_path,
                                                                                monkeypatch):
  paths, _, suite, data, _ = _one_arm(tmp_path, seeds=1)
  before = ["trainer.train.codistill = True", "trainer.train.publish_every_steps = 50",
            "trainer.train.checkpoint_every_steps = 100", "trainer.train.distill_kind = 'xent'"]
  old_data = reuse.as_recorded(data)  # trainer.train.train_files, ...
  assert old_data != data and reuse.as_current(old_data) == data
  with monkeypatch.context() as before_the_rename:  # configurations recorded under the old names
    before_the_rename.setattr(reuse, "RECORDED_BINDING_NAMES", {})
    before_the_rename.setattr(reuse, "RECORDED_BINDINGS", {})
    old = spec.Arm("a", seeds=1, gin_bindings=before)
    config = reuse.arm_config(old, suite, old_data)
    folder = runner._tuning_arms(old, suite, old_data, rates=[0.001])[0.001].name
  now = ["trainer.train.exchange = @tfc.Exchange", "tfc.Exchange.publish_every_steps = 50",
         "tfc.Checkpoints.every_steps = 100", "tfc.Distillation.kind = 'xent'"]
  renamed = spec.Arm("a", seeds=1, gin_bindings=now)
  assert reuse.same_config(config, reuse.arm_config(renamed, suite, data))
  assert reuse.arm_config(renamed, suite, data)["arm"]["gin_bindings"] == now  # recorded so
  assert runner._tuning_arms(renamed, suite, data, rates=[0.001])[0.001].name == folder
  other = spec.Arm("a", seeds=1, gin_bindings=[now[0], "tfc.Exchange.publish_every_steps = 40"])
  assert not reuse.same_config(config, reuse.arm_config(other, suite, data))
  assert reuse.as_recorded(["no binding here"]) == ["no binding here"]
  # An averaging binding recorded without codistillation averaged only: today, three bindings.
  averaged = ["trainer.train.averaging = @tfc.ParameterAveraging()",
              "tfc.ParameterAveraging.every_steps = 50"]
  today = ["trainer.train.exchange = @tfc.Exchange", "tfc.Exchange.distill = False",
           "tfc.Exchange.averaging = @tfc.ParameterAveraging()",
           "tfc.ParameterAveraging.every_steps = 50"]
  assert reuse.as_current(averaged) == today and reuse.as_current(today) == today
  assert reuse.as_recorded(today) == averaged
  both = ["trainer.train.codistill = True", *averaged]  # codistillation and averaging
  assert reuse.as_current(both) == [now[0], *today[2:]]
  assert reuse.as_recorded(reuse.as_current(both)) == both
  # A recorded arm launched again (an ensemble's or offline teacher's source) uses today's name.
  os.makedirs(os.path.dirname(runner._config_path(old, paths)))
  with open(runner._config_path(old, paths), "w") as f:
    json.dump(config, f)
  source = runner._recorded_arm(spec.Arm("e", kind="ensemble", source_arm="a"), paths)
  assert list(source.gin_bindings) == now


def test_a_stopped_arm_resumes_seed_by_seed_and_a_changed_one_starts_over(tmp_path):
  paths, arm, suite, data, config = _one_arm(tmp_path, seeds=3)

  def record(seed, predictions=True):
    paths_ = [paths.result("a", seed, 0), paths.curve("a", seed, 0)]
    if predictions:
      paths_.append(paths.predictions("a", seed, 0))
    for path in paths_:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w") as f:
        f.write("{}\n")

  # Recorded before any configuration was: stale, removed.
  record(0)
  assert runner._seeds_to_run(arm, paths, config) == [0, 1, 2]
  assert not os.path.exists(paths.result("a", 0, 0))
  # Seeds 0 and 1 finished under this configuration, seed 1's predictions are gone (another
  # machine): 1 and 2 run again, 0 is kept.
  record(0)
  record(1, predictions=False)
  assert runner._seeds_to_run(arm, paths, config) == [1, 2]
  assert os.path.exists(paths.result("a", 0, 0))
  assert not runner._arm_done(arm, paths, config)
  record(1)
  record(2)
  assert runner._seeds_to_run(arm, paths, config) == []
  assert not runner._arm_done(arm, paths, config)  # churn not computed yet
  with open(runner._churn_path(arm, paths), "w") as f:
    json.dump({"independent": [{"seeds": [0, 1]}], "expects_curves": False}, f)
  assert runner._arm_done(arm, paths, config)
  # Once the pair's churn is recorded its runs' predictions are no longer needed (a later
  # session on another machine keeps them); seed 2 has no pair of its own.
  for seed in range(3):
    os.remove(paths.predictions("a", seed, 0))
  assert runner._seeds_to_run(arm, paths, config) == []
  changed = spec.Suite(name="s", arms=[arm], common_bindings=["trainer.train.train_steps = 20"])
  assert runner._seeds_to_run(arm, paths, reuse.arm_config(arm, changed, data)) == [0, 1, 2]
  assert not os.path.exists(paths.result("a", 0, 0))


def _checkpoint(directory, step):
  """A real checkpoint of a model whose optimizer has taken ``step`` steps."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras as keras  # pylint: disable=g-import-not-at-top
  optimizer = keras.optimizers.SGD()
  optimizer.iterations.assign(step)
  model = tf.Module()
  model.w = tf.Variable(1.0)
  tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer), directory,
                             max_to_keep=1).save()


def test_a_stopped_run_resumes_from_its_checkpoints_and_records_its_parts(tmp_path):
  paths, arm, suite, data, _ = _one_arm(tmp_path, seeds=1)
  arm = dataclasses.replace(arm, num_groups=2)
  resuming = dataclasses.replace(suite, arms=[arm], resume_every_steps=30)
  config = runner.run_config_digest(arm, resuming, data)
  model_dir = paths.run_dir("a", 0)
  assert runner.stopped_run(arm, resuming, paths, 0, config) == {}  # nothing ran: starts over
  runner._add_part(model_dir, {}, {"load_avg_1m_before": 0.4, "started_above_nproc_load": False,
                                   "config": config})
  _checkpoint(os.path.join(model_dir, "group_0", "backup", "chief"), 60)
  _checkpoint(os.path.join(model_dir, "group_1", "backup", "chief"), 30)
  assert runner.stopped_run(arm, resuming, paths, 0, config) == {0: 60, 1: 30}
  assert runner.stopped_run(arm, suite, paths, 0, config) == {}  # a suite that does not resume
  # A run started under another configuration (e.g. the suite's steps changed) starts over.
  changed = dataclasses.replace(resuming, common_bindings=["trainer.train.train_steps = 20"])
  other = runner.run_config_digest(arm, changed, data)
  assert other != config and runner.stopped_run(arm, changed, paths, 0, other) == {}
  # A setting renamed since the run started (its old name in the suite then) changes nothing;
  # a part recorded under today's names (before digests read the first names) still resumes.
  old_name = dataclasses.replace(arm, gin_bindings=["trainer.train.publish_every_steps = 50"])
  new_name = dataclasses.replace(arm, gin_bindings=["tfc.Exchange.publish_every_steps = 50"])
  assert (runner.run_config_digest(old_name, resuming, data)
          == runner.run_config_digest(new_name, resuming, data))
  legacy = runner.run_config_digest(new_name, resuming, data, names="current")
  assert legacy != runner.run_config_digest(new_name, resuming, data)
  assert runner.stopped_run(arm, resuming, paths, 0, "another", also=[config]) == {0: 60, 1: 30}
  # A run whose parts recorded no configuration (started by a path that records none, or its
  # parts file lost) starts over: any configuration could have made it.
  parts_file = os.path.join(model_dir, runner.PARTS_FILE)
  os.rename(parts_file, parts_file + ".away")
  assert runner.stopped_run(arm, resuming, paths, 0, config) == {}
  os.rename(parts_file + ".away", parts_file)
  # A run whose chief is alive (a runner killed alone leaves its tasks running) is refused.
  heartbeat = os.path.join(model_dir, "group_1", "heartbeat.json")
  with open(heartbeat, "w") as f:
    json.dump({"step": 31, "time": time.time(), "pid": os.getpid()}, f)
  with pytest.raises(RuntimeError, match="a seed 0 is still running"):
    runner.stopped_run(arm, resuming, paths, 0, config)
  with open(heartbeat, "w") as f:  # an old heartbeat: its run is over
    json.dump({"step": 31, "time": time.time() - 3600, "pid": os.getpid()}, f)
  assert runner.stopped_run(arm, resuming, paths, 0, config) == {0: 60, 1: 30}
  assert runner._parts(model_dir) == {}  # one part: recorded as any run
  runner._add_part(model_dir, {0: 60, 1: 30},
                   {"load_avg_1m_before": 1.7, "started_above_nproc_load": False,
                    "config": config})
  parts = runner._parts(model_dir)
  assert [p["from_step"] for p in parts["parts"]] == [{}, {"0": 60, "1": 30}]
  assert parts["load_avg_1m_before"] == 1.7 and not parts["started_above_nproc_load"]
  # The code each part ran: this checkout's commit.
  assert [p["commit"] for p in parts["parts"]] == [machine.code_commit()] * 2
  # A run that starts over forgets the parts of the one before.
  runner._add_part(model_dir, {}, {"load_avg_1m_before": 0.1})
  assert runner._parts(model_dir) == {}


def test_softmax_suites_compare_class_probabilities_for_churn(tmp_path):

  import numpy as np

  suite = spec.Suite(name="s", arms=[spec.Arm("baseline", seeds=2)], loss_key="val_loss",
                     output="softmax")
  paths = spec.RunPaths(str(tmp_path / "work"), str(tmp_path / "results"))
  members = [np.array([[0.7, 0.2, 0.1], [0.2, 0.2, 0.6]]),
             np.array([[0.5, 0.4, 0.1], [0.6, 0.2, 0.2]])]
  for seed, probs in enumerate(members):
    _record_predictions(paths, "baseline", seed, probs)
  churn = runner._churn(suite.arms[0], paths, suite)  # argmax [0, 2] vs [0, 0]
  assert churn["disagreement"]["mean"] == 0.5
  assert churn["mean_abs_diff"]["mean"] == pytest.approx(np.mean(np.abs(members[0] - members[1])))
  with pytest.raises(ValueError, match="output='logits' is not one of"):
    spec.Suite(name="s", arms=[spec.Arm("a")], output="logits")


def _record_predictions(paths, arm, seed, probs):
  import numpy as np
  for path in (paths.result(arm, seed, 0), paths.curve(arm, seed, 0)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write("{}\n")
  os.makedirs(os.path.dirname(paths.predictions(arm, seed, 0)), exist_ok=True)
  np.savez(paths.predictions(arm, seed, 0), probs=probs, labels=np.zeros(len(probs)))


def test_churn_is_recorded_pair_by_pair_across_sessions_without_a_work_dir(tmp_path):
  import numpy as np

  arm = spec.Arm("a", seeds=4)
  suite = spec.Suite(name="s", arms=[arm], output="sigmoid")
  paths = spec.RunPaths(str(tmp_path / "work"), str(tmp_path / "results"))
  probs = {0: [0.2, 0.9], 1: [0.4, 0.9], 2: [0.1, 0.3], 3: [0.1, 0.8]}
  for seed in (0, 1):
    _record_predictions(paths, "a", seed, np.array(probs[seed]))
  assert runner._churn(arm, paths, suite) is None  # pair 2-3 not run yet
  assert not runner._arm_done(arm, paths, runner._recorded_config(arm, paths))
  # The next session runs on another machine: seeds 0-1's predictions are gone.
  os.remove(paths.predictions("a", 0, 0))
  os.remove(paths.predictions("a", 1, 0))
  assert runner._pair_recorded(arm, paths, 0) and not runner._pair_recorded(arm, paths, 2)
  for seed in (2, 3):
    _record_predictions(paths, "a", seed, np.array(probs[seed]))
  churn = runner._churn(arm, paths, suite)
  assert [p["seeds"] for p in churn["independent"]] == [[0, 1], [2, 3]]
  assert [p["seeds"] for p in churn["pairs"]] == [[0, 1], [2, 3]]  # never together: no 0-2
  assert churn["independent"][0]["mean_abs_diff"] == pytest.approx(0.1)
  assert churn["independent"][1]["disagreement"] == 0.5
  assert churn["mean_abs_diff"]["mean"] == pytest.approx((0.1 + 0.25) / 2)


def test_churn_pairs_name_the_pairs_so_a_recorded_seed_elsewhere_is_not_trained_again(tmp_path):
  import numpy as np

  arm = spec.Arm("a", seeds=3, seed_offset=10, churn_pairs=[(12, 11)])
  suite = spec.Suite(name="s", arms=[arm], output="sigmoid")
  paths = spec.RunPaths(str(tmp_path / "work"), str(tmp_path / "results"))
  config = reuse.arm_config(arm, suite, [])
  assert config == reuse.arm_config(dataclasses.replace(arm, churn_pairs=()), suite, [])
  runner._seeds_to_run(arm, paths, config)  # records the configuration
  _record_predictions(paths, "a", 10, np.array([0.2, 0.9]))
  os.remove(paths.predictions("a", 10, 0))  # recorded on a machine that is gone
  # By default seed 10 pairs with 11 and would train again for their churn; here it has no pair.
  default = dataclasses.replace(arm, churn_pairs=())
  assert runner._seeds_to_run(default, paths, config) == [10, 11, 12]
  assert runner._seeds_to_run(arm, paths, config) == [11, 12]
  for seed, probs in ((11, [0.4, 0.9]), (12, [0.1, 0.3])):
    _record_predictions(paths, "a", seed, np.array(probs))
  churn = runner._churn(arm, paths, suite)
  assert [p["seeds"] for p in churn["independent"]] == [[11, 12]]
  assert churn["independent"][0]["mean_abs_diff"] == pytest.approx(0.45)
  assert runner._arm_done(arm, paths, config)
  with pytest.raises(ValueError, match=r"churn_pairs entry \(11, 13\) must be two different "
                                       r"seeds of \[10, 11, 12\]"):
    spec.Arm("a", seeds=3, seed_offset=10, churn_pairs=[(11, 13)])


def test_a_corpus_groups_tokens_are_held_against_its_share(tmp_path):
  corpus_dir = tmp_path / "data" / "debian_english"
  corpus_dir.mkdir(parents=True)
  files = [{"file": f"train-{i:05d}-of-00004.tfrecord", "tokens": t, "documents": 1}
           for i, t in enumerate([100, 200, 300, 400])]
  manifest = {"settings": {}, "packages": [], "splits": {"train": {"files": files}}}
  (corpus_dir / "manifest.json").write_text(json.dumps(manifest))
  suite = spec.Suite(name="s", arms=[spec.Arm("a")], data="debian_english")
  paths = spec.RunPaths(str(tmp_path / "work"), str(tmp_path / "results"),
                        data_dir=str(tmp_path / "data"))
  group1 = {"group": 1, "num_groups": 2, "data_split": "disjoint", "train_targets": 700}
  from data_pipelines import corpus  # pylint: disable=g-import-not-at-top
  built = corpus.fingerprint(manifest)
  assert runner._data_use(suite, paths, group1) == {"share_tokens": 600, "repeated_tokens": 100,
                                                    "corpus_fingerprint": built}
  same = {"group": 1, "num_groups": 2, "data_split": "same", "train_targets": 700}
  assert runner._data_use(suite, paths, same) == {"share_tokens": 1000, "repeated_tokens": 0,
                                                  "corpus_fingerprint": built}
  other = spec.Suite(name="s", arms=[spec.Arm("a")])
  assert runner._data_use(other, paths, group1) == {}


def test_a_given_b_star_replaces_the_batch_placeholders(tmp_path):
  arm = spec.Arm("codistill", gin_bindings=["tfc.Data.batch_size = {B*}",
                                            "x.y = {2B*}"])
  paths = spec.RunPaths(str(tmp_path), str(tmp_path))
  suite = spec.Suite(name="s", arms=[arm], b_star=64)
  concrete, record = runner.prepare(suite, paths, data=[])
  assert list(concrete.arms[0].gin_bindings) == ["tfc.Data.batch_size = 64", "x.y = 128"]
  assert record["scaling"] == {"b_star": 64, "given": True}
  with pytest.raises(ValueError, match=r"binds %B_STAR or %TWO_B_STAR \(its batch, \{B\*\}\) "
                                       r"but the suite has no scaling phase"):
    runner.prepare(spec.Suite(name="s", arms=[arm]), paths, data=[])
  with pytest.raises(ValueError, match="b_star is given and found"):
    spec.Suite(name="s", arms=[arm], b_star=64, scaling_arm=spec.Arm("sync"),
               scaling_batches=[1, 2], learning_rates=[0.1])


def test_runs_on_another_build_of_the_corpus_are_refused(tmp_path):
  from data_pipelines import corpus  # pylint: disable=g-import-not-at-top
  corpus_dir = tmp_path / "data" / "debian_english"
  corpus_dir.mkdir(parents=True)
  manifest = {"settings": {"vocab_size": 8192},
              "packages": [{"package": "fortunes", "version": "1:1.99.1-7.3", "sha256": "ab"}],
              "splits": {"train": {"files": []}}}
  (corpus_dir / "manifest.json").write_text(json.dumps(manifest))
  suite = spec.Suite(name="s", arms=[spec.Arm("a")], data="debian_english")
  paths = spec.RunPaths(str(tmp_path / "work"), str(tmp_path / "results"),
                        data_dir=str(tmp_path / "data"))
  run = tmp_path / "results" / "runs" / "a" / "seed_0_group_0.json"
  run.parent.mkdir(parents=True)
  run.write_text(json.dumps({"corpus_fingerprint": corpus.fingerprint(manifest)}))
  runner.check_same_corpus(suite, paths)  # the same build: fine
  manifest["packages"][0]["version"] = "1:1.99.1-8"
  (corpus_dir / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match=r"seed_0_group_0.json was trained on corpus [0-9a-f]{16}, "
                                       r"but .* \(fortunes 1:1.99.1-8\): a package changed"):
    runner.check_same_corpus(suite, paths)


def _fake_tuning(paths, best_by_rate, ran):
  """A RunFn that records, for each tuning arm, a curve whose best loss depends on its rate."""

  def run(arms):
    for arm in arms:
      rate = float(arm.name.rsplit("lr_", 1)[1])
      ran.append(arm.name)
      path = paths.curve(arm.name, arm.seed_offset, 0)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w") as f:
        for step, loss in [(10, 9.0), (20, best_by_rate(rate))]:
          f.write(json.dumps({"step": step, "val_loss": loss}) + "\n")

  return run


def test_a_grid_whose_largest_rate_wins_grows_by_doubling_it(tmp_path):
  paths = spec.RunPaths(str(tmp_path), str(tmp_path))
  arm = spec.Arm("sync_b", tune_learning_rate=True)
  suite = spec.Suite(name="s", arms=[arm], learning_rates=[0.001, 0.002], extend_grid=2,
                     loss_key="val_loss")
  ran = []
  # The loss falls up to a rate of 0.004, then rises: 0.004 is chosen after one extension.
  tuned, choice = runner.tune(arm, suite, paths, data=[],
                              run=_fake_tuning(paths, lambda lr: abs(lr - 0.004), ran))
  assert choice["learning_rate"] == 0.004 and set(choice["grid"]) == {"0.001", "0.002", "0.004",
                                                                      "0.008"}
  assert tuned.gin_bindings[-1] == "trainer.train.learning_rate = 0.004"
  # Report from the recorded runs (no run function): the same choice, nothing trained.
  assert runner.tune(arm, suite, paths, data=[])[1]["learning_rate"] == 0.004
  # At most extend_grid times: a loss that keeps falling stops at 0.008.
  suite = spec.Suite(name="s2", arms=[arm], learning_rates=[0.001, 0.002], extend_grid=2,
                     loss_key="val_loss", common_bindings=["x = 1"])
  _, choice = runner.tune(arm, suite, paths, data=[], run=_fake_tuning(paths, lambda lr: -lr, []))
  assert choice["learning_rate"] == 0.008 and len(choice["grid"]) == 4
  # Without extend_grid the grid stays as declared.
  suite = spec.Suite(name="s3", arms=[arm], learning_rates=[0.001, 0.002], loss_key="val_loss",
                     common_bindings=["x = 2"])
  _, choice = runner.tune(arm, suite, paths, data=[], run=_fake_tuning(paths, lambda lr: -lr, []))
  assert choice["learning_rate"] == 0.002 and len(choice["grid"]) == 2


def test_pinned_scaling_grows_each_batch_grid_without_waiting_for_the_others(tmp_path):
  paths = spec.RunPaths(str(tmp_path), str(tmp_path))
  suite = spec.Suite(name="s", arms=[spec.Arm("a")], scaling_arm=spec.Arm("sync"),
                     scaling_batches=[1, 2], learning_rates=[0.001, 0.002], extend_grid=1,
                     loss_key="val_loss", pin_runs=True)
  grown = threading.Event()
  ran = []
  record = _fake_tuning(paths, lambda lr: -lr, ran)  # the largest rate always wins

  def run(arms):
    for arm in arms:
      if "lr_0.004" in arm.name:
        grown.set()
      elif "tfc.Data.batch_size = 2" in arm.gin_bindings:
        # Batch 2's base grid waits until batch 1's grid has grown: it must not wait for batch 2.
        assert grown.wait(timeout=30), "one batch's grid waited for the other batch's runs"
      record([arm])

  scaled = runner.scaling(suite, paths, data=[], run=run)
  assert grown.is_set() and len(set(ran)) == 6  # (recorded runs are asked for again: reused)
  assert {b: c["learning_rate"] for b, c in scaled["batches"].items()} == {"1": 0.004, "2": 0.004}


def test_tuning_ahead_runs_the_next_rate_beside_each_round_and_chooses_the_same(tmp_path):
  paths = spec.RunPaths(str(tmp_path), str(tmp_path))
  arm = spec.Arm("sync_b", tune_learning_rate=True)
  calls = []

  def suite(name, ahead):
    return spec.Suite(name=name, arms=[arm], learning_rates=[0.001, 0.002], extend_grid=2,
                      loss_key="val_loss", tune_ahead=ahead, common_bindings=[f"x = '{name}'"])

  def tuned(name, ahead, best):
    ran = []
    fake = _fake_tuning(paths, lambda lr: abs(lr - best), ran)
    _, choice = runner.tune(arm, suite(name, ahead), paths, data=[],
                            run=lambda arms: (calls.append(len(arms)), fake(arms)))
    return choice, {name.rsplit("lr_", 1)[1] for name in ran}

  calls.clear()
  ahead, ran = tuned("a", True, 0.004)
  assert calls[0] == 3 and ran == {"0.001", "0.002", "0.004", "0.008"}  # the first round: 3 rates
  assert ahead["grid"].keys() == tuned("b", False, 0.004)[0]["grid"].keys()
  assert ahead["learning_rate"] == 0.004
  # The smallest rate wins at once: the rate run ahead is recorded, not in the grid.
  ahead, ran = tuned("c", True, 0.001)
  assert ahead["learning_rate"] == 0.001 and set(ahead["grid"]) == {"0.001", "0.002"}
  assert ran == {"0.001", "0.002", "0.004"}


def test_a_suite_pinned_to_a_tensorflow_version_refuses_another(tmp_path):
  have = runner.machine.tensorflow_version()
  runner.check_tensorflow(spec.Suite(name="s", arms=[spec.Arm("a")], tensorflow=have))
  runner.check_tensorflow(spec.Suite(name="s", arms=[spec.Arm("a")]))  # not pinned
  pinned = spec.Suite(name="s", arms=[spec.Arm("a")], tensorflow="2.0.0")
  paths = spec.RunPaths(str(tmp_path / "work"), str(tmp_path / "results"))
  with pytest.raises(ValueError, match=rf"suite 's' runs on TensorFlow 2.0.0 .* has {have}: .*"
                                       r"tensorflow==2.0.0"):
    runner.run_suite(pinned, paths)
  assert not (tmp_path / "results").exists()  # refused before anything is written


def test_an_ensembles_churn_needs_no_prediction_history(tmp_path):
  import numpy as np

  arm = spec.Arm("ens", seeds=2, kind="ensemble", source_arm="b")
  suite = spec.Suite(name="s", arms=[spec.Arm("b", seeds=4), arm], prediction_history=True)
  paths = spec.RunPaths(str(tmp_path / "work"), str(tmp_path / "results"))
  for seed in (0, 1):
    _record_predictions(paths, "ens", seed, np.array([0.2 + 0.1 * seed, 0.7]))
  churn = runner._churn(arm, paths, suite)
  assert churn is not None and not churn["expects_curves"] and "curves" not in churn
  assert runner._pair_recorded(arm, paths, 0) and runner._pair_recorded(arm, paths, 1)
  # A recorded ensemble is kept without its predictions (its members would have to be trained
  # again for a pair's churn): its churn is what the seeds recorded together gave.
  config = reuse.arm_config(arm, suite, [])
  with open(runner._config_path(arm, paths), "w") as f:
    json.dump(config, f)
  os.remove(runner._churn_path(arm, paths))
  os.remove(paths.predictions("ens", 1, 0))
  assert runner._churn(arm, paths, suite) is None  # one ensemble's predictions: no pair
  assert runner._seeds_to_run(arm, paths, config) == []
  assert runner._arm_done(arm, paths, config)


def test_a_member_run_is_compared_with_its_recorded_curve(tmp_path):
  from tf_codistill import layout

  arm = spec.Arm("b", seeds=2)
  suite = spec.Suite(name="s", arms=[arm], loss_key="val_loss")
  paths = spec.RunPaths(str(tmp_path / "work"), str(tmp_path / "results"))
  os.makedirs(os.path.dirname(paths.curve("b", 0, 0)))
  with open(paths.curve("b", 0, 0), "w") as f:
    f.write('{"step": 10, "val_loss": 2.0}\n{"step": 20, "val_loss": 1.5}\n')
  progress = layout.group_run(paths.run_dir("b", 0), 0).progress
  os.makedirs(os.path.dirname(progress))
  with open(progress, "w") as f:  # trained again: a little off at step 20, one step more
    f.write('{"step": 10, "val_loss": 2.0}\n{"step": 20, "val_loss": 1.52}\n'
            '{"step": 30, "val_loss": 1.4}\n')
  diff = runner._curve_difference(arm, suite, paths, 0)
  assert diff["seed"] == 0 and diff["steps_compared"] == 2
  assert diff["max_abs_loss_diff"] == pytest.approx(0.02)


def test_only_the_named_arms_run_and_the_others_must_be_recorded(tmp_path):
  paths = spec.RunPaths(str(tmp_path), str(tmp_path))
  tuned = spec.Arm("sync_b", tune_learning_rate=True)
  codistill = spec.Arm("codistill", learning_rate_from="sync_b")
  suite = spec.Suite(name="s", arms=[tuned, codistill], learning_rates=[0.001, 0.002],
                     loss_key="val_loss")
  tuning, trained = [], []
  record = _fake_tuning(paths, lambda lr: lr, tuning)  # the smallest rate wins

  def run(arms):
    for arm in arms:
      if "lr_" in arm.name:
        record([arm])
      else:
        trained.append(arm.name)

  with pytest.raises(FileNotFoundError, match=r"arm 'sync_b': tuning run .* is not recorded"):
    runner.prepare(suite, paths, data=[], run=run, only=["codistill"])
  assert tuning == trained == []
  runner.prepare(suite, paths, data=[], run=run, only=["sync_b"])
  assert len(tuning) == 2 and trained == ["sync_b"]
  concrete, _ = runner.prepare(suite, paths, data=[], run=run, only=["codistill"])
  assert len(tuning) == 2 and trained == ["sync_b", "codistill"]  # sync_b's tuning only read
  assert "trainer.train.learning_rate = 0.001" in concrete.arms[1].gin_bindings
  with pytest.raises(ValueError, match=r"suite 's' has no arm\(s\) \['nope'\]; its arms: "
                                       r"\['sync_b', 'codistill'\]"):
    runner.check_arm_names(suite, ["nope"])


def test_arms_that_need_nothing_run_before_them_are_handed_to_run_together(tmp_path):
  arms = [spec.Arm("a"), spec.Arm("b"), spec.Arm("off", kind="offline_distill", source_arm="b"),
          spec.Arm("c")]
  suite = spec.Suite(name="s", arms=arms)
  paths = spec.RunPaths(str(tmp_path), str(tmp_path))
  batches = []

  def run(given):
    batches.append([arm.name for arm in given])
  runner.prepare(suite, paths, [], run=run)
  assert batches == [["a", "b"], ["off", "c"]]  # 'off' is built from b's runs: b runs first
  batches.clear()
  runner.prepare(suite, paths, [], run=run, only=["c", "a"])
  assert batches == [["a", "c"]]  # e.g. --arms=c,a: both at once, in the suite's order
  batches.clear()
  runner.prepare(suite, paths, [], run=None)
  assert batches == []
