"""`gcp-tpu`: an autoscaling Ray cluster on Google Cloud with CPU and TPU VM workers.

The package, by concern: `spec` (the strict spec section), `tpu` (TPU generations and slice
shapes), `config` (spec -> Ray cluster YAML, checked with Ray's own code), `api` (our Compute v1 /
TPU v2 calls), `preflight` (read-only checks before anything is created), `launcher` (`ray up` /
`ray down`), `autodown` (the head's removal action) with `autodown_setup` (this machine's side of
it), `queued` / `slices` / `joiner` (queued TPU slices: the API, the laptop's side, the head's
daemon), `planning` (what `plan` works out), `removal` (`ray down` and the label sweep), `view`
(status, the head lookup, readiness) and `provider` (the verbs). Importing it imports neither
Ray nor Google's libraries, and `Provider`/`Spec` load on first use, so the head-side modules
(joiner, autodown) import there with only Ray, requests, Google's client and our small core
modules (no pydantic).
"""
