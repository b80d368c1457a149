"""Tests of the token-record pipeline: exact windows, disjoint shards, no repeats, bad records."""

import numpy as np
import pytest
import tensorflow as tf

from data_pipelines import records
from data_pipelines import token_lm

VOCAB = 50


@pytest.fixture()
def shards(tmp_path):
  """4 shards of 3 documents of 20 ids and <eos>; shard s's ids lie in [1 + 12 s, 12 + 12 s]."""
  paths = []
  for s in range(4):
    docs = [np.asarray([1 + 12 * s + (d * 4 + i) % 12 for i in range(20)] + [0], np.uint16)
            for d in range(3)]
    path = str(tmp_path / f"train-{s:05d}-of-00004.tfrecord")
    token_lm.write_shard(path, docs)
    paths.append(path)
  return tmp_path, paths


def _stream(paths):
  import data_pipelines.corpus as corpus  # pylint: disable=g-import-not-at-top
  return np.concatenate([corpus.shard_tokens(p) for p in paths])


def _windows(dataset):
  xs, ys = [], []
  for x, y in dataset:
    xs.append(x["tokens"].numpy())
    ys.append(y.numpy())
  return np.concatenate(xs), np.concatenate(ys)


def test_windows_are_the_token_stream_cut_with_overlap_one(shards):
  _, paths = shards
  data = token_lm.make_dataset(paths[:1], 4, sequence_length=8, vocab_size=VOCAB)
  x, y = _windows(data)
  stream = _stream(paths[:1])  # 63 tokens: 7 windows of 9 overlapping by one
  assert x.shape == (7, 8)
  np.testing.assert_array_equal(x.reshape(-1), stream[:56])
  np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
  np.testing.assert_array_equal(y[:, -1], stream[8:57:8])


def test_groups_read_disjoint_shards(shards):
  _, paths = shards
  for group, own in [(0, (0, 2)), (1, (1, 3))]:
    x, _ = _windows(token_lm.make_dataset(paths, 2, sequence_length=5, vocab_size=VOCAB,
                                          shard_index=group, num_shards=2))
    ids = set(x.ravel().tolist()) - {token_lm.EOS_ID}
    assert ids == {1 + 12 * s + i for s in own for i in range(12)}, group
  with pytest.raises(records.DataError, match=r"4 token shards .* cannot be split between 8"):
    token_lm.make_dataset(paths, 2, vocab_size=VOCAB, shard_index=0, num_shards=8)


def test_training_data_never_repeats_past_max_passes(shards):
  _, paths = shards
  data = token_lm.make_dataset(paths[:1], 2, sequence_length=8, vocab_size=VOCAB, repeat=True,
                               shuffle_buffer=10, seed=1)
  batches = iter(data)
  for _ in range(3):  # 7 windows: 3 full batches, then the pass is used up
    next(batches)
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"training data exhausted: 1 pass"):
    next(batches)
  twice = token_lm.make_dataset(paths[:1], 2, sequence_length=8, vocab_size=VOCAB, repeat=True,
                                max_passes=2)
  batches = iter(twice)
  for _ in range(7):  # 14 windows: 7 batches, then the two passes are used up
    next(batches)
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"exhausted: 2 pass\(es\) over 1 "):
    next(batches)


def test_bad_records_fail_naming_file_and_record_or_are_counted(tmp_path):
  path = str(tmp_path / "train-00000-of-00001.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    writer.write(np.arange(1, 12, dtype="<u2").tobytes())
    writer.write(b"\x01\x00\x02")  # 3 bytes: not uint16 ids
    writer.write(np.asarray([3, VOCAB + 5], "<u2").tobytes())  # an id past the vocabulary
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"malformed token record .*train-00000-of-00001.tfrecord:2: 3 bytes"):
    _windows(token_lm.make_dataset(path, 2, sequence_length=4, vocab_size=VOCAB))
  with tf.io.TFRecordWriter(path) as writer:
    writer.write(np.arange(1, 12, dtype="<u2").tobytes())
    writer.write(np.asarray([3, VOCAB + 5], "<u2").tobytes())
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"tfrecord:2: token id 55 >= "
                                                           r"vocab_size 50"):
    _windows(token_lm.make_dataset(path, 2, sequence_length=4, vocab_size=VOCAB))
  counter = records.BadLineCounter()
  x, _ = _windows(token_lm.make_dataset(path, 2, sequence_length=4, vocab_size=VOCAB,
                                        bad_lines="skip", bad_line_counter=counter))
  assert x.shape == (2, 4) and counter.count == 1
  # The first bad record is named whatever is wrong with it: an id past the vocabulary (record
  # 2) before a record of an odd number of bytes (record 3); skipped, each counts once.
  with tf.io.TFRecordWriter(path) as writer:
    writer.write(np.arange(1, 12, dtype="<u2").tobytes())
    writer.write(np.asarray([3, VOCAB + 5], "<u2").tobytes())
    writer.write(b"\x01\x00\x02")
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"tfrecord:2: token id 55 >= "):
    _windows(token_lm.make_dataset(path, 2, sequence_length=4, vocab_size=VOCAB))
  counter = records.BadLineCounter()
  _windows(token_lm.make_dataset(path, 2, sequence_length=4, vocab_size=VOCAB,
                                 bad_lines="skip", bad_line_counter=counter))
  assert counter.count == 2


@pytest.mark.parametrize("passes", [0, -1])
def test_max_passes_below_one_is_refused(shards, passes):
  _, paths = shards
  with pytest.raises(ValueError, match=f"max_passes={passes} must be >= 1"):
    token_lm.make_dataset(paths, 2, vocab_size=VOCAB, repeat=True, max_passes=passes)


def test_unigram_prior_from_the_saved_counts(tmp_path):
  path = str(tmp_path / "train-00000-of-00001.tfrecord")
  token_lm.write_shard(path, [np.asarray([1, 2, 2, 0], np.uint16)])

  class Names:
    def id_to_token(self, i):
      return ["<eos>", "a", "b"][i]

  token_lm.write_counts(Names(), np.asarray([1, 1, 2]), str(tmp_path / token_lm.COUNTS_FILE))
  np.testing.assert_allclose(token_lm.unigram_prior([path], vocab_size=3), [0.25, 0.25, 0.5])
  with pytest.raises(ValueError, match=r"has 3 tokens but token_lm.unigram_prior.vocab_size = 4"):
    token_lm.unigram_prior([path], vocab_size=4)
  (tmp_path / token_lm.COUNTS_FILE).write_text("0\t'<eos>'\t1\n2\t'a'\t1\n")
  with pytest.raises(ValueError, match=r"token_counts.tsv:2: expected '1<TAB>token<TAB>count'"):
    token_lm.unigram_prior([path], vocab_size=2)


def test_tokenizer_round_trips_text_and_refuses_an_unreachable_vocabulary():
  texts = ["the cat sat on the mat", "int main(void) { return 0; }\n"] * 20
  tokenizer = token_lm.train_tokenizer(texts, 280)
  [ids] = token_lm.encode(tokenizer, ["the cat é"])
  assert ids[-1] == token_lm.EOS_ID and tokenizer.decode(ids[:-1].tolist()) == "the cat é"
  with pytest.raises(ValueError, match=r"allows only \d+ tokens"):
    token_lm.train_tokenizer(["ab"], 5000)
  with pytest.raises(ValueError, match=r"vocab_size=100000 must be in"):
    token_lm.train_tokenizer(texts, 100_000)
