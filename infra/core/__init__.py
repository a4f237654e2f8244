"""The core layer: spec, state, rendering, reaching a head, and the features on top."""
