"""`gcp-tpu`: an autoscaling Ray cluster on Google Cloud with CPU and TPU VM workers.

The package, by concern: `spec` (the strict spec section), `tpu` (TPU generations and slice
shapes), `config` (spec -> Ray cluster YAML, checked with Ray's own code), `preflight` (read-only
checks before anything is created), `launcher` (`ray up` / `ray down`), `services` (the answers
for the head's services: the watcher's removal action, what is still listed), `slices` (the
laptop's side of queued TPU slices), `planning` (what `plan` works out), `removal` (`ray down`
and the label sweep), `view` (status, the head lookup, readiness) and `provider` (the verbs).
What also runs on the head lives in infra/node/gcp_tpu/: `infra.node.gcp_tpu.api` (our Compute
v1 / TPU v2 calls),
`infra.node.gcp_tpu.autodown` (the head's removal action), `infra.node.gcp_tpu.queued` (the
queued-resources API) and `infra.node.gcp_tpu.joiner` (the head's daemon that sets up each slice).
Importing this package imports neither Ray nor Google's libraries, and `Provider`/`Spec` load on
first use, so the head-side modules (joiner, autodown) import there with only Ray, requests,
Google's client and our small core modules (no pydantic).
"""
