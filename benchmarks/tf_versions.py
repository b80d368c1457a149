"""The figures that depend on TensorFlow, on two TensorFlow versions in one run: the teacher
throughput ratios (teacher_overhead), the fusion speedups (fusion), a short cluster step-time
run (cluster_step_times) and the input rates (parse_throughput: Parquet by pyarrow, and by
tensorflow-io where it loads), each benchmark run under one interpreter then the other (the order
alternates between benchmarks, so neither version always goes first on a warmer machine).

Ratios are measured within each version's own run (its arms interleaved), so the versions are
compared ratio to ratio; step times are compared across the two runs, seconds apart. Each run
writes its own summary (with its load and TensorFlow version) under ``--out_dir``; this writes
``comparison.json`` and ``report.md`` from them.

  .venv/bin/python -m benchmarks.tf_versions \\
      --pythons=.venv/bin/python,.venv-tf217/bin/python   # make test-io builds .venv-tf217
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable, Dict, List, Sequence

from absl import app
from absl import flags

from benchmarks import machine

# Each benchmark's command-line arguments at this run's sizes (a few minutes per version).
BENCHMARKS: Dict[str, List[str]] = {
    "teacher_overhead": ["--processes=2", "--rounds=4", "--steps=60"],
    "fusion": ["--models=ctr_adam,mlp_adam,lstm_lm_adam", "--modes=none,kernels,backward",
               "--jit=0", "--rounds=5", "--steps=10"],
    "cluster_step_times": ["--launches=1", "--rounds=2", "--steps=150", "--window_pairs=4"],
    "parse_throughput": ["--num_rows=100000"],
}


def define_flags() -> None:
  """The command line (defined only when run as a script, so that the module can be imported
  beside the other benchmarks)."""
  flags.DEFINE_list("pythons", [".venv/bin/python", ".venv-tf217/bin/python"],
                    "Interpreters of the environments to compare (each with tf-codistill "
                    "installed).")
  flags.DEFINE_list("benchmarks", list(BENCHMARKS), "Which of the benchmarks to run.")
  flags.DEFINE_string("out_dir", "benchmarks/results/tf_versions", "Where the summaries go.")
  flags.DEFINE_boolean("report_only", False, "Only rewrite comparison.json and report.md.")


FLAGS = flags.FLAGS


def tf_version(python: str) -> str:
  """The TensorFlow version installed for ``python`` (without importing TensorFlow)."""
  return subprocess.run([python, "-c", "import importlib.metadata as m; "
                         "print(m.version('tensorflow'))"], check=True, capture_output=True,
                        text=True).stdout.strip()


def part_path(out_dir: str, benchmark: str, version: str) -> str:
  return os.path.join(out_dir, f"{benchmark}_tf{version}.json")


def run_all(pythons: Sequence[str], benchmarks: Sequence[str], out_dir: str) -> None:
  """Runs every benchmark under every interpreter, the order alternating per benchmark."""
  versions = [tf_version(p) for p in pythons]
  if len(set(versions)) != len(versions):
    raise app.UsageError(f"--pythons must have different TensorFlow versions, got {versions}")
  os.makedirs(out_dir, exist_ok=True)
  for index, name in enumerate(benchmarks):
    order = list(zip(pythons, versions))
    for python, version in order[::-1] if index % 2 else order:
      out = part_path(out_dir, name, version)
      command = [python, "-m", f"benchmarks.{name}", *BENCHMARKS[name], f"--out={out}"]
      print(f"[tf_versions] TF {version}: {' '.join(command)}", flush=True)
      subprocess.run(command, check=True)


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
      with open(path) as f:
        summary = json.load(f)
      result.setdefault(name, {})[version] = {"figures": FIGURES[name](summary),
                                              "machine": summary.get("machine", {})}
  return result


def write_report(result: dict, versions: Sequence[str], path: str) -> None:
  """report.md: one table per benchmark, a column per TensorFlow version."""
  lines = ["# Figures that depend on TensorFlow, per version", "",
           "`python -m benchmarks.tf_versions` (module docstring: sizes and order). Ratios are",
           "within each version's own run; step times are across runs minutes apart.", ""]
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
  with open(path, "w") as f:
    f.write("\n".join(lines))


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  unknown = sorted(set(FLAGS.benchmarks) - set(BENCHMARKS))
  if unknown:
    raise app.UsageError(f"--benchmarks: unknown {unknown}; known: {sorted(BENCHMARKS)}")
  missing = [p for p in FLAGS.pythons if not os.path.exists(p)]
  if missing:
    raise app.UsageError(f"--pythons: {missing} do not exist (make test-io builds .venv-tf217)")
  versions = [tf_version(p) for p in FLAGS.pythons]
  if not FLAGS.report_only:
    run_all(FLAGS.pythons, FLAGS.benchmarks, FLAGS.out_dir)
  result = collect(FLAGS.out_dir, FLAGS.benchmarks, versions)
  machine.write_json(os.path.join(FLAGS.out_dir, "comparison.json"),
                     {"versions": versions, "benchmarks": result, "python": sys.version})
  write_report(result, versions, os.path.join(FLAGS.out_dir, "report.md"))
  print(open(os.path.join(FLAGS.out_dir, "report.md")).read())


if __name__ == "__main__":
  define_flags()
  app.run(main)
