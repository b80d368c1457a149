"""Shared fixtures."""

import pytest

from data_pipelines import make_criteo_like


@pytest.fixture(scope="session")
def criteo_dir(tmp_path_factory):
  """4 training files (40k rows) and 1 eval file (4k rows) from one planted model."""
  path = str(tmp_path_factory.mktemp("criteo"))
  make_criteo_like.generate(path, 40_000, num_files=4, seed=0, prefix="train", vocab_size=2000)
  make_criteo_like.generate(path, 4_000, num_files=1, seed=1, prefix="eval", vocab_size=2000)
  return path
