"""The `slurm` provider: a Ray cluster on an HPC cluster, as Slurm jobs.

Two shapes (see README, "Ray on Slurm"):
- fixed: one sbatch job holds every node for its walltime (templates/slurm.sbatch.j2);
- autoscaling (`worker_types` in the spec): a head job runs Ray's autoscaler with our node
  provider (`infra.node.slurm.node_provider`), which submits one sbatch job per worker and cancels
  idle ones.

This module is light on purpose: Ray's monitor imports `infra.node.slurm.node_provider` on
the head, where only Ray and our small modules exist (no pydantic, rich, paramiko). `Spec` and
`Provider` (what the registry in infra/providers/__init__.py asks for) load on first access.

Package layout: provider.py (the verbs), spec.py (the spec section), script.py (template
variables), remote.py (local or SSH command runner), cluster.py (Slurm commands, parsed), ours.py
(our jobs in the queue: status, cancel), install.py (environment.install), autodown_setup.py
(this machine's side of autodown), costs.py (node-hours). What runs on the nodes lives in
infra/node/slurm/: `infra.node.slurm.node_helper` (the batch script's helper),
`infra.node.slurm.node_provider` (Ray's autoscaler's side), `infra.node.slurm.queue` (our jobs
in the queue, read on both sides) and `infra.node.slurm.autodown` (the head's removal action, run
by the idle watcher in the head's job); what the laptop makes of that watcher is
`infra.autodown_view`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.providers.slurm.provider import Provider, SlurmError
    from infra.providers.slurm.spec import Spec

__all__ = ["Provider", "SlurmError", "Spec"]


def __getattr__(name: str) -> Any:
    if name in ("Provider", "SlurmError"):
        from infra.providers.slurm import provider

        return getattr(provider, name)
    if name == "Spec":
        from infra.providers.slurm.spec import Spec

        return Spec
    raise AttributeError(name)
