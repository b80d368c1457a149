"""Subword language-model data: a byte-level BPE tokenizer, pre-tokenized TFRecord shards, tf.data.

Tokenizer (``train_tokenizer``): byte-level BPE from Hugging Face ``tokenizers``, trained on the
training split only and saved as ``tokenizer.json`` beside the shards; id 0 is ``<eos>``, which
ends every document. Byte-level means no ``<unk>``: every text has an encoding.

Shards (``write_shard``): TFRecord files, one record a document: its token ids as little-endian
uint16 (so ``vocab_size`` <= 65536), ``<eos>`` last. Tokenizing once, when the corpus is built,
keeps tokenization out of the training step's input pipeline (``benchmarks.parse_throughput``
measures what the pipeline delivers against what training consumes).

Windows (``make_dataset``): a shard's documents, in blocks of ``DOCS_PER_BLOCK``, are joined into
one token stream and cut into windows of ``sequence_length + 1`` tokens overlapping by one (the
stream's last partial window is dropped), shuffled, then batched as ``({'tokens': int32 [B, T]},
int32 [B, T])``. Shards are split by file between groups and input pipelines, so disjoint
shards never share a document. Training data never repeats unless asked: with ``max_passes=1``
(the default) a group that would read its share a second time fails, saying how many tokens it
had.

Token counts (``token_counts.tsv`` beside the shards: ``id<TAB>token<TAB>count`` over the
training split) give the unigram prior (``unigram_prior``) for label smoothing.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Sequence

import gin
import numpy as np
import tensorflow as tf

from data_pipelines import records

EOS = "<eos>"
EOS_ID = 0
TOKENIZER_FILE = "tokenizer.json"
COUNTS_FILE = "token_counts.tsv"
DOCS_PER_BLOCK = 256
MAX_VOCAB = 1 << 16
_PREFIX = "malformed token record "


def _tokenizers():
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError("building a subword corpus needs Hugging Face `tokenizers`: "
                      "pip install 'tokenizers>=0.21,<0.24' (a dependency of tf-codistill)"
                      ) from None
  return tokenizers


def train_tokenizer(texts: Iterable[str], vocab_size: int):
  """A byte-level BPE ``tokenizers.Tokenizer`` of ``vocab_size`` tokens (``<eos>`` id 0)."""
  if not 256 + 1 < vocab_size <= MAX_VOCAB:
    raise ValueError(f"vocab_size={vocab_size} must be in (257, {MAX_VOCAB}]: 256 byte tokens, "
                     f"{EOS} and merges, stored as uint16")
  tk = _tokenizers()
  tokenizer = tk.Tokenizer(tk.models.BPE())
  tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = tk.decoders.ByteLevel()
  trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                   initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                   show_progress=False)
  tokenizer.train_from_iterator(texts, trainer)
  if tokenizer.get_vocab_size() != vocab_size:
    raise ValueError(f"the training text allows only {tokenizer.get_vocab_size()} tokens (bytes, "
                     f"{EOS} and merges): vocab_size={vocab_size} must be at most that")
  if tokenizer.token_to_id(EOS) != EOS_ID:
    raise AssertionError(f"{EOS} got id {tokenizer.token_to_id(EOS)}, not {EOS_ID}")
  return tokenizer


def load_tokenizer(path: str):
  """The tokenizer saved at ``path`` (a ``tokenizer.json``)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"tokenizer {path} is missing: build the corpus with "
                            f"`python -m data_pipelines.debian_text --output_dir=...`")
  return _tokenizers().Tokenizer.from_file(path)


def encode(tokenizer, texts: Sequence[str]) -> List[np.ndarray]:
  """Each text's token ids (uint16), ``<eos>`` appended (a literal ``<eos>`` in a text is
  encoded as text, not as the end of a document)."""
  tokenizer.encode_special_tokens = True
  return [np.asarray(e.ids + [EOS_ID], np.uint16) for e in tokenizer.encode_batch(list(texts))]


