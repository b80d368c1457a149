"""Real local TF clusters: tf.distribute.Server processes on 127.0.0.1, for tests and benchmarks.

  python -m tf_codistill.testing.local_cluster '<cluster JSON>' <job> <index>   # serves one task
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import subprocess
import sys
from typing import Dict, Iterator, List

from tf_codistill.launch import launcher


def die_with_parent() -> None:
  """``preexec_fn`` for a benchmark's task processes: the kernel kills the task when the process
  that started it dies (Linux ``PR_SET_PDEATHSIG``), so a killed benchmark leaves no task behind
  to load the machine."""
  ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def start(args: List[str], **kwargs) -> subprocess.Popen:
  """``subprocess.Popen(args)`` of a task that dies with this process."""
  return subprocess.Popen(args, preexec_fn=die_with_parent, **kwargs)


def free_cluster(jobs: Dict[str, int]) -> Dict[str, List[str]]:
  """A cluster spec with ``jobs[name]`` tasks of each job on free ports of 127.0.0.1."""
  taken: set = set()
  return {job: [f"127.0.0.1:{launcher.free_port(taken)}" for _ in range(count)]
          for job, count in jobs.items()}


@contextlib.contextmanager
def servers(cluster: Dict[str, List[str]],
            jobs=("worker", "ps")) -> Iterator[List[subprocess.Popen]]:
  """Serves every task of ``jobs`` of ``cluster`` in its own process while the block runs."""
  procs = [start([sys.executable, "-m", "tf_codistill.testing.local_cluster", json.dumps(cluster),
                  job, str(index)])
           for job in jobs for index in range(len(cluster.get(job, [])))]
  try:
    yield procs
  finally:
    for proc in procs:
      proc.kill()
      proc.wait()


def ps_strategy(cluster: Dict[str, List[str]]):
  """This process as the chief (coordinator) of ``cluster``: its ParameterServerStrategy."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
  return tf.distribute.experimental.ParameterServerStrategy(resolver)


def _serve(cluster: str, job: str, index: str) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.distribute.Server(tf.train.ClusterSpec(json.loads(cluster)), job_name=job,
                       task_index=int(index), protocol="grpc", start=True).join()


if __name__ == "__main__":
  _serve(*sys.argv[1:4])
