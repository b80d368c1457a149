"""Runs one benchmark by name and writes its summary.json, report.md and plots.

  python -m benchmarks.run quick                       # a suite: benchmarks/suites/quick.gin
  python -m benchmarks.run fusion --gin_bindings='bench.fusion.rounds = 3' --results_dir=/tmp/r
  python -m benchmarks.run --suite_file=my_suite.gin   # a suite elsewhere
  python -m benchmarks.run fusion --report_only        # rewrite the report from the summary

Results go to ``--results_dir/<name>/``; models and data to ``--work_dir/<name>/`` (suites share
``--work_dir/data/``, reused across runs). ``registry`` lists the names and what they measure.
"""

import json
import os
import shlex
import sys
from typing import List

from absl import app
from absl import flags

from benchmarks import machine
from benchmarks import registry

flags.DEFINE_string("suite_file", None, "A suite gin file outside benchmarks/suites/ (instead "
                    "of a NAME).")
flags.DEFINE_multi_string("gin_file", [], "Gin files with the benchmark's settings.")
flags.DEFINE_multi_string("gin_bindings", [], "Settings, e.g. 'bench.Suite.train_rows = 100000' "
                          "or 'bench.fusion.rounds = 3'.")
flags.DEFINE_string("results_dir", registry.RESULTS_DIR,
                    "Results root; the benchmark writes <results_dir>/<name>/.")
DEFAULT_WORK_DIR = "/tmp/tf_codistill_bench"
flags.DEFINE_string("work_dir", DEFAULT_WORK_DIR,
                    "Models, runs and data (<work_dir>/<name>/; the suites' shared data in "
                    "<work_dir>/data/).")
flags.DEFINE_bool("force", False, "Rerun what is already recorded (suites' arms).")
flags.DEFINE_list("arms", None, "A suite's arms to run, and only those (the arms and tuning "
                  "runs they build on must be recorded): a suite too long for one invocation goes "
                  "on arm by arm. Writes no summary or report; an invocation without --arms "
                  "does, once every arm is recorded.")
flags.DEFINE_bool("report_only", False, "Measure nothing: rewrite the report (and a suite's "
                  "summary.json) from what is recorded.")
flags.DEFINE_string("child", None, "Internal: run one part of the benchmark in this process, "
                    "as its parent asked (JSON).")
flags.DEFINE_bool("allow_load", False,
                  "Measure even when the 1-minute load average stays above the number of cores; "
                  "every figure taken so is marked in the results.")
flags.DEFINE_float("settle_s", 180.0, "How long to wait, before the benchmark starts and before "
                   "each run of a suite that starts alone, for the 1-minute load average to fall "
                   "to the number of cores (0: not at all, e.g. in tests).")
flags.DEFINE_bool("index", True, "Rewrite <results_dir>/README.md, the index of every result "
                  "there, after the run (--noindex: a part of another benchmark's results).")
FLAGS = flags.FLAGS


def _shell_quote(value: str) -> str:
  """Shell quoting that keeps gin's single-quoted strings readable: "x = 'a'"."""
  if "'" in value and not set(value) & set('"$`\\!'):
    return f'"{value}"'
  return shlex.quote(value)


def _command(name: str, extra: List[str] = ()) -> str:
  """The command line that reproduces this run."""
  return " ".join(
      ["python -m benchmarks.run", f"--suite_file={FLAGS.suite_file}" if FLAGS.suite_file
       else name]
      + [f"--gin_file={f}" for f in FLAGS.gin_file]
      + [f"--gin_bindings={_shell_quote(b)}" for b in FLAGS.gin_bindings]
      + (["--work_dir=" + FLAGS.work_dir] if FLAGS.work_dir != DEFAULT_WORK_DIR else [])
      + list(extra))


def _quiet() -> machine.Quiet:
  """How long to wait for a quiet machine, and whether to go on without one (the flags)."""
  return machine.Quiet(allow_load=FLAGS.allow_load, settle_s=FLAGS.settle_s)


def _parse_gin(what: str, files: List[str]) -> None:
  import tf_codistill as tfc  # pylint: disable=g-import-not-at-top
  try:
    tfc.parse_gin(files, FLAGS.gin_bindings)
  except tfc.ConfigurationError as e:
    raise app.UsageError(f"{what}: {e}") from None


def _name(argv: List[str]) -> str:
  """The benchmark named on the command line (or the suite of --suite_file)."""
  known = ", ".join(registry.names())
  if FLAGS.suite_file:
    if len(argv) > 1:
      raise app.UsageError(f"give a NAME or --suite_file, not both (got {argv[1:]})")
    if not os.path.exists(FLAGS.suite_file):
      raise app.UsageError(f"--suite_file={FLAGS.suite_file}: no such file")
    return ""
  if len(argv) != 2:
    raise app.UsageError(f"give one benchmark NAME (one of {known}), or --suite_file "
                         f"(got {argv[1:]})")
  if argv[1] not in registry.names():
    raise app.UsageError(f"unknown benchmark {argv[1]!r}; benchmarks: {known}")
  return argv[1]


