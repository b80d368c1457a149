"""Weight codecs: rows of an array in float32, bfloat16 or int8, and which rows changed."""

import numpy as np
import pytest

from tf_codistill.exchange import weight_codecs as wc


def _table(seed=0, shape=(50, 8)):
  return np.random.default_rng(seed).normal(0, 0.1, shape).astype(np.float32)


@pytest.mark.parametrize("shape,rows", [((50, 8), (50, 8)), ((3, 4, 5), (12, 5)), ((7,), (1, 7)),
                                        ((), (1, 1)), ((0, 4), (0, 4))])
def test_arrays_are_rows_of_their_last_axis(shape, rows):
  assert wc.rows_shape(shape) == rows
  assert wc.as_rows(np.zeros(shape)).shape == rows


def test_int8_round_trip_is_within_half_a_step_of_each_rows_scale():
  table = _table()
  table[3] = 0.0  # an all-zero row has scale 0 and decodes to zeros
  enc = wc.encode(table, "int8")
  assert enc.values.dtype == np.int8 and enc.scales.shape == (50,)
  # A scale is max|row| / 127 rounded to a bfloat16 value: stored in 2 bytes without loss.
  np.testing.assert_allclose(enc.scales, np.abs(table).max(axis=1) / 127, rtol=2 ** -8)
  np.testing.assert_array_equal(wc.stored_scales(enc.scales).astype(np.float32), enc.scales)
  # Every non-zero row's largest code is 127, so quantizing the decoded rows is idempotent.
  assert np.abs(enc.values).max(axis=1).tolist() == [0 if i == 3 else 127 for i in range(50)]
  again = wc.encode(wc.decode(enc), "int8")
  np.testing.assert_array_equal(again.values, enc.values)
  np.testing.assert_array_equal(again.scales, enc.scales)
  decoded = wc.decode(enc)
  assert np.all(np.abs(decoded - table) <= enc.scales[:, None] / 2 + 1e-7)
  np.testing.assert_array_equal(decoded[3], 0.0)
  assert enc.nbytes == 50 * 8 + 50 * 4  # a quarter of float32, plus a scale per row


def test_bfloat16_keeps_three_significant_digits_and_float32_is_exact():
  table = _table(1)
  np.testing.assert_allclose(wc.decode(wc.encode(table, "bfloat16")), table, rtol=2 ** -8)
  np.testing.assert_array_equal(wc.decode(wc.encode(table, "float32")), table)
  assert wc.encode(table, "bfloat16").nbytes == table.nbytes // 2


def test_integer_arrays_are_stored_as_they_are():
  counter = np.array([3, -1, 7], np.int64)
  enc = wc.encode(counter, "int8")
  assert enc.scales is None and enc.values.dtype == np.int64
  np.testing.assert_array_equal(wc.decode(enc).reshape(3), counter)


@pytest.mark.parametrize("encoding", wc.ENCODINGS)
def test_changed_rows_are_the_rows_whose_stored_form_differs(encoding):
  old = _table(2)
  new = old.copy()
  new[[4, 17]] += 0.05   # changed for every encoding
  small = int(np.argmin(np.abs(old[30])))  # not the row's maximum: int8's scale stays
  new[30, small] += 1e-6  # below bfloat16's and int8's resolution, not float32's
  rows = wc.changed_rows(wc.encode(new, encoding), wc.encode(old, encoding))
  expected = [4, 17, 30] if encoding == "float32" else [4, 17]
  assert rows.tolist() == expected
  # Replacing those rows of the old stored form gives the new stored form exactly.
  held = wc.decode(wc.encode(old, encoding))
  held[rows] = wc.decode(wc.encode(new, encoding).take(rows))
  np.testing.assert_array_equal(held, wc.decode(wc.encode(new, encoding)))


def test_unknown_encoding_and_mismatched_shapes_are_refused():
  with pytest.raises(ValueError, match="'int4' is not one of"):
    wc.encode(_table(), "int4")
  with pytest.raises(ValueError, match="cannot compare rows"):
    wc.changed_rows(wc.encode(_table(), "int8"), wc.encode(_table(shape=(49, 8)), "int8"))
