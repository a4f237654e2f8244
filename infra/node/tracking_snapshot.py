"""A consistent copy of a head's tracking store, taken on the head while the server runs.

`python -m infra.node.tracking_snapshot --store DIR --out FILE` writes one tar: `mlflow.db` (runs,
metrics, params, registered models) taken with SQLite's online backup, which copies a consistent
database even while the server writes to it (a plain file copy could catch half a transaction),
and the `artifacts/` tree. The users database (auth.db) stays behind: it holds only the cluster's
login, which means nothing without the cluster. `infra/tracking_remote.copy_back` fetches the tar
over SFTP and unpacks it into `.rayfleet/tracking/<cluster>/` on the user's machine.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tarfile
import tempfile
from pathlib import Path

from infra.node.files import atomic_file

#: The backend store's file inside a store dir (infra/node/tracking.server_command).
DB_FILE = "mlflow.db"
ARTIFACTS = "artifacts"


def snapshot(store: Path, out: Path) -> None:
    """Write `out` (a tar, mode 0600): a backup of `store/mlflow.db` and `store/artifacts/`."""
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        copy = Path(tmp) / DB_FILE
        source_path = store / DB_FILE
        if source_path.exists():
            # Read-only URI: the backup never creates or changes the server's database.
            source = sqlite3.connect(f"file:{source_path}?mode=ro", uri=True)
            target = sqlite3.connect(copy)
            try:
                source.backup(target)
            finally:
                target.close()
                source.close()
        with atomic_file(out, 0o600) as handle, tarfile.open(fileobj=handle, mode="w") as tar:
            if copy.exists():
                tar.add(copy, arcname=DB_FILE)
            if (store / ARTIFACTS).is_dir():
                tar.add(store / ARTIFACTS, arcname=ARTIFACTS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Snapshot a tracking store into one tar.")
    parser.add_argument("--store", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    store = Path(args.store)
    if not store.is_dir():
        print(f"no tracking store at {store}", file=sys.stderr)
        return 3
    snapshot(store, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
