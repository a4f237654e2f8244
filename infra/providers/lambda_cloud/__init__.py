"""The `lambda` provider: Lambda Cloud instances running one Ray cluster.

This file imports nothing: the registry (infra/providers/__init__.py) imports `provider` and
`spec` by path when the provider is used, so that `infra.node.lambda_cloud.node_provider` imports
on a cluster's head with only Ray, requests and our small core modules (no pydantic, paramiko,
rich or invoke there).
See provider.py for the verbs and NOTES.md for what surprises newcomers.
"""
