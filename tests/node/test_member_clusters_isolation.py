"""Member clusters (`sharing.isolation: cluster`) without Ray: the starts' bookkeeping."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from infra.node import member_clusters as mc


def clusters(tmp_path: Path, most: int = 8) -> mc.MemberClusters:
    config = tmp_path / mc.CONFIG_FILE
    mc.write_starter_config(config, mc.StarterConfig(
        cluster="iso", tmp_root="/tmp", token_dir=str(tmp_path / "tokens"), gateway_uid=0,
        gateway_gid=0, python_bin="/usr/bin", max_active_members=most))
    return mc.MemberClusters(str(config))


def test_two_starts_at_once_get_two_port_blocks(tmp_path: Path) -> None:
    """Two members' first requests together: each start reserves its block before the other
    picks (the second `ray start` on the same ports failed with a 503)."""
    member_clusters = clusters(tmp_path)
    picked: list[int] = []

    async def start(member_id: str, base: int) -> mc.Running:
        picked.append(base)
        await asyncio.sleep(0.05)  # the ports are bound only once `ray start` is done
        return mc.Running(base, base + 1, 0.0)

    member_clusters._start = start  # type: ignore[method-assign]

    async def both() -> None:
        await asyncio.gather(member_clusters.reach("a1"), member_clusters.reach("b2"))

    asyncio.run(both())
    assert len(set(picked)) == 2, picked
    assert {r.port_base for r in member_clusters.running.values()} == set(picked)


def test_one_more_than_max_active_members_is_told_in_one_line(tmp_path: Path) -> None:
    member_clusters = clusters(tmp_path, most=1)

    async def start(member_id: str, base: int) -> mc.Running:
        return mc.Running(base, base + 1, 0.0)

    member_clusters._start = start  # type: ignore[method-assign]

    async def two() -> None:
        await member_clusters.reach("a1")
        await member_clusters.reach("a1")  # the same member again: their running cluster
        with pytest.raises(mc.Full) as full:
            await member_clusters.reach("b2")
        assert "\n" not in str(full.value) and "max_active_members" in str(full.value)

    asyncio.run(two())


def test_a_member_id_never_reaches_a_user_name_as_it_is() -> None:
    assert mc.member_user("0123456789abcdef") == "rf-m-0123456789abcdef"
    legacy = mc.member_user("legacy-alice")
    assert "alice" not in legacy and len(legacy) == len("rf-m-") + 16
