"""Shared fixtures."""

import contextlib
import os

import pytest

from benchmarks import machine
from data_pipelines import make_criteo_like

from testing_utils import Launch


@pytest.fixture(scope="session", autouse=True)
def no_benchmark_beside_the_tests(tmp_path_factory):
  """The tests hold the machine's benchmark lock (shared): no benchmark measures beside them,
  and they do not start while one runs. Benchmarks the tests start use a lock of their own."""
  held = contextlib.ExitStack()
  try:
    held.enter_context(machine.hold("the test suite", shared=True))
  except machine.MachineBusy as e:
    pytest.exit(str(e), returncode=3)
  os.environ[machine.LOCK_ENV] = str(tmp_path_factory.mktemp("benchmark_lock") / "lock")
  yield
  held.close()


@pytest.fixture(scope="session")
def criteo_dir(tmp_path_factory):
  """4 training files (40k rows) and 1 eval file (4k rows) from one planted model."""
  path = str(tmp_path_factory.mktemp("criteo"))
  make_criteo_like.generate(path, 40_000, num_files=4, seed=0, prefix="train", vocab_size=2000)
  make_criteo_like.generate(path, 4_000, num_files=1, seed=1, prefix="eval", vocab_size=2000)
  return path


@pytest.fixture(autouse=True)
def stop_launches_left_running():
  """A test that fails mid-launch leaves no training processes behind for the next tests."""
  yield
  while Launch.running:
    Launch.running[-1].stop()


def pytest_addoption(parser):
  parser.addoption("--soak", action="store_true", default=False,
                   help="also run the long `soak` tests (20-minute soak, repeated kill trials)")


def pytest_collection_modifyitems(config, items):
  """`soak` tests run only with --soak or a -m expression that names them."""
  expression = config.option.markexpr or ""
  if config.getoption("--soak") or ("soak" in expression and "not soak" not in expression):
    return
  skip = pytest.mark.skip(reason="long soak test: run with --soak (or -m soak)")
  for item in items:
    if "soak" in item.keywords:
      item.add_marker(skip)
