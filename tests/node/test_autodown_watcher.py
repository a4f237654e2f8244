"""The idle clock of the autodown watcher (infra/node/autodown.py), without Ray: what resets it, what
counts as idle, when it removes, and what its marker says. Real Ray: tests/local/test_e2e_autodown.py."""

from __future__ import annotations

import json
from pathlib import Path

from infra.core.autodown import view as autodown_view
from infra.node import autodown


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _watcher(tmp_path: Path, answers: list[list[str] | Exception], clock: Clock) -> autodown.Watcher:
    config = autodown.Config(
        cluster="c", cluster_id="0123abcd", idle_minutes=1.0, dashboard_url="http://127.0.0.1:9",
        marker=str(tmp_path / "marker.json"), action="infra.node.local.autodown:remove",
        action_args={"temp_dir": str(tmp_path / "no-such-cluster"), "port_base": 1})
    replies = iter(answers)

    def check() -> list[str]:
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    return autodown.Watcher(config, clock=clock, check=check)


def test_busy_resets_the_clock_and_unreachable_ray_counts_as_idle(tmp_path: Path) -> None:
    clock = Clock()
    watcher = _watcher(tmp_path, [[], ["1 job(s) pending or running"], [], ConnectionError(),
                                  []], clock)
    marker = tmp_path / "marker.json"
    assert watcher.step() is False                      # t=0: idle starts
    clock.now = 50
    assert watcher.step() is False                      # t=50: a job -> busy, clock reset
    assert json.loads(marker.read_text())["idle_since"] is None
    clock.now = 60
    assert watcher.step() is False                      # t=60: idle again, from here
    clock.now = 100
    assert watcher.step() is False                      # t=100: Ray silent: still idle (40 s)
    seen = json.loads(marker.read_text())
    assert seen["idle_s"] == 40 and "Ray not answering" in seen["detail"]
    clock.now = 120
    assert watcher.step() is True                       # t=120: 60 s idle = idle_minutes
    watcher.remove()
    done = json.loads(marker.read_text())
    assert done["phase"] == "removed" and done["removed_at"] and done["cluster_id"] == "0123abcd"


def test_marker_views_for_status(tmp_path: Path) -> None:
    view = autodown_view.view({"phase": "watching", "idle_minutes": 30, "idle_since": "x",
                          "idle_s": 720, "detail": "idle"}, 30)
    assert autodown_view.describe(view) == "autodown: idle 12 of 30 min (idle)"
    busy = autodown_view.view({"phase": "watching", "idle_minutes": 30, "idle_since": None,
                          "idle_s": 0, "detail": "1 job(s) pending or running"}, 30)
    assert autodown_view.describe(busy) == ("autodown: busy (1 job(s) pending or running); removes "
                                       "itself after 30 idle minutes")
    gone = autodown_view.view({"phase": "removed", "idle_minutes": 30,
                          "removed_at": "2026-01-02T14:05:00+00:00"}, 30)
    assert autodown_view.describe(gone).startswith("removed itself after 30 idle minutes at ")
    assert autodown_view.view(None, 30).removed_at is None


def test_a_silent_watcher_is_not_shown_counting_down() -> None:
    """A marker whose last check is long past (the watcher died, or the head is unreachable) must
    not keep promising a removal: status says since when it is silent."""
    import datetime as dt

    checked = dt.datetime(2026, 1, 2, 14, 0, tzinfo=dt.timezone.utc)
    marker = {"phase": "watching", "idle_minutes": 30, "idle_since": "x", "idle_s": 720,
              "detail": "idle", "checked_at": checked.isoformat(), "interval_s": 30}
    fresh = autodown_view.view(marker, 30, now=checked + dt.timedelta(seconds=100))
    assert fresh.silent_since is None and autodown_view.describe(fresh).startswith("autodown: idle 12")
    late = autodown_view.view(marker, 30, now=checked + dt.timedelta(seconds=151))
    assert late.silent_since == checked.isoformat()
    assert "no report from the cluster's watcher since" in autodown_view.describe(late)
    # A slow watcher (long interval) is given five of its intervals before it counts as silent.
    slow = autodown_view.view({**marker, "interval_s": 60}, 30, now=checked + dt.timedelta(seconds=290))
    assert slow.silent_since is None
    removing = autodown_view.view({**marker, "phase": "removing", "removing_at": marker["checked_at"]},
                             30, now=checked + dt.timedelta(hours=2))
    assert removing.silent_since is None and removing.removed_at


def test_a_restarted_watcher_resumes_the_countdown(tmp_path: Path) -> None:
    """A watcher killed and started again (its supervisor) keeps the countdown of its marker: a
    restart never buys an idle cluster another idle period. Another cluster's marker is ignored."""
    clock = Clock()
    first = _watcher(tmp_path, [[]], clock)
    assert first.step() is False  # idle from now
    marker = tmp_path / "marker.json"
    data = json.loads(marker.read_text())
    # 40 s ago by the wall clock, as the marker records it.
    import datetime as dt
    since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=40)
    data["idle_since"] = since.isoformat(timespec="seconds")
    marker.write_text(json.dumps(data))
    again = _watcher(tmp_path, [[], []], Clock())
    assert again.step() is False
    resumed = json.loads(marker.read_text())
    assert resumed["idle_since"] == data["idle_since"] and 39 <= resumed["idle_s"] <= 45
    clock2 = Clock()
    later = _watcher(tmp_path, [[], []], clock2)
    clock2.now = 21  # 40 + 21 s > 60 s: the countdown ends now, not 60 s after the restart
    assert later.step() is True

    data["cluster_id"] = "another"
    marker.write_text(json.dumps(data))
    fresh = _watcher(tmp_path, [[]], Clock())
    fresh.step()
    assert json.loads(marker.read_text())["idle_s"] == 0.0


def test_status_says_in_one_line_when_the_watcher_is_not_running() -> None:
    """The marker as read with the supervisor's answer (`watcher_running`): one line when
    neither the watcher nor its supervisor runs; nothing extra while it runs or is not asked."""
    marker = {"phase": "watching", "idle_minutes": 30, "idle_since": None,
              "checked_at": autodown.now_iso(), "detail": "1 job(s) pending or running"}
    down = autodown_view.with_watcher_status(json.dumps(marker), {"running": False})
    assert down is not None
    line = autodown_view.describe(autodown_view.view(json.loads(down), 30))
    assert line.startswith("autodown: watcher not running") and "\n" not in line, line
    up = autodown_view.with_watcher_status(json.dumps(marker), {"running": True})
    assert up is not None
    assert "not running" not in autodown_view.describe(autodown_view.view(json.loads(up), 30))
    assert autodown_view.with_watcher_status(json.dumps(marker), None) == json.dumps(marker)
    # A cluster that removed itself has no watcher to miss.
    gone = {**marker, "phase": "removed", "removed_at": autodown.now_iso()}
    text = autodown_view.with_watcher_status(json.dumps(gone), {"running": False})
    assert text is not None
    assert "removed itself" in autodown_view.describe(autodown_view.view(json.loads(text), 30))
