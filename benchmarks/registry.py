"""Every benchmark by name, behind one entry point: ``python -m benchmarks.run NAME``.

A benchmark is either a suite (``benchmarks/suites/<name>.gin``: arms of training jobs, run by
``runner``) or a measuring module registered here. A module defines ``BENCHMARK =
registry.Benchmark(...)``: a gin-configurable ``measure(ctx)`` that returns the summary, a
``report`` that writes ``report.md`` from a summary, and optionally a ``child`` that runs one
measured part in a fresh process (``child_command``). ``benchmarks.run`` holds the machine
(``machine.exclusive``), records the load into the summary, writes
``<results_dir>/<name>/summary.json`` and the report, and updates the results index; settings
come as gin bindings of ``bench.<name>``, e.g. ``--gin_bindings='bench.fusion.rounds = 3'``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from benchmarks import machine

BENCHMARKS_DIR = os.path.dirname(os.path.abspath(__file__))
SUITES_DIR = os.path.join(BENCHMARKS_DIR, "suites")
RESULTS_DIR = os.path.join(BENCHMARKS_DIR, "results")

# name -> the module that defines it (imported only when that benchmark runs).
MODULES: Dict[str, str] = {
    "teacher_overhead": "benchmarks.teacher_overhead",
    "teacher_precision": "benchmarks.teacher_precision",
    "fusion": "benchmarks.fusion",
    "forward_fusion_ps": "benchmarks.forward_fusion_ps",
    "comm": "benchmarks.comm",
    "parse_throughput": "benchmarks.parse_throughput",
    "cluster_throughput": "benchmarks.cluster_throughput",
    "cluster_step_times": "benchmarks.cluster_step_times",
    "fault_trials": "benchmarks.fault_trials",
    "net_fault_trials": "benchmarks.net_fault_trials",
    "slow_link": "benchmarks.slow_link",
    "soak": "benchmarks.soak",
    "tf_versions": "benchmarks.tf_versions",
}


@dataclasses.dataclass(frozen=True)
class Context:
  """Where a benchmark writes and what it was asked: given to ``measure`` by the runner."""
  name: str
  results_dir: str  # <results root>/<name>: summary.json, report.md, plots
  work_dir: str  # <work root>/<name>: data, runs, anything a rerun may reuse
  command: str  # the command line that reproduces the run
  progress: Callable[[str], None] = print
  # How a benchmark of many runs (fault trials) waits for a quiet machine before each one (the
  # --allow_load/--settle_s flags); None: it does not wait (tests, a child process).
  quiet: Optional[machine.Quiet] = None

  @property
  def allow_load(self) -> bool:
    """Whether the benchmark was asked to go on above the cores' load (--allow_load)."""
    return self.quiet is not None and self.quiet.allow_load

  def settle(self, what: str) -> Tuple[float, Optional[bool]]:
    """Before one of the benchmark's runs (``what``): waits for a quiet machine as ``quiet``
    asks; (the 1-minute load, whether it is above the cores: None when not asked to wait)."""
    if self.quiet is None:
      return machine.load_1m(), None
    return self.quiet.settle(f"{self.name} {what}", self.progress)


@dataclasses.dataclass(frozen=True)
class Benchmark:
  """A registered benchmark: how it measures, reports, and runs a part in a child process.

  Its report.md is the common page (command, machine, goals, settings) titled ``title`` with
  ``tables(summary)`` as its body, or what ``report`` writes instead.
  """
  name: str
  measure: Callable[[Context], dict]
  title: str = ""
  tables: Optional[Callable[[dict], List[str]]] = None  # report.md's body, from a summary
  report: Optional[Callable[[dict, str], None]] = None  # (summary, results_dir): own report.md
  child: Optional[Callable[[dict], None]] = None  # one part, in a process of its own
  # False for a benchmark that runs other benchmarks (each of which holds the machine itself).
  exclusive: bool = True
  # What failed in a recorded run (e.g. a fault trial that did not recover), or None: the
  # summary and report are written, then the run exits 1 with this message.
  failure: Optional[Callable[[dict], Optional[str]]] = None
  # For a benchmark that goes on across invocations: its summary from what is recorded so far,
  # running nothing (``complete`` False and ``missing`` naming the rest while runs are missing).
  # ``--report_only`` writes it while the benchmark has no complete summary.json.
  recorded: Optional[Callable[[Context], dict]] = None

  def write_report(self, summary: dict, results_dir: str) -> None:
    """Writes ``results_dir``/report.md from ``summary``."""
    if self.report is not None:
      self.report(summary, results_dir)
      return
    from benchmarks import report  # pylint: disable=g-import-not-at-top
    report.write_benchmark_report(summary, results_dir, self.title or self.name,
                                  self.tables(summary) if self.tables else (),
                                  holds_machine=self.exclusive, name=self.name)


def check_choices(setting: str, values: Sequence, known: Sequence) -> None:
  """ValueError naming the gin ``setting`` (``bench.<name>.<parameter>``) unless ``values`` are
  one or more of ``known``."""
  unknown = [v for v in values if v not in known]
  if unknown or not values:
    raise ValueError(f"{setting}={list(values)!r}: give one or more of {list(known)}"
                     + (f" (unknown: {unknown})" if unknown else ""))


def suites() -> List[str]:
  """The suite names (``benchmarks/suites/<name>.gin``; files starting with _ are includes)."""
  return sorted(f[:-4] for f in os.listdir(SUITES_DIR)
                if f.endswith(".gin") and not f.startswith("_"))


def names() -> List[str]:
  """Every benchmark a user can run: the registered modules and the suites."""
  return sorted(set(MODULES) | set(suites()))


def load(name: str) -> Benchmark:
  """The registered benchmark ``name`` (its module imported now); KeyError for a suite or an
  unknown name."""
  module = importlib.import_module(MODULES[name])
  benchmark = module.BENCHMARK
  if benchmark.name != name:
    raise RuntimeError(f"{MODULES[name]} registers {benchmark.name!r}, not {name!r}")
  return benchmark


def child_command(name: str, spec: dict, python: str = sys.executable) -> List[str]:
  """The command that runs ``name``'s ``child(spec)`` in a fresh process (JSON ``spec``)."""
  return [python, "-m", "benchmarks.run", name, f"--child={json.dumps(spec, sort_keys=True)}"]


def command(name: str, bindings: List[str] = (), python: str = sys.executable,
            results_dir: Optional[str] = None, work_dir: Optional[str] = None) -> List[str]:
  """The command that runs benchmark ``name`` with gin ``bindings`` (as ``benchmarks.run``
  takes them), e.g. under another interpreter."""
  return ([python, "-m", "benchmarks.run", name]
          + ([f"--results_dir={results_dir}"] if results_dir else [])
          + ([f"--work_dir={work_dir}"] if work_dir else [])
          + [f"--gin_bindings={b}" for b in bindings])
