"""What of the `lambda_cloud` provider runs on a cluster's nodes (see infra/node/__init__.py)."""
