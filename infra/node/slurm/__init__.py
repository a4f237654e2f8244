"""What of the `slurm` provider runs on a cluster's nodes (see infra/node/__init__.py)."""
