"""Runs a benchmark suite and writes its summary.json, Markdown report and plots.

  python -m benchmarks.run --suite=quick
  python -m benchmarks.run --suite=codistill_vs_sync --work_dir=/tmp/bench

A suite is ``benchmarks/suites/<suite>.gin`` (or any file given by --suite_file). Results go to
``--results_dir/<suite>/``; models to ``--work_dir/<suite>/``, data to ``--work_dir/data/`` (shared
by the suites and reused across runs).
"""

import os
import shlex
import sys

from absl import app
from absl import flags

from benchmarks import machine
from benchmarks import report
from benchmarks import runner
from tf_codistill.launch import gin_config as config

SUITES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "suites")
flags.DEFINE_string("suite", None, "Suite name: benchmarks/suites/<suite>.gin.")
flags.DEFINE_string("suite_file", None, "A suite gin file elsewhere (instead of --suite).")
flags.DEFINE_multi_string("gin_bindings", [], "Extra bindings for the suite, e.g. "
                          "'bench.Suite.train_rows = 100000'.")
flags.DEFINE_string("results_dir", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                "results"),
                    "Results root; the suite writes <results_dir>/<suite>/.")
DEFAULT_WORK_DIR = "/tmp/tf_codistill_bench"
flags.DEFINE_string("work_dir", DEFAULT_WORK_DIR,
                    "Models and exchange directories (<work_dir>/<suite>/) and the data the suites "
                    "share (<work_dir>/data/).")
flags.DEFINE_bool("force", False, "Rerun arms that already have recorded results.")
flags.DEFINE_bool("report_only", False, "Train nothing: summarize the recorded runs (every arm "
                  "and tuning run must be recorded) and rewrite summary.json and the report.")
machine.define_flags()
FLAGS = flags.FLAGS


def _shell_quote(value: str) -> str:
  """Shell quoting that keeps gin's single-quoted strings readable: "x = 'a'"."""
  if "'" in value and not set(value) & set('"$`\\!'):
    return f'"{value}"'
  return shlex.quote(value)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if bool(FLAGS.suite) == bool(FLAGS.suite_file):
    names = sorted(f[:-4] for f in os.listdir(SUITES_DIR) if f.endswith(".gin"))
    raise app.UsageError(f"give exactly one of --suite (one of {', '.join(names)}) or --suite_file")
  path = FLAGS.suite_file or os.path.join(SUITES_DIR, f"{FLAGS.suite}.gin")
  if not os.path.exists(path):
    names = sorted(f[:-4] for f in os.listdir(SUITES_DIR) if f.endswith(".gin"))
    raise app.UsageError(f"--suite={FLAGS.suite}: no {path}; suites: {', '.join(names)}")
  try:
    config.parse_gin([path], FLAGS.gin_bindings)
    suite = runner.Suite()
    if not FLAGS.report_only:
      runner.check_tensorflow(suite)
  except (config.ConfigError, ValueError, TypeError) as e:
    raise app.UsageError(f"suite {path}: {e}") from None
  paths = runner.RunPaths(work_dir=os.path.join(FLAGS.work_dir, suite.name),
                          results_dir=os.path.join(FLAGS.results_dir, suite.name),
                          data_dir=os.path.join(FLAGS.work_dir, "data"))
  progress = lambda line: print(line, flush=True)
  try:
    if FLAGS.report_only:
      summary = runner.summarize_recorded(suite, paths)
    else:
      with machine.exclusive(f"benchmarks.run --suite={suite.name}", FLAGS.allow_load,
                             max_wait_s=FLAGS.settle_s):
        summary = runner.run_suite(suite, paths, force=FLAGS.force, progress=progress,
                                   allow_load=FLAGS.allow_load)
  except (machine.MachineBusy, machine.MachineLoaded) as e:
    raise app.UsageError(str(e)) from None
  command = "python -m benchmarks.run " + " ".join(
      [f"--suite={FLAGS.suite}" if FLAGS.suite else f"--suite_file={FLAGS.suite_file}"]
      + [f"--gin_bindings={_shell_quote(b)}" for b in FLAGS.gin_bindings]
      + (["--work_dir=" + FLAGS.work_dir] if FLAGS.work_dir != DEFAULT_WORK_DIR else [])
      + ["--force"])
  written = report.write_report(summary, paths.results_dir, command)
  for name, verdict in summary["goal_verdicts"].items():
    value = summary["goals"].get(name)
    shown = "not reached" if value is None else f"{value:.4f}"
    print(f"goal {name} = {shown} (goal {verdict['threshold'][0]} {verdict['threshold'][1]}: "
          f"{'met' if verdict['met'] else 'MISSED'})")
  index = report.write_index(FLAGS.results_dir)
  print(f"wrote {os.path.join(paths.results_dir, 'summary.json')}, {written['report'][0]}, "
        f"{len(written['plots'])} plot(s) and the index {index}")


def run():
  app.run(main)


if __name__ == "__main__":
  sys.exit(run())
