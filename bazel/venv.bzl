"""A Python toolchain whose interpreter is the workspace's `.venv` (made by `make venv`)."""

_BUILD = """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "python3",
    interpreter_path = "{python}",
    python_version = "PY3",
    stub_shebang = "#!{python}",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":python3",
)

toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _venv_python_impl(rctx):
    workspace = rctx.path(Label("//:WORKSPACE")).dirname
    python = "%s/%s/bin/python3" % (workspace, rctx.attr.venv)
    if not rctx.path(python).exists:
        fail("%s not found: run `make venv` first (Bazel runs the tests with that Python)." % python)
    rctx.file("BUILD", _BUILD.format(python = python))

venv_python = repository_rule(
    implementation = _venv_python_impl,
    attrs = {"venv": attr.string(default = ".venv")},
    local = True,
)
