"""The figures that depend on TensorFlow, on two TensorFlow versions in one run: the teacher
throughput ratios (teacher_overhead), the fusion speedups (fusion), a short cluster step-time
run (cluster_step_times) and the input rates (parse_throughput: Parquet by pyarrow, and by
tensorflow-io where it loads), each benchmark run under one interpreter then the other (the order
alternates between benchmarks, so neither version always goes first on a warmer machine).

Ratios are measured within each version's own run (its arms interleaved), so the versions are
compared ratio to ratio; step times are compared across the two runs, seconds apart. Each run is
a ``benchmarks.run`` of its own (holding the machine, recording its load and TensorFlow version)
into ``<results_dir>/tf<version>/<benchmark>/``; the comparison is this benchmark's summary.

  .venv/bin/python -m benchmarks.run tf_versions \\
      --gin_bindings="bench.tf_versions.pythons = ['.venv/bin/python', '.venv-tf217/bin/python']"
  # make test-io builds .venv-tf217
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Dict, List, Sequence

import gin

from benchmarks import machine
from benchmarks import registry

# Each benchmark's settings at this run's sizes (a few minutes per version).
BENCHMARKS: Dict[str, List[str]] = {
    "teacher_overhead": ["bench.teacher_overhead.processes = 2",
                         "bench.teacher_overhead.rounds = 4", "bench.teacher_overhead.steps = 60"],
    "fusion": ["bench.fusion.models = ['ctr_adam', 'mlp_adam', 'lstm_lm_adam']",
               "bench.fusion.modes = ['none', 'kernels', 'backward']", "bench.fusion.jit = [False]",
               "bench.fusion.rounds = 5", "bench.fusion.steps = 10"],
    "cluster_step_times": ["bench.cluster_step_times.launches = 1",
                           "bench.cluster_step_times.rounds = 2",
                           "bench.cluster_step_times.steps = 150",
                           "bench.cluster_step_times.window_pairs = 4"],
    "parse_throughput": ["bench.parse_throughput.num_rows = 100000"],
}


def tf_version(python: str) -> str:
  """The TensorFlow version installed for ``python`` (without importing TensorFlow)."""
  return subprocess.run([python, "-c", "import importlib.metadata as m; "
                         "print(m.version('tensorflow'))"], check=True, capture_output=True,
                        text=True).stdout.strip()


def part_path(results_dir: str, benchmark: str, version: str) -> str:
  """Where ``benchmark``'s summary under TensorFlow ``version`` is."""
  return os.path.join(results_dir, f"tf{version}", benchmark, "summary.json")


def run_all(ctx: registry.Context, pythons: Sequence[str], benchmarks: Sequence[str]) -> List[str]:
  """Runs every benchmark under every interpreter (the order alternating per benchmark); returns
  the interpreters' TensorFlow versions."""
  versions = [tf_version(p) for p in pythons]
  if len(set(versions)) != len(versions):
    raise ValueError(f"bench.tf_versions.pythons must have different TensorFlow versions, got "
                     f"{versions}")
  for index, name in enumerate(benchmarks):
    order = list(zip(pythons, versions))
    for python, version in order[::-1] if index % 2 else order:
      command = registry.command(name, BENCHMARKS[name], python=python,
                                 results_dir=os.path.join(ctx.results_dir, f"tf{version}"),
                                 work_dir=os.path.join(ctx.work_dir, f"tf{version}"))
      # Parts of this benchmark's results: no results index of their own.
      command += ["--noindex"] + (["--allow_load"] if ctx.allow_load else [])
      ctx.progress(f"[tf_versions] TF {version}: {' '.join(command)}")
      subprocess.run(command, check=True)
  return versions


def _teacher_figures(summary: dict) -> Dict[str, float]:
  figures = dict(summary["goals"])
  figures["noise_floor (no_teacher_again_vs_no_teacher)"] = \
      summary["ratios"]["no_teacher_again_vs_no_teacher"]["median"]
  figures["no_teacher_step_ms"] = summary["step_times"]["codistill_no_teacher"]["median_ms"]
  return figures


def _fusion_figures(summary: dict) -> Dict[str, float]:
  figures = {f"best_fusion_speedup {model}": value
             for model, value in summary["best_fusion_speedup_by_model"].items()}
  for arm, row in summary["step_time"].items():
    if arm.endswith("/none"):
      figures[f"unfused_step_ms {arm}"] = row["ms_per_step_median"]
  return figures


