"""What of the `gcp_tpu` provider runs on a cluster's nodes (see infra/node/__init__.py)."""
