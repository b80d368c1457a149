"""What benchmarks import from the library: the public API, the documented extension points, and
the one component a benchmark measures (CONTRIBUTING.md, "Adding a benchmark")."""

import ast
import glob
import os

from testing_utils import REPO

# The public API and the extension points CONTRIBUTING.md documents for every benchmark.
EXTENSION_POINTS = {
    "tf_codistill",  # import tf_codistill as tfc
    "tf_codistill.layout",  # where a run writes what
    "tf_codistill.losses",  # the tasks' losses and output kinds
    "tf_codistill.models.ctr", "tf_codistill.models.lm", "tf_codistill.models.resnet",
    "tf_codistill.exchange.directory",  # a SavedModel published as a peer's version
    "tf_codistill.launch.launcher",  # process handles: the fault and soak benchmarks
    "tf_codistill.launch.gin_config",  # the gin search path, as the library reads gin files
    "tf_codistill.training.train_config",  # RENAMED: recorded configurations under old names
    "tf_codistill.launch.demo",  # the demo's generated data
    # Faults made for real and local clusters, for tests and the fault benchmarks.
    "tf_codistill.testing.faultfs", "tf_codistill.testing.netfaults",
    "tf_codistill.testing.local_cluster", "tf_codistill.testing.json_files",
}
# A benchmark that measures one component imports that component.
MEASURED = {
    "fusion": {"tf_codistill.optim.fusion", "tf_codistill.optim.fused_models"},
    "traffic": {"tf_codistill.optim.fusion"},  # the gradients' shapes, from fusion's probe
    "lean_exchange": {"tf_codistill.exchange.lean_versions", "tf_codistill.exchange.weight_codecs"},
    "teacher_overhead": {"tf_codistill.teachers.quantization"},
    "cluster_step_times": {"tf_codistill.step_hooks", "tf_codistill.teachers.pool",
                           "tf_codistill.exchange.config"},
    "step_times": {"tf_codistill.training.step_timing"},
}


def _library_imports(path):
  """The tf_codistill modules a file imports (``from tf_codistill.x import y`` counts as x.y
  when y is a module, else as x)."""
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.split(".")[0] == "tf_codistill"}
    elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tf_codistill":
      for alias in node.names:
        module = f"{node.module}.{alias.name}"
        path = os.path.join(REPO, *module.split("."))
        found.add(module if os.path.exists(path) or os.path.exists(path + ".py") else node.module)
  return found


def test_benchmarks_import_the_public_api_extension_points_and_what_they_measure():
  files = sorted(glob.glob(os.path.join(REPO, "benchmarks", "*.py")))
  assert len(files) > 30
  wrong = {}
  for path in files:
    name = os.path.basename(path)[:-3]
    extra = _library_imports(path) - EXTENSION_POINTS - MEASURED.get(name, set())
    if extra:
      wrong[name] = sorted(extra)
  assert not wrong, f"benchmarks importing library internals (see CONTRIBUTING.md): {wrong}"


def test_the_check_sees_an_internal_import(tmp_path):
  path = tmp_path / "bench.py"
  path.write_text("from tf_codistill.teachers import pool\nfrom tf_codistill import layout\n"
                  "import tf_codistill as tfc\n")
  assert _library_imports(str(path)) == {"tf_codistill.teachers.pool", "tf_codistill.layout",
                                         "tf_codistill"}
