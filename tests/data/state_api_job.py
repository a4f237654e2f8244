"""A job whose task asks Ray's state API for the cluster's nodes, as Ray Train's actors do.

A task runs in a worker process, which inherits its node's environment (not the driver's, to which
the job supervisor gives RAY_ADDRESS): without the cluster's own address there, Ray looks for "the"
Ray on the machine and fails when two clusters run on it. Prints `RESULT {...}` and the files of
the working dir it was given.
"""

from __future__ import annotations

import json
import os

import ray


@ray.remote
def cluster_nodes() -> int:
    from ray.util.state import list_nodes

    return len(list_nodes())


if __name__ == "__main__":
    ray.init()
    shipped = sorted(os.path.relpath(os.path.join(top, name)) for top, _, names in os.walk(".")
                     for name in names)
    print("RESULT " + json.dumps({"nodes": ray.get(cluster_nodes.remote()), "files": shipped}))
