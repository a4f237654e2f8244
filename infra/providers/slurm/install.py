"""`environment.install`: make the nodes' Python env with setup/install.sh before submitting.

It runs on the submit host (a login node usually has the network that compute nodes lack) into
`environment.activate`, which must be on the file system the compute nodes share. The installer
is idempotent (a second run checks its marker and returns in under a second) and takes its pins
from infra/core/versions.py, so nodes get this machine's Ray and Python versions.
"""

from __future__ import annotations

import shlex

from infra.core import paths, ui, versions
from infra.node.where import home_path
from infra.providers.slurm.remote import Runner, SlurmError
from infra.providers.slurm.spec import Spec


def env_kind(spec: Spec) -> str:
    """Which setup/envs spec: as given, else gpu when any node has GPUs."""
    gpus = spec.gpus_per_node or (spec.gpu_workers.gpus_per_node if spec.gpu_workers else 0)
    return spec.environment.kind or ("gpu" if gpus else "cpu")


def command(spec: Spec) -> str:
    """The installer's command line on the submit host (after `upload`)."""
    env = spec.environment
    assert env.activate is not None
    args = versions.install_args(env_kind(spec), backend=env.backend)
    if spec.metrics == "prometheus":
        # The head's Prometheus from conda-forge into the shared env (never the login host's
        # apt-get: that would install it where no node runs it); one `prometheus` on the
        # PATH already (the site's module, the distribution's) is kept, and none is one line
        # at `up`, never a failed install.
        args += ["--metrics", "--metrics-from", "conda-forge"]
    folder = f"{spec.submit.workdir.rstrip('/')}/setup"
    return (f"bash {home_path(folder + '/install.sh')} {shlex.join(args)} "
            f"--prefix {home_path(env.activate)}")


def upload(runner: Runner, spec: Spec) -> None:
    """Copy setup/install.sh and the env specs next to the jobs' files on the submit host."""
    folder = f"{spec.submit.workdir.rstrip('/')}/setup"
    runner.check(f"mkdir -p {home_path(folder + '/envs')}")
    sources = [paths.setup_dir() / "install.sh", *sorted((paths.setup_dir() / "envs").glob("*"))]
    for source in sources:
        relative = source.relative_to(paths.setup_dir()).as_posix()
        runner.check(f"cat > {home_path(f'{folder}/{relative}')}", input=source.read_text())


def install(runner: Runner, spec: Spec) -> None:
    upload(runner, spec)
    with ui.step(f"Python env {spec.environment.activate} on {runner.where} (setup/install.sh; "
                 "the first time takes minutes)"):
        result = runner.run(command(spec), timeout=3600)
        if not result.ok:
            lines = [line for line in (result.stderr or result.stdout).strip().splitlines() if line]
            raise SlurmError(f"setup/install.sh on {runner.where} failed: "
                             f"{lines[-1] if lines else f'exit {result.exit_code}'}")
