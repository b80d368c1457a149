"""The step-time harness (benchmarks/step_times.py) and the teacher-overhead benchmark on it, at
toy sizes: what is measured, not how fast (tests do not time)."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from benchmarks import step_times
from benchmarks import teacher_overhead
from tf_codistill.teachers import quantization


def _model():
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  model.compile(keras.optimizers.SGD(0.1), "mse")
  return model


def _data():
  return tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"),
                                             np.ones((8, 1), "float32"))).batch(2).repeat()


def test_one_time_per_step_after_the_skipped_ones_inside_one_fit():
  model = _model()
  times = step_times.fit_step_times(model, _data(), steps=7, skip=3)
  assert len(times) == 7 and all(t > 0 for t in times)
  assert int(model.optimizer.iterations.numpy()) == 10  # skipped steps train too


class _Logged(keras.Model):
  """A one-weight model whose train step records its name, in the order the steps really run."""

  def __init__(self, name, calls):
    super().__init__(name=name)
    self.dense = keras.layers.Dense(1)
    self.calls = calls

  def call(self, x):
    return self.dense(x)

  def train_step(self, data):
    tf.py_function(lambda: self.calls.append(self.name) or 0, [], tf.int32)
    return super().train_step(data)


def test_alternated_steps_take_turns_in_an_order_drawn_each_round_and_train_every_arm():
  calls = []
  models = {}
  for name in "abc":
    models[name] = _Logged(name, calls)
    models[name].compile(keras.optimizers.SGD(0.1), "mse")
  times = step_times.alternate_steps(models, _data(), steps=2, rounds=6, skip=1)
  # Each round: one order of the three arms, repeated for 1 skipped + 2 timed steps.
  rounds = ["".join(calls[9 * r:9 * r + 9]) for r in range(6)]
  assert len(calls) == 54 and all(sorted(r[:3]) == list("abc") and r == r[:3] * 3 for r in rounds)
  assert len({r[:3] for r in rounds}) > 1  # the order changes between rounds
  assert {name: [len(r) for r in arm] for name, arm in times.items()} == {
      name: [2] * 6 for name in "abc"}
  assert [int(m.optimizer.iterations.numpy()) for m in models.values()] == [18, 18, 18]


def test_arms_run_in_a_rotated_order_every_round():
  order = []
  arms = {name: (lambda n=name: order.append(n) or [0.1]) for name in "abc"}
  times = step_times.interleave(arms, rounds=3)
  assert order == list("abc" "bca" "cab")
  assert times == {name: [[0.1]] * 3 for name in "abc"}


def test_ratios_are_formed_within_rounds_and_come_with_an_interval():
  # Round 2 is slow for every arm alike (machine noise); b is twice as fast as a in every round.
  times = {"a": [[0.2, 0.2], [1.0, 1.0], [0.2, 0.2]], "b": [[0.1, 0.1], [0.5, 0.5], [0.1, 0.1]]}
  ratio = step_times.throughput_ratio(times, "b", "a")
  assert ratio["rounds"] == pytest.approx([2.0, 2.0, 2.0])
  assert ratio["median"] == pytest.approx(2.0) and ratio["interval90"] == pytest.approx([2.0, 2.0])
  noisy = {"a": [[1.0]] * 5, "b": [[1.0], [0.5], [1.0], [2.0], [1.0]]}
  low, high = step_times.throughput_ratio(noisy, "b", "a")["interval90"]
  assert low <= 1.0 <= high and low < high
  described = step_times.describe(times)
  assert described["b"]["median_ms"] == pytest.approx(100.0) and described["b"]["steps"] == 6


def test_rounds_of_several_processes_pool_with_an_interval_over_processes():
  # Process 0 has b at 2x a in every round, process 1 at 1x: rounds agree within each process,
  # so only an interval that resamples processes shows how far apart they are.
  runs = [{"a": [[0.2]] * 4, "b": [[0.1]] * 4}, {"a": [[0.2]] * 4, "b": [[0.2]] * 4}]
  times, clusters = step_times.pool_processes(runs)
  assert times == {"a": [[0.2]] * 8, "b": [[0.1]] * 4 + [[0.2]] * 4}
  assert clusters == [0] * 4 + [1] * 4
  pooled = step_times.throughput_ratio(times, "b", "a", clusters=clusters)
  assert pooled["process_medians"] == pytest.approx([2.0, 1.0])
  low, high = pooled["interval90"]
  assert low == pytest.approx(1.0) and high == pytest.approx(2.0)
  # Rounds that vary within processes as well: the rounds alone (as if from one process) give
  # a narrower interval than one that resamples the processes they came from.
  spread = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
  runs = [{"a": [[1.0]] * 6, "b": [[1.0 / (v + d)] for v in spread]} for d in (0.0, 0.6)]
  times, clusters = step_times.pool_processes(runs)
  low, high = step_times.throughput_ratio(times, "b", "a", clusters=clusters)["interval90"]
  naive_low, naive_high = step_times.throughput_ratio(times, "b", "a")["interval90"]
  assert naive_high - naive_low < high - low
  with pytest.raises(ValueError, match="run 1 has arms"):
    step_times.pool_processes([{"a": [[1.0]]}, {"b": [[1.0]]}])
  with pytest.raises(ValueError, match="different numbers of rounds"):
    step_times.pool_processes([{"a": [[1.0]], "b": [[1.0], [1.0]]}])


def test_teacher_overhead_runs_its_arms_in_fresh_processes_and_pools_them():
  # Three arms (every arm is built and timed in the in-process test above).
  arms = ["codistill_no_teacher", "codistill_one_teacher", "codistill_stacked_teacher"]
  settings = {"optimizer": "adam", "batch_size": 8, "num_buckets": 50, "embedding_dim": 2,
              "steps": 2, "rounds": 2, "arms": arms}
  summary = teacher_overhead.run_processes(settings, processes=2)
  assert set(summary["step_times"]) == set(arms)
  assert {row["steps"] for row in summary["step_times"].values()} == {2 * 2 * 2}
  assert set(summary["ratios"]) == {"one_teacher_vs_no_teacher", "stacked_teacher_vs_no_teacher"}
  for ratio in summary["ratios"].values():
    assert len(ratio["rounds"]) == 4 and len(ratio["process_medians"]) == 2
    low, high = ratio["interval90"]
    assert 0 < low <= ratio["median"] <= high
  assert set(summary["teacher_forward_ms"]) == set(arms[1:])
  pids = summary["process_ids"]
  assert len(set(pids)) == 2 and os.getpid() not in pids
  with pytest.raises(ValueError, match="unknown arms"):
    teacher_overhead.build_arms(8, 50, 2, only=["codistill_no_such_teacher"])
  assert summary["swap_flip_ms_median"] >= 0 and summary["in_place_assign_ms_median"] > 0


def test_teacher_overhead_measures_every_arm_and_the_goal_ratios():
  arms = teacher_overhead.build_arms(batch_size=8, num_buckets=50, embedding_dim=2)
  assert set(arms) == {"plain_keras", "codistill_no_teacher", "codistill_no_teacher_again",
                       "codistill_one_teacher",
                       "codistill_bfloat16_teacher", "codistill_mixed_bfloat16_teacher",
                       "codistill_int8_teacher", "codistill_stacked_teacher",
                       "codistill_stacked_bfloat16_teacher", "codistill_stacked_int8_teacher",
                       "codistill_lookups_only_teacher", "codistill_cached_tables_teacher"}
  for name, variables in (("codistill_bfloat16_teacher", "bfloat16"),
                          ("codistill_mixed_bfloat16_teacher", "float32")):
    teacher = arms[name].teacher_slots[0][0]
    dense = [layer for layer in teacher.layers if isinstance(layer, keras.layers.Dense)]
    assert dense and all(layer.compute_dtype == "bfloat16" for layer in dense)
    assert all(layer.kernel.dtype == variables for layer in dense)
  assert quantization.is_quantized(arms["codistill_int8_teacher"].teacher_slots[0][0])
  for name, dtype in (("codistill_stacked_teacher", "float32"),
                      ("codistill_stacked_bfloat16_teacher", "bfloat16")):
    stacked = arms[name].active_teacher(0).get_layer("stacked_embeddings")
    assert stacked.table.dtype == dtype and stacked.table.shape == (26 * 50, 2)
  stacked = arms["codistill_stacked_int8_teacher"].active_teacher(0).get_layer("stacked_input")
  assert stacked.tables.codes.dtype == tf.int8 and stacked.tables.codes.shape == (26 * 50, 2)
  summary = teacher_overhead.measure(arms, teacher_overhead._dataset(8, 50), steps=3, rounds=2)
  assert {row["steps"] for row in summary["step_times"].values()} == {6}
  assert int(arms["codistill_int8_teacher"].optimizer.iterations.numpy()) == 2 * (3 + 3)
  for ratio in summary["ratios"].values():
    assert ratio["median"] > 0 and len(ratio["rounds"]) == 2
  assert {"no_teacher_again_vs_no_teacher", "lookups_only_teacher_vs_no_teacher",
          "cached_tables_teacher_vs_no_teacher", "stacked_teacher_vs_no_teacher",
          "stacked_bfloat16_teacher_vs_no_teacher", "stacked_int8_teacher_vs_no_teacher"
          } <= set(summary["ratios"])
  assert set(teacher_overhead.GOAL_RATIOS.values()) <= set(summary["ratios"])
  for name in teacher_overhead.PART_ARMS:  # loaded, and really a part of the CTR teacher
    assert arms[name].teacher_steps.numpy().tolist() == [0]
  lookups = arms["codistill_lookups_only_teacher"].active_teacher(0)
  assert not [layer for layer in lookups.layers if layer.name.startswith("hidden_")]
  cached = arms["codistill_cached_tables_teacher"].active_teacher(0)
  assert {w.shape[0] for w in cached.weights if "embedding" in w.name} == {8}
  assert arms["codistill_no_teacher_again"] is not arms["codistill_no_teacher"]
  forward = teacher_overhead.forward_times(arms, teacher_overhead._dataset(8, 50), calls=2,
                                           repeats=2)
  assert set(forward) == set(teacher_overhead.TEACHER_ARMS)
  assert all(ms > 0 for ms in forward.values())
  x = next(iter(teacher_overhead._dataset(8, 50)))[0]
  teacher = arms["codistill_one_teacher"].teacher_slots[0][0]
  once = float(tf.reduce_sum(teacher(x, training=False)))
  assert float(teacher_overhead._forward_loop(teacher, x)(tf.constant(3))) == pytest.approx(
      3 * once, rel=1e-5)
  pause = teacher_overhead.swap_pause(arms["codistill_one_teacher"], repeats=2)
  assert pause["swap_flip_ms_median"] >= 0 and pause["in_place_assign_ms_median"] > 0
