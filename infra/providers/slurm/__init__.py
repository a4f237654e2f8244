"""The `slurm` provider: a Ray cluster on an HPC cluster, as Slurm jobs.

Two shapes (see README, "Ray on Slurm"):
- fixed: one sbatch job holds every node for its walltime (templates/slurm.sbatch.j2);
- autoscaling (`worker_types` in the spec): a head job runs Ray's autoscaler with our node
  provider (`infra.node.slurm.node_provider`), which submits one sbatch job per worker and cancels
  idle ones.

This module is light on purpose: Ray's monitor imports `infra.node.slurm.node_provider` on
the head, where only Ray and our small modules exist (no pydantic, rich, paramiko). The registry
(infra/providers/__init__.py) imports `Spec` and `Provider` from spec.py and provider.py by path.

Package layout: provider.py (the verbs), spec.py (the spec section), script.py (template
variables), remote.py (local or SSH command runner), cluster.py (Slurm commands, parsed), ours.py
(our jobs in the queue: status, cancel, where the watcher's marker is read), install.py
(environment.install), costs.py (node-hours). What runs on the nodes lives in
infra/node/slurm/: `infra.node.slurm.node_helper` (the batch script's helper),
`infra.node.slurm.node_provider` (Ray's autoscaler's side), `infra.node.slurm.queue` (our jobs
in the queue, read on both sides) and `infra.node.slurm.autodown` (the head's removal action, run
by the idle watcher in the head's job); what the laptop makes of that watcher is
`infra.core.autodown.view`.
"""
