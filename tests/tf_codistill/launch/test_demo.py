"""The demo says which stack it runs on and prints its results as a table."""

import platform

import tensorflow as tf
import tf_keras

from tf_codistill.launch import demo


def test_the_first_line_names_the_versions_it_runs_on():
  line = demo.stack_line()
  assert f"TensorFlow {tf.__version__}," in line and f"tf_keras {tf_keras.__version__}," in line
  assert line.endswith(f"Python {platform.python_version()}")


def test_the_table_has_a_row_per_model_and_a_dash_for_a_model_without_teachers():
  rows = [{"model": "baseline", "steps": 10, "val_logloss": 0.5, "val_auc": 0.75,
           "examples_per_sec": 100.0},
          {"model": "codistill group 0", "steps": 10, "val_logloss": 0.49, "val_auc": 0.76,
           "examples_per_sec": 90.0, "teacher_loads": 3}]
  lines = demo.format_table(rows).splitlines()
  assert len(lines) == 4 and lines[2].split()[-1] == "-" and lines[3].split()[-1] == "3"
  assert "0.4900" in lines[3] and "0.7600" in lines[3]
