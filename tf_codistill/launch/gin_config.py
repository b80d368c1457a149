"""Gin parsing shared by the binaries: search paths, and errors that say what to fix."""

from __future__ import annotations

import collections.abc
import contextlib
import inspect
import logging
import os
import re
import typing
from typing import Any, Iterator, List, Optional, Sequence

import gin

# Importing these registers their configurables with gin.
from data_pipelines import adult  # noqa: F401
from data_pipelines import criteo  # noqa: F401
from data_pipelines import images  # noqa: F401
from data_pipelines import text_lm  # noqa: F401
from data_pipelines import token_lm  # noqa: F401
from tf_codistill import errors
from tf_codistill import losses  # noqa: F401
from tf_codistill.models import ctr  # noqa: F401
from tf_codistill.models import lm  # noqa: F401
from tf_codistill.models import mlp  # noqa: F401
from tf_codistill.models import resnet  # noqa: F401
from tf_codistill.teachers import spec  # noqa: F401
from tf_codistill.training import strategies  # noqa: F401
from tf_codistill.training import tasks  # noqa: F401
from tf_codistill.training import train_config
from tf_codistill.training import trainer  # noqa: F401

REPO_GIN_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "gin")


class ConfigError(errors.ConfigurationError):
  """A gin file or binding that cannot be applied."""


def _is_include_probe(record: logging.LogRecord) -> bool:
  """gin logs an ERROR for every search-path candidate of an `include` that is not there."""
  return (record.name == "root"
          and record.pathname.endswith(os.path.join("gin", "resource_reader.py"))
          and record.getMessage().startswith("Path not found"))


@contextlib.contextmanager
def _quiet_include_probes() -> Iterator[None]:
  """Drops gin's per-candidate 'Path not found' errors; a real missing include still raises."""
  log_filter = lambda record: not _is_include_probe(record)
  root = logging.getLogger()
  root.addFilter(log_filter)
  try:
    yield
  finally:
    root.removeFilter(log_filter)


def search_path(gin_files: Sequence[str]) -> List[str]:
  """Where an `include` in these files is looked for, in order: next to each of them, under
  gin/, the repository, the working directory ('')."""
  own = [os.path.dirname(os.path.abspath(p)) for p in gin_files]
  return list(dict.fromkeys(own + [REPO_GIN_DIR, os.path.dirname(REPO_GIN_DIR)])) + [""]


@contextlib.contextmanager
def _search_path(gin_files: Sequence[str]) -> Iterator[None]:
  """Lets `include`s resolve along ``search_path`` and nowhere else: gin keeps its search path
  for the process, so a directory from an earlier parse could otherwise shadow a file of the
  same name."""
  prefixes = gin.config._LOCATION_PREFIXES  # gin 0.5.0 (pinned): no API removes a prefix
  saved = list(prefixes)
  prefixes[:] = search_path(gin_files)
  try:
    yield
  finally:
    prefixes[:] = saved


def gin_value(name: str) -> Any:
  """The value bound to gin parameter ``name`` (e.g. ``tfc.Data.eval_files``) in the parsed
  config (for ``@f`` or ``@C()``, the function or class), or None when unbound."""
  try:
    value = gin.query_parameter(name)
  except ValueError:
    return None
  return value.configurable.wrapper if isinstance(value, gin.config.ConfigurableReference) \
      else value


def parse_gin(gin_files: Sequence[str] = (), gin_bindings: Sequence[str] = ()) -> None:
  """Parses gin files and bindings; `include`s resolve next to each file and under gin/."""
  for path in list(gin_files):
    if not os.path.exists(path) and os.path.exists(os.path.join(REPO_GIN_DIR, path)):
      continue
    if not os.path.exists(path):
      raise ConfigError(f"--gin_file={path}: no such file")
  try:
    with _quiet_include_probes(), _search_path(gin_files):
      gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings),
                                          finalize_config=False)
  except (ValueError, TypeError, SyntaxError, IOError) as e:
    renamed = re.search(r"'trainer\.train' doesn't have a parameter named '(\w+)'", str(e))
    if renamed:
      train_config.check_renamed([renamed.group(1)])
    if re.search(r"'(?:tfc\.)?Exchange' doesn't have a parameter named 'teacher_precision'",
                 str(e)):
      raise ConfigError("tfc.Exchange.teacher_precision is now tfc.TeacherSpec.precision (the "
                        "teachers belong to the model): rename the binding") from e
    if re.search(r"No configurable matching '(?:launcher\.)?group_shape'", str(e)):
      raise ConfigError("launcher.group_shape.workers_per_group and ps_per_group are now "
                        "tfc.Group.workers_per_group and ps_per_group (the group's shape is "
                        "tfc.Group's): rename the binding") from e
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ConfigError(f"gin configuration error: {first}") from e
  check_bound_types()


