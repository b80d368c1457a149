"""Publishing fails for real (a full disk, a file-size limit, a permission error): the previous
published version stays intact and loadable, nothing partial is left, training goes on, and the
next publish after the cause is gone succeeds.

The failures are the kernel's, not mocks: a small tmpfs filled to the last byte (ENOSPC; needs
root), ``RLIMIT_FSIZE`` in a subprocess (EFBIG; any user), and a directory made unwritable
(EACCES/EPERM).
"""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tf_codistill.exchange import directory as exchange
from tf_codistill.exchange import publishing

from testing_utils import REPO
from testing_utils import make_unwritable
from testing_utils import small_filesystem
from testing_utils import small_net

SPEC = tf.TensorSpec([None, 4], tf.float32)


def _publisher(exchange_dir):
  student, local = small_net(seed=1), small_net()
  return publishing.ExchangePublisher(publishing.LocalCopy(student, local), exchange_dir, 0,
                                     publish_every_steps=10, input_spec=SPEC, keep_last=2)


def _assert_only_intact(exchange_dir, steps):
  """Exactly the versions ``steps`` are visible, each complete and loadable; nothing partial."""
  versions = exchange.list_versions(exchange_dir, 0)
  assert [v.step for v in versions] == steps
  for version in versions:
    exchange.verify(version)
    small_net().load_weights(os.path.join(version.path, "variables", "variables"))
  assert sorted(os.listdir(exchange.group_dir(exchange_dir, 0))) == [f"step_{s}" for s in
                                                                     sorted(steps)]


def _fill(directory):
  """Writes a file until the filesystem is full (to the last byte); returns its path."""
  path = os.path.join(directory, "filler")
  fd = os.open(path, os.O_WRONLY | os.O_CREAT)
  try:
    for chunk in (1 << 16, 1 << 10, 1):
      try:
        while True:
          os.write(fd, b"\0" * chunk)
      except OSError:
        pass
  finally:
    os.close(fd)
  return path


def test_disk_full_while_publishing_keeps_the_previous_version(tmp_path, caplog):
  with small_filesystem(str(tmp_path / "fs"), 4 << 20) as mounted:
    if mounted is None:
      pytest.skip("mounting a small tmpfs needs root (the RLIMIT_FSIZE test covers others)")
    exchange_dir = os.path.join(mounted, "exchange")
    publisher = _publisher(exchange_dir)
    publisher.on_begin(None, 0)
    publisher.on_step(None, 10, {})
    publisher._in_flight.result()
    filler = _fill(mounted)
    with caplog.at_level("ERROR"):
      publisher.on_step(None, 20, {})
      publisher._in_flight.result()
    assert publisher.failures == 1 and "publishing step 20" in caplog.text
    assert "No space left" in caplog.text or "RESOURCE_EXHAUSTED" in caplog.text.upper()
    _assert_only_intact(exchange_dir, [10])
    os.remove(filler)  # space again: the next publish works
    publisher.on_step(None, 30, {})
    publisher.on_end(None, 30)
    _assert_only_intact(exchange_dir, [30, 10])


_FSIZE_SCRIPT = r"""
import json, os, resource, signal, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import tensorflow as tf
from testing_utils import small_net
from tf_codistill.exchange import directory as exchange
root, spec = sys.argv[1], tf.TensorSpec([None, 4], tf.float32)
exchange.publish(small_net(), root, 0, 10, spec)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (2048, hard))
try:
  exchange.publish(small_net(seed=1), root, 0, 20, spec)
  error = None
except Exception as e:
  error = f"{type(e).__name__}: {e}"
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
exchange.publish(small_net(seed=2), root, 0, 30, spec)
print(json.dumps({"error": error}))
"""


def test_file_size_limit_while_publishing_keeps_the_previous_version(tmp_path):
  exchange_dir = str(tmp_path / "exchange")
  proc = subprocess.run([sys.executable, "-c", _FSIZE_SCRIPT, exchange_dir], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  error = json.loads(proc.stdout.strip().splitlines()[-1])["error"]
  assert error and "File too large" in error, error
  _assert_only_intact(exchange_dir, [30, 10])


def test_permission_error_while_publishing_keeps_the_previous_version(tmp_path, caplog):
  exchange_dir = str(tmp_path / "exchange")
  publisher = _publisher(exchange_dir)
  publisher.on_begin(None, 0)
  publisher.on_step(None, 10, {})
  publisher._in_flight.result()
  undo = make_unwritable(exchange.group_dir(exchange_dir, 0))
  if undo is None:
    pytest.skip("cannot make a directory unwritable on this machine")
  try:
    with caplog.at_level("ERROR"):
      publisher.on_step(None, 20, {})
      publisher._in_flight.result()
  finally:
    undo()
  assert publisher.failures == 1 and "publishing step 20" in caplog.text
  assert "ermission" in caplog.text or "not permitted" in caplog.text
  _assert_only_intact(exchange_dir, [10])
  publisher.on_step(None, 30, {})
  publisher.on_end(None, 30)
  _assert_only_intact(exchange_dir, [30, 10])
