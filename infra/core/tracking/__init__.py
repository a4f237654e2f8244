"""The cluster's MLflow tracking server, from this machine."""