def check_bound_types() -> None:
  """Raises ConfigError naming the first gin binding whose literal value does not fit the
  parameter's type hint (int, float, bool, str, Optional/Union of them, sequences of them)."""
  for (scope, selector), params in list(gin.config._CONFIG.items()):  # gin 0.5.0 (pinned)
    configurable = gin.config._REGISTRY.get_match(selector)
    if configurable is None or not params:
      continue
    function = configurable.wrapped
    target = function.__init__ if inspect.isclass(function) else function
    try:
      hints = typing.get_type_hints(target)
    except Exception:  # unresolvable annotations: nothing to check against
      continue
    for name, raw in params.items():
      value = _literal(raw)
      if name not in hints or value is _UNCHECKED:
        continue
      expected = _mismatch(value, hints[name])
      if expected:
        where = f"{scope}/{selector}" if scope else selector
        via = (f" (through %{raw.scoped_selector.split('/')[0]})"
               if isinstance(raw, gin.config.ConfigurableReference) else "")
        raise ConfigError(f"gin binding {where}.{name} = {value!r}{via}: expected {expected}, "
                          f"got {type(value).__name__}; fix it in the gin file or --gin_bindings")


def config_text() -> str:
  """The parsed configuration as one self-contained gin file (includes and macros resolved into
  its bindings), so that processes started later read exactly what was checked.

  Raises:
    ConfigError: a binding gin cannot write back as text (a Python object bound from code),
      naming it: it would be silently missing from the file.
  """
  for (scope, selector), params in list(gin.config._CONFIG.items()):  # gin 0.5.0 (pinned)
    for name, value in params.items():
      if not gin.config._is_literally_representable(value):
        where = f"{scope}/{selector}" if scope else selector
        raise ConfigError(f"gin binding {where}.{name} = {value!r} cannot be written as gin "
                          "text for the job's tasks: bind it in a gin file or --gin_bindings, "
                          "or through a configurable reference (@name)")
  return gin.config_str()


_UNCHECKED = object()


def _literal(value: Any) -> Any:
  """A binding's value, with macros resolved; _UNCHECKED for other references (@fn, @fn())."""
  if isinstance(value, gin.config.ConfigurableReference):
    if value.configurable.wrapped is gin.config.macro:
      try:
        return _literal(gin.query_parameter(f"{value.scoped_selector}.value"))
      except ValueError:
        return _UNCHECKED
    return _UNCHECKED
  if isinstance(value, (list, tuple)):
    items = [_literal(v) for v in value]
    return _UNCHECKED if any(v is _UNCHECKED for v in items) else type(value)(items)
  return value


def _mismatch(value: Any, hint: Any) -> Optional[str]:
  """None if ``value`` fits ``hint`` (or the hint cannot be checked), else what was expected."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if hint is Any or isinstance(hint, typing.TypeVar):
    return None
  if origin is typing.Union or (origin is not None and type(hint).__name__ == "UnionType"):
    results = [_mismatch(value, arm) for arm in args]
    if any(r is None for r in results):
      return None
    return " or ".join(r for r in results if r is not None)
  if hint is type(None):
    return None if value is None else "None"
  if hint is bool:
    return None if isinstance(value, bool) else "a bool (True/False)"
  if hint is int:
    return None if isinstance(value, int) and not isinstance(value, bool) else "an int"
  if hint is float:
    return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
  if hint is str:
    return None if isinstance(value, str) else "a string"
  if origin in (list, tuple, collections.abc.Sequence):
    what = f"a list ({', '.join(map(_name, args)) or 'any'} items), e.g. [...]"
    if not isinstance(value, (list, tuple)):
      return what
    item = args[0] if args and (origin is not tuple or len(args) == 2 and args[1] is Ellipsis) \
        else None
    if item is not None and any(_mismatch(v, item) for v in value):
      return what
    return None
  return None  # classes, callables, tensors: not checked here


def _name(hint: Any) -> str:
  return getattr(hint, "__name__", str(hint))
