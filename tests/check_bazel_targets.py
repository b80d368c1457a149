"""Checks that every tests/**/test_*.py is the source of a py_test in a tests/ BUILD file.

    python tests/check_bazel_targets.py [REPO]

exits 1 and names each test file that no target runs, and each target whose pytest markers
select none of its file's tests (`make test` runs this check through
tests/test_check_bazel_targets.py). BUILD files are read as Python syntax: a target counts when
it is a call to `py_test` or `codistill_py_test` with literal `name`/`src`/`srcs`.
"""

import ast
import os
import sys

BUILD_NAMES = ("BUILD", "BUILD.bazel")


def _targets(build_file):
  """(test file relative to the BUILD file's directory, pytest -m markers or None) per py_test."""
  with open(build_file) as f:
    tree = ast.parse(f.read(), build_file)
  targets = []
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
    markers = kwargs.get("markers")
    markers = markers.value if isinstance(markers, ast.Constant) else None
    targets += [(v.value.lstrip(":"), markers) for v in values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)]
  return targets


def _walk(repo):
  """(every tests/**/test_*.py, {test file: [markers of each target running it]})."""
  test_files, targets = [], {}
  for dirpath, dirnames, filenames in os.walk(os.path.join(repo, "tests")):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
    for build in BUILD_NAMES:
      if build in filenames:
        for source, markers in _targets(os.path.join(dirpath, build)):
          targets.setdefault(os.path.normpath(os.path.join(dirpath, source)), []).append(markers)
    test_files += [os.path.join(dirpath, f) for f in filenames
                   if f.startswith("test_") and f.endswith(".py")]
  return test_files, targets


def missing_targets(repo):
  """Paths (relative to repo) of tests/**/test_*.py files that no py_test runs."""
  test_files, targets = _walk(repo)
  return sorted(os.path.relpath(f, repo) for f in test_files if os.path.normpath(f) not in targets)


def _marks(decorators):
  """Names of the `pytest.mark.<name>` among decorators (or a module's `pytestmark` value)."""
  names = set()
  for node in decorators:
    node = node.func if isinstance(node, ast.Call) else node
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"):
      names.add(node.attr)
  return names


def _test_marks(test_file):
  """The set of marks of each test function in a file (module, class and function marks)."""
  with open(test_file) as f:
    tree = ast.parse(f.read(), test_file)
  module = set()
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark"
                                            for t in node.targets):
      module |= _marks(node.value.elts if isinstance(node.value, ast.List) else [node.value])
  tests = []
  for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
      tests.append(module | _marks(node.decorator_list))
    elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
      tests += [module | _marks(node.decorator_list) | _marks(m.decorator_list)
                for m in node.body
                if isinstance(m, ast.FunctionDef) and m.name.startswith("test")]
  return tests


class _Marks(dict):

  def __missing__(self, name):
    return False


def _selects(markers, marks):
  """Whether a pytest `-m` expression (and/or/not over mark names) selects a test with marks."""
  return bool(eval(compile(markers, "<markers>", "eval"), {"__builtins__": {}},  # pylint: disable=eval-used
                   _Marks((m, True) for m in marks)))


def empty_targets(repo):
  """'file (-m markers)' for each target whose markers select none of its file's tests.

  pytest exits 5 (no tests collected) on such a target, so `bazel test` fails on it.
  """
  test_files, targets = _walk(repo)
  empty = []
  for test_file in test_files:
    tests = _test_marks(test_file)
    empty += [f"{os.path.relpath(test_file, repo)} (-m '{markers}')"
              for markers in targets.get(os.path.normpath(test_file), [])
              if markers and not any(_selects(markers, marks) for marks in tests)]
  return sorted(empty)


def main(argv):
  repo = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  missing, empty = missing_targets(repo), empty_targets(repo)
  if missing:
    print("test files without a Bazel py_test target (add a codistill_py_test to tests/BUILD, "
          "see README 'Bazel'):\n  " + "\n  ".join(missing), file=sys.stderr)
  if empty:
    print("py_test targets whose markers select no test of their file (pytest exits 5; give the "
          "file a test they select, or tag the target like its tests):\n  " + "\n  ".join(empty),
          file=sys.stderr)
  return 1 if missing or empty else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
