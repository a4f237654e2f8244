"""The use cases under the CLI: `plan`, `up`, `status`, `teardown` and `connect` of one spec.

Each takes a validated spec and a `progress` callback (progress.py), and returns a dataclass; none
prints. infra/cli/ parses the options, calls these and renders what they return (text or --json).
Modules are imported on use (nothing here), so a local `up` loads no more than it needs.
"""
