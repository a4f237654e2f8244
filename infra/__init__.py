"""rayfleet: provision Ray clusters from one spec file per cluster.

Importing this package is cheap on purpose: Ray, Google's SDK and paramiko are imported only by the
code paths that need them, so `invoke --list` and `invoke plan` start fast.
"""
