"""`gcp-tpu`: an autoscaling Ray cluster on Google Cloud with CPU and TPU VM workers.

The package, by concern: `spec` (the strict spec section), `tpu` (TPU generations and slice
shapes), `config` (spec -> Ray cluster YAML, checked with Ray's own code), `api` (our Compute v1 /
TPU v2 calls), `preflight` (read-only checks before anything is created), `launcher` (`ray up` /
`ray down`), `autodown` (the head's removal action) with `autodown_setup` (this machine's side of
it), `queued` / `slices` / `joiner` (queued TPU slices: the API, the laptop's side, the head's
daemon) and `provider` (the verbs). This file imports nothing: the registry
(infra/providers/__init__.py) imports `provider` and `spec` by path when the provider is used, so
the head-side modules (joiner, autodown) import there with only Ray, requests, Google's client and
our small core modules (no pydantic).
"""
