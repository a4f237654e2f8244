"""The `local` provider: a real Ray cluster on this machine, no account needed.

The registry (infra/providers/__init__.py) imports `Provider` and `Spec` from provider.py by
path when the provider is used, like every provider package's. provider.py holds the verbs; the
autodown action is infra/node/local/autodown.py (it runs in the watcher beside the head, on this machine).
"""
