"""Checks that every tests/**/test_*.py is the source of a py_test in a tests/ BUILD file.

    python tests/check_bazel_targets.py [REPO]

exits 1 and names each test file that no target runs (`make test` runs this check through
tests/test_check_bazel_targets.py). BUILD files are read as Python syntax: a target counts when
it is a call to `py_test` or `codistill_py_test` with literal `name`/`src`/`srcs`.
"""

import ast
import os
import sys

BUILD_NAMES = ("BUILD", "BUILD.bazel")


def _sources(build_file):
  """Test files, relative to the BUILD file's directory, that its py_test targets run."""
  with open(build_file) as f:
    tree = ast.parse(f.read(), build_file)
  sources = set()
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("py_test", "codistill_py_test")):
      continue
    kwargs = {k.arg: k.value for k in node.keywords if k.arg}
    name = kwargs.get("name")
    if "src" in kwargs:
      values = [kwargs["src"]]
    elif "srcs" in kwargs and isinstance(kwargs["srcs"], ast.List):
      values = kwargs["srcs"].elts
    elif isinstance(name, ast.Constant) and node.func.id == "codistill_py_test":
      values = [ast.Constant(name.value + ".py")]
    else:
      values = []
    sources.update(v.value.lstrip(":") for v in values
                   if isinstance(v, ast.Constant) and isinstance(v.value, str))
  return sources


def missing_targets(repo):
  """Paths (relative to repo) of tests/**/test_*.py files that no py_test runs."""
  covered, test_files = set(), []
  for dirpath, dirnames, filenames in os.walk(os.path.join(repo, "tests")):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
    for build in BUILD_NAMES:
      if build in filenames:
        covered.update(os.path.normpath(os.path.join(dirpath, s))
                       for s in _sources(os.path.join(dirpath, build)))
    test_files += [os.path.join(dirpath, f) for f in filenames
                   if f.startswith("test_") and f.endswith(".py")]
  return sorted(os.path.relpath(f, repo) for f in test_files if os.path.normpath(f) not in covered)


def main(argv):
  repo = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  missing = missing_targets(repo)
  if missing:
    print("test files without a Bazel py_test target (add a codistill_py_test to tests/BUILD, "
          "see README 'Bazel'):\n  " + "\n  ".join(missing), file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
