"""The `lambda` provider: Lambda Cloud instances running one Ray cluster.

`Provider` and `Spec` (what infra/providers/__init__.py asks every provider for) are imported on
first use, so that `infra.node.lambda_cloud.node_provider` imports on a cluster's head with
only Ray, requests and our small core modules (no pydantic, paramiko, rich or invoke there).
See provider.py for the verbs (with planning.py: what `plan` works out; provisioning.py: the
instances at `up`) and NOTES.md for what surprises newcomers.
"""
