"""A job that fails on purpose, to check that `invoke submit` exits non-zero."""

raise SystemExit("deliberate failure")
