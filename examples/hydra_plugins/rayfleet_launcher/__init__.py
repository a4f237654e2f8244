"""rayfleet's Hydra launcher: `--multirun hydra/launcher=ray` runs each job of a sweep on Ray.

Hydra finds it because `examples/` (the script's folder) is on sys.path and holds the
`hydra_plugins` namespace package. See launcher.py for the options.
"""
