"""The cluster's Prometheus from this machine, and the report built on it."""
