"""Every name of the public API resolves to what it documents, whatever was imported before."""

import importlib
import pkgutil
import subprocess
import sys
import types

import tf_codistill as tfc


def _subpackage_names():
  return {m.name for m in pkgutil.iter_modules(tfc.__path__)}


def test_no_public_name_is_also_a_submodule():
  # Importing tf_codistill.X binds the attribute X to the submodule, hiding a lazy public X.
  assert not set(tfc.__all__) & _subpackage_names()


def test_every_public_name_is_an_object_after_every_module_is_imported():
  # A fresh interpreter, so the order of imports is that of a user's script, not of the tests.
  code = ("import pkgutil, importlib, types, tf_codistill as tfc\n"
          "for m in pkgutil.walk_packages(tfc.__path__, 'tf_codistill.'):\n"
          "  if '.bin.' not in m.name: importlib.import_module(m.name)\n"
          "bad = [n for n in tfc.__all__ if isinstance(getattr(tfc, n), types.ModuleType)]\n"
          "print('modules:', bad)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "modules: []", out.stdout + out.stderr


def test_an_unknown_name_is_an_attribute_error():
  try:
    tfc.no_such_name  # noqa: B018
  except AttributeError as e:
    assert "no_such_name" in str(e)
  else:
    raise AssertionError("tfc.no_such_name resolved")


def test_launch_groups_is_the_launcher_function():
  launcher = importlib.import_module("tf_codistill.launch.launcher")
  assert tfc.launch_groups is launcher.launch_groups
  assert not isinstance(tfc.launch_groups, types.ModuleType)
