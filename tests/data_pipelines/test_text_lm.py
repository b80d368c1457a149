"""Tests of the language-modeling pipeline: tokens, vocabulary and windows with exact ids."""

import os

import numpy as np
import pytest
import tensorflow as tf

from data_pipelines import text_lm

from testing_utils import require_kjv

TEXT = "The cat sat.\nThe dog sat, the cat ran.\n"
# Word tokens: the cat sat . <eos> the dog sat , the cat ran . <eos>
# Vocabulary of 6: <unk>=0, <eos>=1, then by count desc, token asc: the(3)=2, .(2)=3, cat(2)=4,
# sat(2)=5; ',', 'dog', 'ran' (1 each) are <unk>.
IDS = [2, 4, 5, 3, 1, 2, 0, 5, 0, 2, 4, 0, 3, 1]


@pytest.fixture()
def text_dir(tmp_path):
  path = tmp_path / "train-00000-of-00001.txt"
  path.write_text(TEXT)
  text_lm.write_vocab(text_lm.build_vocab([str(path)], 6), str(tmp_path / "vocab-word-6.tsv"))
  return tmp_path


def test_word_and_char_tokens():
  words = text_lm.tokenize(tf.constant(["The cat's hat, RED!", ""]), "word").to_list()
  assert words == [[b"the", b"cat's", b"hat", b",", b"red", b"!", b"<eos>"], [b"<eos>"]]
  chars = text_lm.tokenize(tf.constant(["ab \t a"]), "char").to_list()
  assert chars == [[b"a", b"b", b" ", b"a", b"<eos>"]]


def test_vocabulary_ranks_tokens_and_counts_unknowns(text_dir):
  vocab = text_lm.read_vocab(str(text_dir / "vocab-word-6.tsv"))
  assert vocab == [("<unk>", 3), ("<eos>", 2), ("the", 3), (".", 2), ("cat", 2), ("sat", 2)]
  prior = text_lm.unigram_prior([str(text_dir / "train-*")], vocab_size=6)
  np.testing.assert_allclose(prior, np.array([3, 2, 3, 2, 2, 2]) / 14)


def test_windows_overlap_by_one_token_with_exact_ids(text_dir):
  data = text_lm.make_dataset(str(text_dir / "train-*"), 8, vocab_size=6, sequence_length=4)
  (features, labels), = list(data)
  # 14 tokens -> floor(13 / 4) = 3 windows of 5 tokens starting at 0, 4, 8.
  np.testing.assert_array_equal(features["tokens"], [IDS[0:4], IDS[4:8], IDS[8:12]])
  np.testing.assert_array_equal(labels, [IDS[1:5], IDS[5:9], IDS[9:13]])
  assert features["tokens"].dtype == tf.int32 and labels.dtype == tf.int32


def test_char_level_vocabulary_and_ids(tmp_path):
  path = tmp_path / "train-0.txt"
  path.write_text("abba\nb a\n")
  vocab = text_lm.build_vocab([str(path)], 5, "char")
  # a: 3, b: 3, <eos>: 2, ' ': 1 -> <unk>=0 (' '), <eos>=1, a=2, b=3; one slot left for ' '.
  assert vocab == [("<unk>", 0), ("<eos>", 2), ("a", 3), ("b", 3), (" ", 1)]
  text_lm.write_vocab(vocab, str(tmp_path / "vocab-char-5.tsv"))
  assert text_lm.read_vocab(str(tmp_path / "vocab-char-5.tsv")) == vocab
  data = text_lm.make_dataset(str(path), 4, vocab_size=5, level="char", sequence_length=3)
  (features, labels), = list(data)
  # a b b a <eos> b ' ' a <eos> = 2 3 3 2 1 3 4 2 1
  np.testing.assert_array_equal(features["tokens"], [[2, 3, 3], [2, 1, 3]])
  np.testing.assert_array_equal(labels, [[3, 3, 2], [1, 3, 4]])


