"""The commands layer: the verbs of `invoke`/`rayfleet` and what only they use."""