def write_shard(path: str, documents: Iterable[np.ndarray]) -> int:
  """Writes one TFRecord shard (a record a document's uint16 ids) atomically; returns tokens."""
  tokens = 0
  with records.written_atomically(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
    for ids in documents:
      writer.write(np.asarray(ids, "<u2").tobytes())
      tokens += len(ids)
  return tokens


def write_counts(tokenizer, counts: np.ndarray, path: str) -> None:
  """Writes ``id<TAB>token<TAB>count`` lines (the training split's token counts) atomically."""
  with records.written_atomically(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    for token_id, count in enumerate(counts):
      f.write(f"{token_id}\t{tokenizer.id_to_token(token_id)!r}\t{int(count)}\n")


def read_counts(path: str) -> np.ndarray:
  """The counts of a ``token_counts.tsv``, checked (ids 0.. in order)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"token counts {path} are missing: they are written with the corpus "
                            f"(python -m data_pipelines.debian_text)")
  counts = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      fields = line.rstrip("\n").split("\t")
      if len(fields) != 3 or fields[0] != str(number - 1) or not fields[2].isdigit():
        raise ValueError(f"{path}:{number}: expected '{number - 1}<TAB>token<TAB>count', "
                         f"got {line.rstrip()!r}")
      counts.append(int(fields[2]))
  return np.asarray(counts, np.float64)


@gin.configurable(module="token_lm")
def unigram_prior(train_files: Sequence[str], vocab_size: int = gin.REQUIRED) -> np.ndarray:
  """Token frequencies of the training split (``token_counts.tsv`` beside the first shard)."""
  first = records.resolve_files(train_files, "token record")[0]
  counts = read_counts(os.path.join(os.path.dirname(first), COUNTS_FILE))
  if len(counts) != vocab_size:
    raise ValueError(f"{COUNTS_FILE} beside {first} has {len(counts)} tokens but "
                     f"token_lm.unigram_prior.vocab_size = {vocab_size}")
  return counts / counts.sum()


def _decoded_windows(file_ids: tf.Tensor, numbers: tf.Tensor, blobs: tf.Tensor, *,
                     files: Sequence[str], vocab_size: int, sequence_length: int,
                     bad_lines: str, counter: Optional[records.BadLineCounter]) -> tf.Tensor:
  """[N, T + 1] windows of a block of records, bad records failing or dropped (the first bad
  record of the block is the one named, whatever is wrong with it)."""
  where = records.locator(files, file_ids, numbers)
  lengths = tf.strings.length(blobs)
  even = tf.logical_and(lengths > 0, lengths % 2 == 0)
  decode = lambda b: tf.cast(tf.io.decode_raw(tf.strings.reduce_join(b), tf.uint16), tf.int32)
  # Each record's whole uint16 ids (an odd last byte left out), to check its vocabulary too.
  whole_ids = tf.strings.substr(blobs, tf.zeros_like(lengths), lengths - lengths % 2)
  per_doc = tf.RaggedTensor.from_row_lengths(decode(whole_ids), lengths // 2)
  largest = tf.reduce_max(per_doc, axis=1)
  in_vocab = largest < vocab_size

  def describe(i: tf.Tensor) -> tf.Tensor:
    return tf.where(even[i], tf.strings.join([
        "token id ", tf.strings.as_string(largest[i]), f" >= vocab_size {vocab_size}: "
        "the corpus was built with another vocabulary"]), tf.strings.join([
            tf.strings.as_string(lengths[i]), " bytes is not a whole number of uint16 token ids"]))
  [kept] = records.enforce(tf.logical_and(even, in_vocab), describe, [blobs], where=where,
                           prefix=_PREFIX, policy=bad_lines, counter=counter)
  return tf.signal.frame(decode(kept), sequence_length + 1, sequence_length, axis=0)


def _exhausted(sequence_length: int, files: Sequence[str], max_passes: int) -> tf.data.Dataset:
  """One element that fails: the group asked for more windows than ``max_passes`` over its
  shards hold."""
  message = (f"training data exhausted: {max_passes} pass(es) over {len(files)} token shard(s) "
             f"({files[0]} ...) are used up and token_lm.make_dataset.max_passes = {max_passes} "
             f"forbids repeating them; train fewer steps or smaller batches, or raise max_passes")

  def fail(_):
    with tf.control_dependencies([tf.debugging.Assert(tf.constant(False), [message])]):
      return tf.zeros([sequence_length + 1], tf.int32)

  return tf.data.Dataset.from_tensors(0).map(fail)


@gin.configurable(module="token_lm")
def make_dataset(file_pattern, batch_size: int, *, sequence_length: int = 64,
                 vocab_size: int = gin.REQUIRED, shard_index: int = 0, num_shards: int = 1,
                 repeat: bool = False, max_passes: Optional[int] = 1, shuffle_buffer: int = 0,
                 seed: Optional[int] = None, drop_remainder: Optional[bool] = None,
                 bad_lines: str = "error",
                 bad_line_counter: Optional[records.BadLineCounter] = None) -> tf.data.Dataset:
  """Batches of ``({'tokens': int32 [B, T]}, int32 [B, T])`` next-token windows of token shards.

  ``repeat`` with ``max_passes=N`` reads the shards N times, then fails (None: forever).
  ``bad_lines='error'`` fails on a record that is not uint16 ids below ``vocab_size`` (naming
  file and record number); ``'skip'`` drops it, counting it in ``bad_line_counter``.
  """
  records.check_choice("bad_lines", bad_lines, records.BAD_LINE_POLICIES)
  if sequence_length < 1:
    raise ValueError(f"token_lm.make_dataset: sequence_length={sequence_length} must be >= 1")
  if max_passes is not None and max_passes < 1:
    raise ValueError(f"token_lm.make_dataset: max_passes={max_passes} must be >= 1 (None: "
                     "repeat without end)")
  if not 0 <= shard_index < num_shards:
    raise ValueError(f"shard_index={shard_index} is out of range for num_shards={num_shards}")
  files = records.drop_empty_files(records.resolve_files(file_pattern, "token record"),
                                   bad_lines, file_pattern,
                                   binding="token_lm.make_dataset.bad_lines")
  if len(files) < num_shards:
    raise records.DataError(f"{len(files)} token shards ({files[0]} ...) cannot be split between "
                            f"{num_shards} groups x input pipelines: build the corpus with more "
                            f"shards")
  files = files[shard_index::num_shards]
  names = tf.data.Dataset.from_tensor_slices((tf.range(len(files), dtype=tf.int64), files))
  if shuffle_buffer:
    names = names.shuffle(len(files), seed=seed)
  docs = names.interleave(
      lambda i, f: tf.data.TFRecordDataset(f).enumerate(1).map(lambda n, r: (i, n, r)),
      cycle_length=min(4, len(files)))
  data = docs.batch(DOCS_PER_BLOCK).map(
      lambda i, n, r: _decoded_windows(i, n, r, files=files, vocab_size=vocab_size,
                                       sequence_length=sequence_length, bad_lines=bad_lines,
                                       counter=bad_line_counter)).unbatch()
  if repeat:
    data = data.repeat(max_passes) if max_passes else data.repeat()
  if shuffle_buffer:
    data = data.shuffle(shuffle_buffer, seed=seed)
  if repeat and max_passes:
    data = data.concatenate(_exhausted(sequence_length, files, max_passes))
  data = data.map(lambda w: ({"tokens": w[:-1]}, w[1:]))
  drop = repeat if drop_remainder is None else drop_remainder
  return data.batch(batch_size, drop_remainder=drop).prefetch(tf.data.AUTOTUNE)


def feature_spec() -> Dict[str, tf.TensorSpec]:
  """Batched feature spec (batch and time dimensions None)."""
  return {"tokens": tf.TensorSpec([None, None], tf.int32)}
