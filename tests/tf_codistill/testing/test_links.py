"""Tests of tf_codistill/testing/links.py: one direction of a slow link."""

import threading
import time

from tf_codistill.testing import links


def test_no_cap_does_not_wait():
  link = links.Link()
  start = time.monotonic()
  for _ in range(100):
    link.carry(1 << 20, None)
    link.carry(1 << 20, 0)
  assert time.monotonic() - start < 0.5


def test_transfers_share_the_link_one_after_another():
  # Four threads send 2,000 bytes each over a 40,000 byte/s link: the last one can only be
  # through after 8,000 bytes crossed, 0.2 s, however the threads interleave.
  link = links.Link()
  done = []

  def send():
    link.carry(2000, 40_000)
    done.append(time.monotonic())

  start = time.monotonic()
  threads = [threading.Thread(target=send) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  finished = sorted(d - start for d in done)
  assert finished[-1] >= 0.2 - 1e-3
  # Each transfer waits for those queued before it: the i-th done no earlier than (i+1) * 50 ms.
  for i, t in enumerate(finished):
    assert t >= 0.05 * (i + 1) - 1e-3


def test_an_idle_link_does_not_bank_credit():
  link = links.Link()
  link.carry(100, 1000)  # 0.1 s
  time.sleep(0.2)
  start = time.monotonic()
  link.carry(100, 1000)
  assert time.monotonic() - start >= 0.1 - 1e-3
