"""The check that every test file has a Bazel py_test (tests/check_bazel_targets.py)."""

import os

import check_bazel_targets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(root, path, text=""):
  path = os.path.join(root, path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


def test_every_test_file_in_this_repo_has_a_py_test():
  assert check_bazel_targets.missing_targets(REPO) == []


def test_a_test_file_without_a_target_is_named(tmp_path, capsys):
  _write(tmp_path, "tests/BUILD",
         'load("//bazel:defs.bzl", "codistill_py_test")\n'
         'codistill_py_test(name = "a/test_x", deps = ["//tf_codistill"])\n')
  _write(tmp_path, "tests/a/test_x.py")
  _write(tmp_path, "tests/a/test_y.py")
  _write(tmp_path, "tests/a/helper.py")
  assert check_bazel_targets.missing_targets(str(tmp_path)) == ["tests/a/test_y.py"]
  assert check_bazel_targets.main(["check", str(tmp_path)]) == 1
  assert "tests/a/test_y.py" in capsys.readouterr().err


def test_src_srcs_and_nested_build_files_count(tmp_path):
  _write(tmp_path, "tests/BUILD",
         'codistill_py_test(name = "split_e2e", src = "a/test_x.py", markers = "e2e")\n'
         'py_test(name = "plain", srcs = [":a/test_y.py", "runner.py"], main = "runner.py")\n')
  _write(tmp_path, "tests/a/test_x.py",
         "import pytest\n\n@pytest.mark.e2e\ndef test_it():\n  pass\n")
  _write(tmp_path, "tests/a/test_y.py")
  _write(tmp_path, "tests/b/BUILD.bazel", 'codistill_py_test(name = "test_z")\n')
  _write(tmp_path, "tests/b/test_z.py")
  assert check_bazel_targets.missing_targets(str(tmp_path)) == []
  assert check_bazel_targets.main(["check", str(tmp_path)]) == 0


def test_a_target_whose_markers_select_no_test_is_named(tmp_path, capsys):
  _write(tmp_path, "tests/BUILD",
         'codistill_py_test(name = "a/test_x", markers = "not cluster")\n'
         'codistill_py_test(name = "x_e2e", src = "a/test_x.py", markers = "e2e or cluster")\n'
         'codistill_py_test(name = "a/test_y", markers = "not e2e and not cluster")\n')
  _write(tmp_path, "tests/a/test_x.py", "import pytest\n\n@pytest.mark.cluster\n"
                                        "def test_on_a_cluster():\n  pass\n")
  _write(tmp_path, "tests/a/test_y.py",
         "import pytest\n\npytestmark = pytest.mark.e2e\n\n"
         "class TestSome:\n\n  def test_one(self):\n    pass\n")
  assert check_bazel_targets.empty_targets(str(tmp_path)) == [
      "tests/a/test_x.py (-m 'not cluster')", "tests/a/test_y.py (-m 'not e2e and not cluster')"]
  assert check_bazel_targets.main(["check", str(tmp_path)]) == 1
  assert "tests/a/test_x.py (-m 'not cluster')" in capsys.readouterr().err
  _write(tmp_path, "tests/a/test_x.py", "import pytest\n\n@pytest.mark.cluster\n"
                                        "def test_on_a_cluster():\n  pass\n\n"
                                        "def test_alone():\n  pass\n")
  assert check_bazel_targets.empty_targets(str(tmp_path)) == [
      "tests/a/test_y.py (-m 'not e2e and not cluster')"]


def test_every_target_in_this_repo_selects_a_test():
  assert check_bazel_targets.empty_targets(REPO) == []
