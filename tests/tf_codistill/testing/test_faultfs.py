"""The faulty directory is a real file system: files pass through to the backing directory
until it is told to be slow, read-only, full, vanished, stalled or capped in bandwidth, and each
fault shows on the very next operation."""

import errno
import os
import threading
import time

import pytest

from tf_codistill.testing import faultfs

pytestmark = pytest.mark.skipif(faultfs.unavailable() is not None,
                                reason=str(faultfs.unavailable()))


@pytest.fixture
def mounted(tmp_path):
  with faultfs.FaultyDirectory(str(tmp_path / "backing"), str(tmp_path / "mount")) as directory:
    yield directory


def _write(path, data=b"x"):
  with open(path, "wb") as f:
    f.write(data)


def test_files_pass_through_and_renames_are_atomic(mounted):
  _write(os.path.join(mounted.path, "a.tmp"), b"payload")
  os.rename(os.path.join(mounted.path, "a.tmp"), os.path.join(mounted.path, "a"))
  assert open(os.path.join(mounted.backing, "a"), "rb").read() == b"payload"
  os.makedirs(os.path.join(mounted.path, "d", "e"))
  assert sorted(os.listdir(mounted.path)) == ["a", "d"]


@pytest.mark.parametrize("mode, code", [("read_only", errno.EROFS), ("full", errno.ENOSPC)])
def test_writes_fail_while_reads_go_on(mounted, mode, code):
  _write(os.path.join(mounted.path, "a"), b"kept")
  mounted.set(mode)
  with pytest.raises(OSError) as raised:
    _write(os.path.join(mounted.path, "b"))
  assert raised.value.errno == code
  with pytest.raises(OSError):
    os.mkdir(os.path.join(mounted.path, "d"))
  assert open(os.path.join(mounted.path, "a"), "rb").read() == b"kept"
  mounted.set("ok")
  _write(os.path.join(mounted.path, "b"))


def test_a_vanished_directory_is_empty_until_it_is_back(mounted):
  _write(os.path.join(mounted.path, "a"), b"kept")
  mounted.set("vanished")
  assert os.listdir(mounted.path) == []
  with pytest.raises(FileNotFoundError):
    open(os.path.join(mounted.path, "a"), "rb")
  mounted.set("ok")
  assert open(os.path.join(mounted.path, "a"), "rb").read() == b"kept"


def test_slow_and_capped_operations_take_their_time(mounted):
  mounted.set("slow", delay_s=0.3)
  start = time.monotonic()
  os.stat(mounted.path)
  assert time.monotonic() - start >= 0.3
  mounted.set("ok", bytes_per_s=2e6)
  start = time.monotonic()
  _write(os.path.join(mounted.path, "big"), b"\0" * 1_000_000)
  assert time.monotonic() - start >= 0.45  # 1 MB at 2 MB/s
  assert os.path.getsize(os.path.join(mounted.backing, "big")) == 1_000_000


def test_bytes_read_and_written_through_it_are_counted_and_kept_after_it_closes(tmp_path):
  directory = faultfs.FaultyDirectory(str(tmp_path / "backing"), str(tmp_path / "mount"))
  try:
    _write(os.path.join(directory.path, "a"), b"\1" * 300_000)
    assert open(os.path.join(directory.path, "a"), "rb").read() == b"\1" * 300_000
    _write(os.path.join(directory.backing, "b"), b"\2" * 1000)  # beside it: not counted
  finally:
    directory.close()
  assert directory.bytes_moved() == {"read": 300_000, "written": 300_000}
  assert not os.path.exists(faultfs.bytes_path(directory.control))


def test_a_stalled_directory_blocks_every_operation_until_it_answers_again(mounted):
  mounted.set("stalled")
  done = threading.Event()
  threading.Thread(target=lambda: (os.listdir(mounted.path), done.set()), daemon=True).start()
  assert not done.wait(1.0)
  mounted.set("ok")
  assert done.wait(10.0)


def test_an_unknown_mode_is_refused(mounted):
  with pytest.raises(ValueError, match="mode='broken'"):
    mounted.set("broken")
