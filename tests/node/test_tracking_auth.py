"""The tracking server's MLflow auth config, as MLflow itself reads it: nobody is let in by
default, the admin is ours, and a checked login is kept for a bounded time (without it every
request pays the password's scrypt hash, 0.1 s of CPU: infra/node/tracking.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.node import tracking


def test_mlflow_reads_our_auth_config_with_a_bounded_login_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Imported here, not at the top: MLflow's server package takes ~5 CPU-s to import, and every
    # xdist worker imports every test module at collection, so a top-level import cost it 3 times.
    from mlflow.server.auth import config as mlflow_auth_config

    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(tracking.auth_ini(tmp_path)))
    read = mlflow_auth_config.read_auth_config()
    assert read.default_permission == "NO_PERMISSIONS"
    assert read.admin_username == tracking.USERNAME
    assert read.database_uri == f"sqlite:///{tmp_path / 'auth.db'}"
    assert 0 < read.auth_cache_ttl_seconds <= 300, read
    assert "password" not in (tmp_path / "basic_auth.ini").read_text().lower()
