"""The side of the launcher that runs where a job runs: on a cluster node, or in a local Ray worker.

On a cluster, this file travels as `run.py` inside a small package next to one pickle per job
(`job_<n>.pkl`: the task function, its sweep config, Hydra's context and global state) and runs as
`python -m <package>.run job_<n>.pkl`. It prints the pickled `JobReturn` on one marked line, which
the launcher reads back from the job's logs: no shared file system is needed.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

#: Prefix of the log line that carries the pickled JobReturn back to the launcher.
RETURN_MARK = "RAYFLEET_HYDRA_RETURN "


def run_one(spec: dict[str, Any]) -> Any:
    """Run one job of the sweep the way Hydra's own launchers do; returns its JobReturn."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals

    setup_globals()
    Singleton.set_state(spec["singleton_state"])
    HydraConfig.instance().set_config(spec["sweep_config"])
    return run_job(
        hydra_context=spec["hydra_context"],
        task_function=spec["task_function"],
        config=spec["sweep_config"],
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


def encode_return(job_return: Any) -> str:
    """The marked log line for a JobReturn; a value that cannot be pickled travels as its repr."""
    import ray.cloudpickle as cloudpickle

    try:
        blob = cloudpickle.dumps(job_return)
    except Exception as exc:
        job_return._return_value = f"{job_return._return_value!r} (not picklable: {exc})"
        blob = cloudpickle.dumps(job_return)
    return RETURN_MARK + base64.b64encode(blob).decode()


def decode_return(line: str) -> Any:
    import ray.cloudpickle as cloudpickle

    return cloudpickle.loads(base64.b64decode(line[len(RETURN_MARK):]))


def main() -> int:
    import ray.cloudpickle as cloudpickle
    from hydra.core.utils import JobStatus

    spec = cloudpickle.loads((Path(__file__).parent / sys.argv[1]).read_bytes())
    job_return = run_one(spec)
    sys.stdout.flush()
    sys.stderr.flush()
    print("\n" + encode_return(job_return), flush=True)
    return 0 if job_return.status == JobStatus.COMPLETED else 1


if __name__ == "__main__":
    sys.exit(main())
