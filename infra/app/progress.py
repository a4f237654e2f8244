"""How the library reports progress without printing (the types live in infra/core/progress.py,
where what the use cases call in the core reports through the same callback)."""

from infra.core.progress import Kind, Progress, Step, ignore, timed, warn

__all__ = ["Kind", "Progress", "Step", "ignore", "timed", "warn"]
