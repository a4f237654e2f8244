"""`gcp-tpu`: an autoscaling Ray cluster on Google Cloud with CPU and TPU VM workers.

The package, by concern: `spec` (the strict spec section), `tpu` (TPU generations and slice
shapes), `config` (spec -> Ray cluster YAML, checked with Ray's own code), `api` (our Compute v1 /
TPU v2 calls), `preflight` (read-only checks before anything is created), `launcher` (`ray up` /
`ray down`) and `provider` (the verbs). Importing it imports neither Ray nor Google's libraries.
"""

from infra.providers.gcp_tpu.provider import Provider
from infra.providers.gcp_tpu.spec import Spec

__all__ = ["Provider", "Spec"]
