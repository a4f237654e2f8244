"""This machine's side of Slurm autodown: where the watcher's marker can be read (the watcher runs
beside the head in its job: templates/slurm.sbatch.j2, infra/node/autodown.py; its action is
infra/node/slurm/autodown.py; what the marker means is decided in infra/providers/base.py).

Two places tell: the live marker in the head's private dir on its compute node (read over SSH into
that node, through the login host, as the dashboard tunnel goes), and the record the removal
action copies into the shared work dir before it cancels anything (`<job name>.autodown.json`),
which outlives the job. The watcher's config is written on the head by the node helper
(`autodown-config`), since only the running job knows its ports and ids.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from infra.core import remote_head
from infra.core.autodown import view as autodown_view
from infra.core.errors import RayfleetError
from infra.node.slurm.autodown import CONFIG_FILE, MARKER_FILE, RECORD_SUFFIX
from infra.providers.slurm import cluster

if TYPE_CHECKING:
    from infra.core.state import Resource
    from infra.providers.slurm.records import Job
    from infra.providers.slurm.remote import Runner
    from infra.providers.slurm.spec import Spec


def live_marker(runner: Runner, job: Resource[Job]) -> str | None:
    """The watcher's marker on the head's node, with whether the watcher (or its supervisor)
    runs; quietly None when the node does not let us in."""
    head_ip, temp = job.attrs.head_ip, job.attrs.temp_dir
    if not head_ip or not temp:
        return None
    folder = shlex.quote(str(temp))
    # The batch script records the Python that runs the head's daemons (python-path) and the
    # node package they import (node-zip-path: the script's own copy, outside the head's dir).
    status = (f'PYTHONPATH="$(cat {folder}/node-zip-path)" '
              f'"$(cat {folder}/python-path)" -m infra.node.supervise status --pidfile '
              f"{shlex.quote(f'{temp}/{CONFIG_FILE}.pid')}")
    command = remote_head.with_status_command(f"cat {shlex.quote(f'{temp}/{MARKER_FILE}')}",
                                              status)
    try:
        result = runner.node(str(head_ip)).run(command, timeout=20)
    except RayfleetError:
        return None
    return autodown_view.with_watcher_status(*remote_head.split_status(result.stdout))


def record(runner: Runner, spec: Spec, job: Resource[Job]) -> str | None:
    """The removal record the head left in the work dir, if any."""
    workdir = job.attrs.workdir or spec.submit.workdir
    text = runner.run(f"cat {cluster.job_file(workdir, job.id, RECORD_SUFFIX)} 2>/dev/null",
                      timeout=30).stdout
    return text if text.strip() else None