def test_shards_are_disjoint_by_file_and_by_line(tmp_path):
  lines = [f"w{i} x" for i in range(40)]
  for k in range(2):
    (tmp_path / f"train-{k}.txt").write_text("\n".join(lines[k * 20:(k + 1) * 20]) + "\n")
  files = [str(tmp_path / "train-0.txt"), str(tmp_path / "train-1.txt")]
  vocab = text_lm.build_vocab(files, 43)  # 40 words w<i>, 'x', <unk>, <eos>
  text_lm.write_vocab(vocab, str(tmp_path / "vocab-word-43.tsv"))
  shared = {0, 1, [t for t, _ in vocab].index("x")}

  def tokens(num_shards, index):
    data = text_lm.make_dataset(str(tmp_path / "train-*"), 100, vocab_size=43, sequence_length=2,
                                shard_index=index, num_shards=num_shards)
    return {int(t) for f, _ in data for t in f["tokens"].numpy().ravel()} - shared

  for num_shards in (2, 3):  # by file, by line
    shards = [tokens(num_shards, i) for i in range(num_shards)]
    assert all(shards)
    for i in range(num_shards):
      for j in range(i + 1, num_shards):
        assert not shards[i] & shards[j]


def test_training_batches_repeat_shuffle_and_are_full(text_dir):
  data = text_lm.make_dataset(str(text_dir / "train-*"), 2, vocab_size=6, sequence_length=4,
                              repeat=True, shuffle_buffer=10, seed=1)
  batches = list(data.take(5))
  assert all(f["tokens"].shape == (2, 4) for f, _ in batches)


def test_wrong_vocabulary_size_or_missing_vocabulary_names_the_file(text_dir):
  with pytest.raises(ValueError, match=r"vocab-word-6.tsv has 6 tokens but "
                                       r"text_lm.make_dataset.vocab_size = 7"):
    text_lm.make_dataset(str(text_dir / "train-*"), 2, vocab_size=7,
                         vocab_file=str(text_dir / "vocab-word-6.tsv"))
  with pytest.raises(FileNotFoundError, match=r"vocab-word-9.tsv is missing"):
    text_lm.make_dataset(str(text_dir / "train-*"), 2, vocab_size=9)
  with pytest.raises(ValueError,
                     match=r"only 7 distinct tokens besides <eos>: vocab_size=10 must be <= 9"):
    text_lm.build_vocab([str(text_dir / "train-00000-of-00001.txt")], 10)
  with pytest.raises(FileNotFoundError, match="no text files match"):
    text_lm.make_dataset(str(text_dir / "nothing-*"), 2, vocab_size=6)


def test_king_james_bible_is_prepared_once_from_the_debian_package(tmp_path):
  require_kjv()
  verses = text_lm.kjv_lines()
  assert len(verses) == 31_102
  assert verses[0] == "In the beginning God created the heaven and the earth."
  assert verses[-1] == "The grace of our Lord Jesus Christ be with you all. Amen."
  train, evaluation, vocab_file = text_lm.prepare(str(tmp_path), vocab_size=2000, num_train_files=4)
  train_lines = sum(len(open(p).read().splitlines()) for p in train)
  eval_lines = len(open(evaluation[0]).read().splitlines())
  assert (train_lines, eval_lines) == (29_602, 1_500)
  assert os.path.getsize(evaluation[0]) + sum(os.path.getsize(p) for p in train) > 4_000_000
  vocab = text_lm.read_vocab(vocab_file)
  assert len(vocab) == 2000 and vocab[1] == ("<eos>", 29_602)
  assert [t for t, _ in vocab[2:5]] == [",", "the", "and"]
  mtime = os.path.getmtime(vocab_file)
  text_lm.prepare(str(tmp_path), vocab_size=2000, num_train_files=4)  # reused, not rebuilt
  assert os.path.getmtime(vocab_file) == mtime


def test_raw_parser_gives_the_pipelines_ids_padded_per_line(text_dir):
  parse = text_lm.raw_parser(str(text_dir / "vocab-word-6.tsv"))
  lines = tf.constant(TEXT.splitlines())
  tokens = parse(lines)["tokens"]
  assert tokens.dtype == tf.int32
  np.testing.assert_array_equal(tokens, [IDS[:5] + [0] * 4, IDS[5:]])
  np.testing.assert_array_equal(parse.token_stream(lines), IDS)
