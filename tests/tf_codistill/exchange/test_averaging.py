"""averaging: ParameterAveraging's checks, and changes, decisions and shared states on disk."""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import tf_codistill as tfc
from tf_codistill.exchange import averaging
from tf_codistill.optim import outer

SHAPES = [(6, 4), (4,)]


def _arrays(seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  return [(rng.normal(size=s) * scale).astype(np.float32) for s in SHAPES]


@pytest.mark.parametrize("changes, named", [
    (dict(every_steps=0), "ParameterAveraging.every_steps=0"),
    (dict(min_groups=0), "ParameterAveraging.min_groups=0"),
    (dict(keep_rounds=0), "ParameterAveraging.keep_rounds=0"),
    (dict(outer_optimizer="adam"), "ParameterAveraging.outer_optimizer='adam'"),
    (dict(encoding="int4"), "ParameterAveraging.encoding='int4'"),
    (dict(on_missing="wait"), "ParameterAveraging.on_missing='wait'"),
    (dict(peer_timeout_s=0), "ParameterAveraging.peer_timeout_s=0"),
    (dict(poll_interval_s=float("inf")), "ParameterAveraging.poll_interval_s=inf"),
    (dict(outer_learning_rate=-1), "ParameterAveraging.outer_learning_rate=-1"),
    (dict(outer_momentum=1.0), "ParameterAveraging.outer_momentum=1.0"),
])
def test_bad_values_are_refused_naming_the_field(changes, named):
  with pytest.raises(tfc.ConfigurationError, match=named.replace("(", r"\(")):
    tfc.ParameterAveraging(**changes)


def test_job_checks_name_the_field(tmp_path):
  with pytest.raises(tfc.ConfigurationError, match="seed_group=2 is not a group"):
    tfc.ParameterAveraging(seed_group=2).check_job(str(tmp_path), 2)
  with pytest.raises(tfc.ConfigurationError, match="min_groups=3 is more than the 2 groups"):
    tfc.ParameterAveraging(min_groups=3).check_job(str(tmp_path), 2)
  with pytest.raises(tfc.ConfigurationError, match="on_missing='continue' needs a POSIX"):
    tfc.ParameterAveraging().check_job("gs://bucket/exchange", 2)
  tfc.ParameterAveraging(on_missing="fail").check_job("gs://bucket/exchange", 2)
  with pytest.raises(tfc.ConfigurationError, match="distill=False and no tfc.Exchange.averaging"):
    tfc.Exchange(str(tmp_path), 0, 2, distill=False)


def test_presets_are_diloco_and_local_sgd():
  diloco = tfc.ParameterAveraging.diloco(100)
  assert (diloco.every_steps, diloco.outer_optimizer, diloco.outer_learning_rate,
          diloco.outer_momentum) == (100, "nesterov", 0.7, 0.9)
  assert tfc.ParameterAveraging.local_sgd(7, encoding="int8").outer_optimizer == "average"


def test_the_outer_step_defaults_to_its_optimizers_own_and_average_takes_none():
  averaged = tfc.ParameterAveraging(outer_optimizer="average")
  assert (averaged.outer_learning_rate, averaged.outer_momentum) == (1.0, 0.0)
  momentum = tfc.ParameterAveraging(outer_optimizer="momentum", outer_learning_rate=0.5)
  assert (momentum.outer_learning_rate, momentum.outer_momentum) == (0.5, 0.9)
  with pytest.raises(tfc.ConfigurationError,
                     match="outer_optimizer='average' replaces the parameters by the groups' "
                           r"mean: it takes no outer_learning_rate/outer_momentum \(given "
                           r"\(0.7, 0.0\)\)"):
    tfc.ParameterAveraging(outer_optimizer="average", outer_learning_rate=0.7)


@pytest.mark.parametrize("encoding, tolerance", [("float32", 0), ("bfloat16", 2 ** -8),
                                                 ("int8", 1 / 127)])
def test_a_change_round_trips_in_its_encoding_and_counts_its_bytes(tmp_path, encoding,
                                                                   tolerance):
  change = _arrays()
  nbytes = averaging.write_change(str(tmp_path), 1, 3, change, encoding, "d0", keep_rounds=2)
  got, stored = averaging.read_change(str(tmp_path), 1, 3, SHAPES, "d0")
  assert stored == nbytes
  per_value = {"float32": 4, "bfloat16": 2, "int8": 1}[encoding]
  scales = 2 * (6 + 1) if encoding == "int8" else 0  # one bfloat16 scale per row
  assert nbytes == per_value * (24 + 4) + scales
  for want, array in zip(change, got):
    assert array.dtype == np.float32 and array.shape == want.shape
    np.testing.assert_allclose(array, want, atol=tolerance * np.abs(want).max() + 1e-7)


def test_a_change_is_written_once(tmp_path):
  averaging.write_change(str(tmp_path), 0, 1, _arrays(0), "float32", "d", keep_rounds=2)
  averaging.write_change(str(tmp_path), 0, 1, _arrays(1), "float32", "d", keep_rounds=2)
  got, _ = averaging.read_change(str(tmp_path), 0, 1, SHAPES, "d")
  np.testing.assert_array_equal(got[0], _arrays(0)[0])


def _reject(tmp_path, match, shapes=SHAPES, digest="d"):
  with pytest.raises(averaging.RejectedChange, match=match):
    averaging.read_change(str(tmp_path), 1, 2, shapes, digest)


def test_bad_changes_are_rejected_naming_peer_and_round(tmp_path):
  directory = str(tmp_path)
  _reject(tmp_path, "group 1's change for round 2 is rejected: .*marker")  # nothing there
  bad = _arrays()
  bad[1][2] = np.nan
  averaging.write_change(directory, 1, 2, bad, "float32", "d", keep_rounds=5)
  _reject(tmp_path, "group 1's change for round 2 is rejected: it holds NaN")
  _reject(tmp_path, "computed from other parameters", digest="other")
  _reject(tmp_path, r"shapes \[\(6, 4\), \(4,\)\], the model's are \[\(6, 4\), \(5,\)\]",
          shapes=[(6, 4), (5,)])
  marker_path = os.path.join(averaging.change_dir(directory, 1, 2), "COMPLETE")
  marker = json.load(open(marker_path))
  json.dump(dict(marker, round=1), open(marker_path, "w"))
  _reject(tmp_path, "marker says round 1 \\(a change from another round\\)")


def test_truncated_and_linked_changes_are_rejected(tmp_path):
  directory = str(tmp_path / "exchange")
  averaging.write_change(directory, 1, 2, _arrays(), "float32", "d", keep_rounds=5)
  path = averaging.change_dir(directory, 1, 2)
  data = [f for f in os.listdir(path) if f.startswith("weights.data")][0]
  with open(os.path.join(path, data), "r+b") as f:
    f.truncate(10)
  with pytest.raises(averaging.RejectedChange, match="round 2 is rejected: .*size 10"):
    averaging.read_change(directory, 1, 2, SHAPES, "d")
  averaging.write_change(str(tmp_path / "elsewhere"), 1, 3, _arrays(), "float32", "d", 5)
  os.symlink(averaging.change_dir(str(tmp_path / "elsewhere"), 1, 3),
             averaging.change_dir(directory, 1, 3))
  with pytest.raises(averaging.RejectedChange, match="round 3 is rejected: .*(link|outside)"):
    averaging.read_change(directory, 1, 3, SHAPES, "d")


def test_old_changes_are_collected_by_their_writer(tmp_path):
  for round_ in range(1, 6):
    averaging.write_change(str(tmp_path), 0, round_, _arrays(), "float32", "d", keep_rounds=2)
  assert [averaging.has_change(str(tmp_path), 0, r) for r in range(1, 6)] == [
      False, False, False, True, True]


_DECIDER = """
import os, sys, time
from tf_codistill.exchange import averaging
directory, group, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
while not os.path.exists(go):
  time.sleep(0.001)
won = averaging.create_decision(directory, averaging.Decision(1, (group,), {}, group), True)
print("won" if won else "lost")
"""


def test_racing_deciders_make_exactly_one_decision(tmp_path):
  go = str(tmp_path / "go")
  deciders = [subprocess.Popen([sys.executable, "-c", _DECIDER, str(tmp_path / "x"), str(g), go],
                               stdout=subprocess.PIPE, text=True) for g in range(4)]
  time.sleep(5)  # every process has imported TensorFlow and waits for the go
  open(go, "w").close()
  said = [p.communicate(timeout=120)[0].strip() for p in deciders]
  assert sorted(said) == ["lost", "lost", "lost", "won"]
  decision = averaging.read_decision(str(tmp_path / "x"), 1)
  assert decision.members == (said.index("won"),) and decision.decided_by == said.index("won")
  assert not [f for f in os.listdir(os.path.dirname(averaging.decision_path(
      str(tmp_path / "x"), 1))) if ".tmp-" in f]


def test_a_malformed_decision_is_an_error_naming_its_file(tmp_path):
  path = averaging.decision_path(str(tmp_path), 4)
  os.makedirs(os.path.dirname(path))
  open(path, "w").write("{\"round\": 4}")
  with pytest.raises(averaging.AveragingError, match="round_4.json: malformed decision"):
    averaging.read_decision(str(tmp_path), 4)
  assert averaging.read_decision(str(tmp_path), 5) is None
  for text, named in [('{"round": 3, "members": [0, 1], "excluded": {}, "decided_by": 0, '
                       '"failed": false}', "a decision of round 3 in round 4's file"),
                      ('{"round": 4, "members": [1, 0], "excluded": {}, "decided_by": 0, '
                       '"failed": false}', r"members \[1, 0\] are not distinct ascending"),
                      ('{"round": 4, "members": [0, 2], "excluded": {}, "decided_by": 0, '
                       '"failed": false}', r"groups of range\(2\)"),
                      ('{"round": 4, "members": [], "excluded": {}, "decided_by": 0, '
                       '"failed": false}', r"members \[\] are not")]:
    open(path, "w").write(text)
    with pytest.raises(averaging.AveragingError, match=named):
      averaging.read_decision(str(tmp_path), 4, num_groups=2)


def test_shared_states_round_trip_and_old_ones_go_but_decisions_stay(tmp_path):
  directory = str(tmp_path)
  for round_ in range(4):
    theta = _arrays(round_)
    momentum = None if round_ == 0 else _arrays(10 + round_)
    averaging.create_decision(directory, averaging.Decision(round_, (0,), {}, 0), True)
    averaging.write_shared_state(directory, averaging.SharedState(
        round_, theta, momentum, outer.digest(theta)), keep_rounds=2)
  state = averaging.read_shared_state(directory)
  assert state.round == 3 and outer.digest(state.parameters) == outer.digest(_arrays(3))
  np.testing.assert_array_equal(state.momentum[0], _arrays(13)[0])
  assert averaging.read_shared_state(directory, newest_at_most=2).round == 2
  assert averaging.read_shared_state(directory, newest_at_most=1) is None
  # A round is decided once: its decision outlives its shared state.
  assert averaging.read_decision(directory, 0) and averaging.read_decision(directory, 1)


def test_a_shared_state_removed_while_it_is_read_is_taken_as_gone(tmp_path, monkeypatch):
  # A reader lists the shared states, then a decider's clean-up (keep_rounds) removes the one it
  # picked before it reads it: it is gone, not unreadable (the next older one is read).
  directory = str(tmp_path)
  for round_ in range(3):
    theta = _arrays(round_)
    averaging.write_shared_state(directory, averaging.SharedState(
        round_, theta, None, outer.digest(theta)), keep_rounds=5)
  listed = averaging.directory.complete_steps(averaging.shared_dir(directory))
  shutil.rmtree(os.path.join(averaging.shared_dir(directory), "step_2"))
  monkeypatch.setattr(averaging.directory, "complete_steps", lambda base: listed)
  assert averaging.read_shared_state(directory, newest_at_most=2).round == 1


def test_a_shared_state_that_does_not_match_its_digest_is_an_error(tmp_path):
  theta = _arrays()
  averaging.write_shared_state(str(tmp_path), averaging.SharedState(0, theta, None, "x"), 2)
  with pytest.raises(averaging.AveragingError, match="do not match the digest"):
    averaging.read_shared_state(str(tmp_path))
