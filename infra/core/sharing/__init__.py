"""Sharing a cluster, the owner's side: registry, certificates, a term, bundles."""
