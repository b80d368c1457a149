"""Main of every Bazel py_test (bazel/defs.bzl): runs pytest on one file inside the runfiles.

`bazel test` passes the file and, optionally, `-m <markers>`; `--test_arg` adds pytest options.
The run fails if a project module was imported from outside the runfiles (say from a checkout
installed in the virtual environment): that is a missing `deps` entry.
"""

import os
import sys

import pytest

# Python put this script's real (symlink-resolved) directory first; keep imports in the runfiles.
del sys.path[0]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("tf_codistill", "data_pipelines", "benchmarks")


class ImportsFromRunfiles:

  def pytest_sessionfinish(self, session):
    strays = sorted(f"{name} ({module.__file__})" for name, module in list(sys.modules.items())
                    if name.split(".")[0] in PACKAGES and getattr(module, "__file__", None)
                    and not module.__file__.startswith(ROOT + os.sep))
    if strays:
      print(f"\nimported from outside the runfiles ({ROOT}); add the missing deps to the "
            "target:\n  " + "\n  ".join(strays), file=sys.stderr)
      session.exitstatus = pytest.ExitCode.TESTS_FAILED


def main(argv):
  args = [f"--rootdir={ROOT}", "-c", os.path.join(ROOT, "pyproject.toml"), "-p", "no:cacheprovider"]
  if os.environ.get("TEST_TMPDIR"):
    args.append(f"--basetemp={os.environ['TEST_TMPDIR']}/pytest")
  if os.environ.get("XML_OUTPUT_FILE"):
    args.append(f"--junitxml={os.environ['XML_OUTPUT_FILE']}")
  return pytest.main(args + argv, plugins=[ImportsFromRunfiles()])


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
