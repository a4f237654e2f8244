"""The head gets only the files its daemons list (autodown_remote.CORE_FILES + each daemon's
FILES): those alone must import, or the watcher and the joiner die on the head at start."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from infra import autodown_remote
from infra.providers.gcp_tpu import autodown, joiner

ROOT = Path(__file__).resolve().parents[2]


def test_the_head_daemons_import_from_the_files_they_ship(tmp_path: Path) -> None:
    for files, module in ((autodown.FILES, "infra.providers.gcp_tpu.autodown"),
                          (joiner.FILES, "infra.providers.gcp_tpu.joiner")):
        target = tmp_path / module.rsplit(".", 1)[-1]
        for name in set(autodown_remote.CORE_FILES + files):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, target / name)
        done = subprocess.run(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(target)!r}); "
             f"import {module}, infra; assert infra.__file__.startswith({str(target)!r})"],
            capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr.strip().splitlines()[-1]