def _cluster_figures(summary: dict) -> Dict[str, float]:
  figures = {}
  for group, result in summary["groups"].items():
    for arm, row in result["step_times"].items():
      figures[f"{group} {arm}_step_ms"] = row["median_ms"]
    for ratio, row in result["ratios"].items():
      figures[f"{group} {ratio}"] = row["median"]
  return figures


def _parse_figures(summary: dict) -> Dict[str, float]:
  figures = dict(summary["goals"])
  for name, row in summary["results"].items():
    if "examples_per_cpu_second" in row:
      figures[f"{name} examples_per_cpu_second"] = row["examples_per_cpu_second"]
  return figures


FIGURES: Dict[str, Callable[[dict], Dict[str, float]]] = {
    "teacher_overhead": _teacher_figures, "fusion": _fusion_figures,
    "cluster_step_times": _cluster_figures, "parse_throughput": _parse_figures}


def collect(out_dir: str, benchmarks: Sequence[str], versions: Sequence[str]) -> dict:
  """{benchmark: {version: {figures, machine}}} from the runs' summaries in ``out_dir``."""
  result: dict = {}
  for name in benchmarks:
    for version in versions:
      path = part_path(out_dir, name, version)
      if not os.path.exists(path):
        continue
      summary = machine.read_json(path)
      result.setdefault(name, {})[version] = {"figures": FIGURES[name](summary),
                                              "machine": summary.get("machine", {})}
  return result


def _tables(summary: dict) -> List[str]:
  """report.md's body: one table per benchmark, a column per TensorFlow version."""
  result, versions = summary["benchmarks"], summary["versions"]
  lines = ["Ratios are within each version's own run; step times are across runs minutes apart.",
           ""]
  for name, by_version in result.items():
    shown = [v for v in versions if v in by_version]
    lines += [f"## {name}", "", "| figure | " + " | ".join(f"TF {v}" for v in shown) + " |",
              "| --- |" + " --- |" * len(shown)]
    keys = sorted({k for v in shown for k in by_version[v]["figures"]})
    for key in keys:
      cells = [by_version[v]["figures"].get(key) for v in shown]
      lines.append(f"| {key} | " + " | ".join("" if c is None else f"{c:.4g}" for c in cells)
                   + " |")
    loads = [by_version[v]["machine"] for v in shown]
    lines.append("| load before / after | " + " | ".join(
        f"{m.get('load_avg_1m_before', float('nan')):.2f} / "
        f"{m.get('load_avg_1m_after', float('nan')):.2f}" for m in loads) + " |")
    lines.append("")
  return lines


@gin.configurable("tf_versions", module="bench", denylist=["ctx"])
def compare(ctx: registry.Context,
            pythons: Sequence[str] = (".venv/bin/python", ".venv-tf217/bin/python"),
            benchmarks: Sequence[str] = tuple(BENCHMARKS), rerun: bool = True) -> dict:
  """Runs each benchmark under each interpreter and tables their figures side by side.

  Args:
    ctx: the run's context.
    pythons: interpreters of the environments to compare (each with tf-codistill installed).
    benchmarks: which of ``BENCHMARKS`` to run.
    rerun: False: only collect the summaries already under ``ctx.results_dir``.
  """
  unknown = sorted(set(benchmarks) - set(BENCHMARKS))
  if unknown:
    raise ValueError(f"bench.tf_versions.benchmarks: unknown {unknown}; known: "
                     f"{sorted(BENCHMARKS)}")
  missing = [p for p in pythons if not os.path.exists(p)]
  if missing:
    raise ValueError(f"bench.tf_versions.pythons: {missing} do not exist (make test-io builds "
                     f".venv-tf217)")
  versions = run_all(ctx, pythons, benchmarks) if rerun else [tf_version(p) for p in pythons]
  return {"versions": versions, "python": sys.version,
          "benchmarks": collect(ctx.results_dir, benchmarks, versions),
          "config": {"pythons": list(pythons), "benchmarks": list(benchmarks)}}


# Each benchmark it runs holds the machine itself.
BENCHMARK = registry.Benchmark(
    "tf_versions", compare, tables=_tables, exclusive=False,
    title="Figures that depend on TensorFlow, per version")
