"""Faults made for real, and local clusters, for testing a job's fault behaviour on one machine.

* ``netfaults.NetworkFaults(namespace_pid)``: inside a launch's private network namespace (its
  ``network`` event names the pid), cut a task off, drop a share of its packets, or route its
  connections through added latency and a bandwidth cap (``relay``, ``links``).
* ``faultfs.FaultyDirectory(backing, mount)``: an exchange directory mounted through FUSE that is
  slow, read-only, full, vanished or stalled on demand, and counts the bytes that cross it.
* ``local_cluster``: ``tf.distribute.Server`` processes on 127.0.0.1 for a cluster spec.
* ``json_files``: JSON control and record files written atomically for readers in other processes.

The fault tools need root, nftables, cgroup v2 and (for ``faultfs``) fuse3 and mfusepy (the
``testing`` extra); each module's ``unavailable()`` says what is missing here.
"""

import os

# The folder that holds the tf_codistill package: "python -m tf_codistill.testing..." runs there.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
