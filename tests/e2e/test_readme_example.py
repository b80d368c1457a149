"""The README's "Use it from Python" example, executed as written (one process per group)."""

import json
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

from testing_utils import REPO
from testing_utils import run

pytestmark = pytest.mark.e2e


def readme_example() -> str:
  """The code block between the README's python-example markers."""
  with open(os.path.join(REPO, "README.md")) as f:
    text = f.read()
  block = re.search(r"<!-- python-example: start -->\n```python\n(.*?)```\n"
                    r"<!-- python-example: end -->", text, re.S)
  assert block, "README.md lost its python-example markers"
  return block.group(1)


def test_readme_example_codistills_two_groups_and_exports(tmp_path):
  code = readme_example()
  assert 12 <= len(code.strip().splitlines()) <= 25
  script = tmp_path / "example.py"
  # The example as written, then its history for the test to read.
  script.write_text(code + "\nimport json; print('HISTORY', json.dumps(history.history))\n")
  exchange_dir = tmp_path / "exchange"
  histories = {}
  # Group 1 first, then group 0, which finds group 1's versions from its first poll on; then
  # group 1 again, which finds group 0's: each run after the first distills from a peer.
  for group in (1, 0, 1):
    done = run([sys.executable, str(script), str(group), str(exchange_dir)], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    histories[group] = json.loads(re.search(r"^HISTORY (.*)$", done.stdout, re.M).group(1))
  for group in (0, 1):
    history = histories[group]
    assert len(history["loss"]) == 4
    assert history["distill_loss"][-1] > 0 and history["alpha"][-1] == 1.0, history
    assert history["teacher_staleness"][-1] >= 0, history
    assert history["task_loss"][-1] < history["task_loss"][0], history
    versions = sorted(int(v.split("_")[1]) for v in os.listdir(exchange_dir / f"group_{group}")
                      if v.startswith("step_"))
    assert versions[-1] == 200 and len(versions) <= 2, versions
    served = tf.saved_model.load(str(tmp_path / f"model_{group}"))
    logits = served.signatures["serving_default"](inputs=tf.zeros([3, 20]))["logits"]
    assert logits.shape == (3, 1) and np.all(np.isfinite(logits.numpy()))
