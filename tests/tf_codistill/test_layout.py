"""layout: the paths of a job and of its groups' model directories."""

from tf_codistill import layout


def test_layout_names_the_files_of_a_job():
  run = layout.group_run("/jobs/a", 1)
  assert run.path == "/jobs/a/group_1" and layout.exchange_dir("/jobs/a") == "/jobs/a/exchange"
  assert run.results == "/jobs/a/group_1/results.json"
  assert run.task_log("worker", 2) == "/jobs/a/group_1/worker_2.log"
  assert run.step_summaries == "/jobs/a/group_1/tb/steps"
