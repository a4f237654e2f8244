"""Issue 49, defect 16: `teardown` of a local cluster said "nothing of it is left" while Python's
/tmp/pymp-* folders of the cluster's processes stayed. Every process the local start script
starts (Ray's, and through Ray every worker and job) has TMPDIR inside the cluster's private
parent folder, which teardown removes whole. The rendered script runs here up to its `exec`, a
Python in Ray's place making multiprocessing's folder as Ray's processes do."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from infra import providers
from infra.cli import loading
from infra.providers.local.provider import new_temp_dir

#: What a process of the cluster does: multiprocessing makes its pymp-* folder where tempfile says.
PYMP = "import multiprocessing.util as u; print(u.get_temp_dir())"


def test_term_record_python_temp_folders_of_the_cluster_live_in_its_private_folder(
        tmp_path: Path, rf_home: Path) -> None:
    spec = tmp_path / "tmpclass.yaml"
    spec.write_text("provider: local\nport_base: 23000\n")
    script = providers.create(loading.load_spec(spec)).plan(None).files["start.sh"]
    head, found, _ = script.partition("\nexec ")
    assert found, "the start script ends in `exec ray start`"
    parent, temp_dir = new_temp_dir("tmpclass")
    try:
        ran = subprocess.run(["bash", "-c", f"{head}\nexec {sys.executable} -c '{PYMP}'",
                              "start.sh", temp_dir], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp"})
        assert ran.returncode == 0, ran.stderr
        pymp = Path(ran.stdout.strip())
        assert pymp.name.startswith("pymp-") and pymp.is_relative_to(parent), pymp
    finally:
        shutil.rmtree(parent, ignore_errors=True)  # what teardown does (provider._stop)
    assert not pymp.exists()