def run_registered(name: str) -> None:
  """Measures (or, with --report_only, reports) a registered benchmark."""
  if FLAGS.arms is not None:
    raise app.UsageError(f"--arms is for suites; {name} is a measuring benchmark without arms")
  benchmark = registry.load(name)
  if FLAGS.child is not None:
    benchmark.child(json.loads(FLAGS.child))
    return
  _parse_gin(name, FLAGS.gin_file)
  results_dir = os.path.join(FLAGS.results_dir, name)
  path = os.path.join(results_dir, "summary.json")
  ctx = registry.Context(name=name, results_dir=results_dir,
                         work_dir=os.path.join(FLAGS.work_dir, name), command=_command(name),
                         progress=lambda s: print(s, flush=True),
                         quiet=_quiet())
  if FLAGS.report_only:
    benchmark.write_report(_summary_so_far(benchmark, ctx, path), results_dir)
    print(f"wrote {os.path.join(results_dir, 'report.md')} and the index {_write_index()}")
    _write_docs(name)
    return
  if not benchmark.exclusive:
    summary = benchmark.measure(ctx)
  else:
    try:
      with machine.exclusive(f"benchmarks.run {name}", _quiet()) as session:
        summary = benchmark.measure(ctx)
        summary["machine"] = session.record()
    except (machine.MachineBusy, machine.MachineLoaded) as e:
      raise app.UsageError(str(e)) from None
  summary.setdefault("command", ctx.command)
  machine.write_json(path, summary, indent=1)
  benchmark.write_report(summary, results_dir)
  _write_index()
  print(f"wrote {path} and {os.path.join(results_dir, 'report.md')}")
  _write_docs(name)
  failed = benchmark.failure(summary) if benchmark.failure else None
  if failed:
    print(f"{name}: {failed}", file=sys.stderr)
    sys.exit(1)


def _summary_so_far(benchmark: registry.Benchmark, ctx: registry.Context, path: str) -> dict:
  """summary.json as recorded; for a benchmark that goes on across invocations and has no complete
  one yet, rebuilt from its records so far (running nothing) and written."""
  summary = machine.read_json(path) if os.path.exists(path) else None
  if benchmark.recorded is not None and (summary is None or summary.get("complete") is False):
    summary = {**benchmark.recorded(ctx), "command": ctx.command}
    machine.write_json(path, summary, indent=1)
  if summary is None:
    raise app.UsageError(f"{ctx.name}: nothing to report, {path} does not exist (run it "
                         "without --report_only)")
  return summary


def run_suite(name: str) -> None:
  """Trains (or, with --report_only, summarizes) a suite's arms."""
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  from benchmarks import runner  # pylint: disable=g-import-not-at-top
  from benchmarks import suite_spec as spec  # pylint: disable=g-import-not-at-top
  path = FLAGS.suite_file or os.path.join(registry.SUITES_DIR, f"{name}.gin")
  try:
    suite = spec.load_suite([path], FLAGS.gin_bindings)
    if not FLAGS.report_only:
      runner.check_tensorflow(suite)
    if FLAGS.arms is not None:
      if FLAGS.report_only:
        raise ValueError("--arms runs arms; --report_only runs none: give one of them")
      runner.check_arm_names(suite, FLAGS.arms)
  except (ValueError, TypeError) as e:
    raise app.UsageError(f"suite {path}: {e}") from None
  paths = spec.RunPaths(work_dir=os.path.join(FLAGS.work_dir, suite.name),
                        results_dir=os.path.join(FLAGS.results_dir, suite.name),
                        data_dir=os.path.join(FLAGS.work_dir, "data"))
  try:
    if FLAGS.report_only:
      summary = runner.summarize_recorded(suite, paths)
    else:
      with machine.exclusive(f"benchmarks.run {suite.name}", _quiet()):
        summary = runner.run_suite(suite, paths, force=FLAGS.force,
                                   progress=lambda line: print(line, flush=True),
                                   quiet=_quiet(), only=FLAGS.arms)
  except (machine.MachineBusy, machine.MachineLoaded) as e:
    raise app.UsageError(str(e)) from None
  if summary is None:
    print(f"recorded arms {FLAGS.arms} of {suite.name} in {paths.results_dir}/runs; the summary "
          f"and report are written by an invocation without --arms once every arm is recorded")
    return
  written = report.write_report(summary, paths.results_dir, _command(suite.name, ["--force"]))
  for goal, verdict in summary["goal_verdicts"].items():
    value = summary["goals"].get(goal)
    shown = "not reached" if value is None else f"{value:.4f}"
    print(f"goal {goal} = {shown} (goal {verdict['threshold'][0]} {verdict['threshold'][1]}: "
          f"{'met' if verdict['met'] else 'MISSED'})")
  index = _write_index()
  print(f"wrote {os.path.join(paths.results_dir, 'summary.json')}, {written['report'][0]}, "
        f"{len(written['plots'])} plot(s) and the index {index}")


def _write_index() -> str:
  if not FLAGS.index:
    return "(not rewritten: --noindex)"
  from benchmarks import results_index  # pylint: disable=g-import-not-at-top
  return results_index.write_index(FLAGS.results_dir)


def _write_docs(name: str) -> None:
  """Rewrites the measured section of docs/reliability.md after a benchmark it shows, when the
  summary went to the committed results (the doc reads those)."""
  from benchmarks import reliability_doc  # pylint: disable=g-import-not-at-top
  if (name in reliability_doc.SOURCES
      and os.path.abspath(FLAGS.results_dir) == os.path.abspath(registry.RESULTS_DIR)):
    print(f"rewrote the measured section of {reliability_doc.write()}")


def main(argv: List[str]) -> None:
  name = _name(argv)
  if name in registry.MODULES:
    run_registered(name)
  else:
    run_suite(name)


if __name__ == "__main__":
  app.run(main)
