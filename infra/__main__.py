"""`python -m infra` is the `rayfleet` command (what `invoke --help TASK` re-runs as, too)."""

from infra.cli.tasks import main

main()
