"""Local jobs: n groups on this machine, each a real TF cluster in a private network namespace.

``jobs.launch_job`` checks a job's configuration once and runs it; ``launcher`` starts and
supervises the tasks; ``isolation`` makes the network namespace; ``demo`` is the README's job.
"""
