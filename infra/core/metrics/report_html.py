"""`invoke report`'s page: one self-contained HTML file with inline SVG charts.

No script, no font, no image and no style sheet from anywhere else: the page opens offline, years
later, from a mail attachment. The charts are drawn here, in Python, as SVG paths from the history
that infra/core/metrics/prometheus.py collects
(live from the head's Prometheus, or from the copy teardown kept).
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Sequence
from typing import Any

WIDTH, HEIGHT = 880, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 160, 16, 34
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#7f7f7f", "#bcbd22")

Points = list[tuple[float, float]]


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%m-%d %H:%M:%S")


def _number(value: float) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"


def nice_step(top: float, whole: bool = False) -> float:
    """A tick step of 1, 2 or 5 times a power of ten giving about four ticks up to `top`."""
    raw = top / 4
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return max(step, 1.0) if whole else step


class _Frame:
    """The axes of one chart: maps (time, value) onto the plot area."""

    def __init__(self, start: float, end: float, top: float, whole: bool = False) -> None:
        self.start, self.end = start, max(end, start + 1)
        # Ticks at round values (whole numbers for counts): never 0.275 nodes.
        self.tick = nice_step(top if top > 0 else 1.0, whole)
        self.top = self.tick * max(1, math.ceil((top if top > 0 else 1.0) / self.tick - 1e-9))

    def x(self, t: float) -> float:
        return LEFT + (t - self.start) / (self.end - self.start) * (WIDTH - LEFT - RIGHT)

    def y(self, v: float) -> float:
        return HEIGHT - BOTTOM - v / self.top * (HEIGHT - TOP - BOTTOM)

    def axes(self, unit: str) -> str:
        parts = [f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" '
                 f'y2="{HEIGHT - BOTTOM}" stroke="#444"/>',
                 f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" stroke="#444"/>']
        for i in range(round(self.top / self.tick) + 1):
            value = self.tick * i
            y = self.y(value)
            parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
                         'stroke="#ddd"/>')
            parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                         f"{_number(value)}{html.escape(unit)}</text>")
        return "".join(parts) + self.time_labels()

    def time_labels(self) -> str:
        ticks = (self.start + (self.end - self.start) * i / 4 for i in range(5))
        return "".join(f'<text x="{self.x(t):.1f}" y="{HEIGHT - 12}" text-anchor="middle">'
                       f"{_clock(t)}</text>" for t in ticks)


def _svg(name: str, body: str, drawn: int) -> str:
    return (f'<svg class="chart" data-chart="{name}" data-drawn="{drawn}" width="{WIDTH}" '
            f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'xmlns="http://www.w3.org/2000/svg">{body}</svg>')


def _empty(name: str, why: str) -> str:
    return _svg(name, f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">'
                f"{html.escape(why)}</text>", 0)


def line_chart(name: str, lines: Sequence[tuple[str, Points]], unit: str = "",
               top: float | None = None, step: bool = False) -> str:
    """Lines over time (`step`: values hold until the next sample, as node counts do)."""
    lines = [(label, pts) for label, pts in lines if pts]
    if not lines:
        return _empty(name, "no data in this period")
    times = [t for _, pts in lines for t, _ in pts]
    highest = max(v for _, pts in lines for _, v in pts)
    frame = _Frame(min(times), max(times), top if top is not None else highest * 1.1, step)
    parts = [frame.axes(unit)]
    for i, (label, pts) in enumerate(lines):
        colour = COLOURS[i % len(COLOURS)]
        path = []
        for j, (t, v) in enumerate(pts):
            x, y = frame.x(t), frame.y(v)
            if j == 0:
                path.append(f"M{x:.1f},{y:.1f}")
            elif step:
                path.append(f"H{x:.1f}V{y:.1f}")
            else:
                path.append(f"L{x:.1f},{y:.1f}")
        parts.append(f'<path d="{"".join(path)}" fill="none" stroke="{colour}" '
                     'stroke-width="2"/>')
        ly = TOP + 14 + 16 * i
        parts.append(f'<rect x="{WIDTH - RIGHT + 10}" y="{ly - 9}" width="10" height="10" '
                     f'fill="{colour}"/><text x="{WIDTH - RIGHT + 24}" y="{ly}">'
                     f"{html.escape(label[:22])}</text>")
    return _svg(name, "".join(parts), len(lines))


def timeline(name: str, jobs: Sequence[dict[str, Any]], start: float, end: float) -> str:
    """One bar per job from its start to its end (or now), a lane per member (or per job)."""
    rows = [j for j in jobs if j.get("start")]
    if not rows:
        return _empty(name, "no job ran in this period")
    lanes: list[str] = []
    for job in rows:
        lane = job.get("member") or job["job"]
        if lane not in lanes:
            lanes.append(lane)
    lanes = lanes[:12]  # a taller chart would not be read; the table below lists every job
    frame = _Frame(min(start, *(j["start"] for j in rows)), end, 1.0)
    lane_h = (HEIGHT - TOP - BOTTOM) / max(len(lanes), 1)
    # No value axis: a lane per member (or job) instead.
    parts = [f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" '
             f'y2="{HEIGHT - BOTTOM}" stroke="#444"/>']
    for job in rows:
        lane = job.get("member") or job["job"]
        if lane not in lanes:
            continue
        i = lanes.index(lane)
        x0, x1 = frame.x(job["start"]), frame.x(job.get("end") or end)
        colour = "#2ca02c" if job["status"] == "SUCCEEDED" else (
            "#d62728" if job["status"] == "FAILED" else "#1f77b4")
        y = TOP + i * lane_h + 3
        parts.append(f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 2):.1f}" '
                     f'height="{max(lane_h - 6, 2):.1f}" fill="{colour}"><title>'
                     f'{html.escape(job["job"])} {html.escape(job["status"])}</title></rect>')
    for i, lane in enumerate(lanes):
        parts.append(f'<text x="{WIDTH - RIGHT + 10}" y="{TOP + (i + 0.5) * lane_h + 4:.1f}">'
                     f"{html.escape(lane[:22])}</text>")
    parts.append(frame.time_labels())
    return _svg(name, "".join(parts), len(rows))


STYLE = """body{font-family:sans-serif;margin:2em;color:#222;max-width:60em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em}svg text{font-size:11px;fill:#333}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;font-size:.9em}
.note{color:#666;font-size:.9em}"""


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain table (escaped); a line saying so when there are no rows."""
    if not rows:
        return "<p class=note>none yet</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table data-table=members><tr>{head}</tr>{body}</table>"


def page(title: str, subtitle: str, sections: Sequence[tuple[str, str, str]],
         jobs: Sequence[dict[str, Any]]) -> str:
    """The whole page: (heading, chart svg, note) sections and a table of every job."""
    body = [f"<h1>{html.escape(title)}</h1><p class=note>{html.escape(subtitle)}</p>"]
    for heading, chart, note in sections:
        body.append(f"<h2>{html.escape(heading)}</h2>{chart}"
                    + (f"<p class=note>{html.escape(note)}</p>" if note else ""))
    if jobs:
        rows = "".join(
            f"<tr><td>{html.escape(j['job'])}</td><td>{html.escape(j.get('member') or '')}</td>"
            f"<td>{html.escape(j['status'])}</td>"
            f"<td>{_clock(j['start']) if j.get('start') else ''}</td>"
            f"<td>{_clock(j['end']) if j.get('end') else ''}</td>"
            f"<td>{html.escape(j.get('entrypoint') or '')}</td></tr>" for j in jobs)
        body.append("<h2>Jobs</h2><table><tr><th>job</th><th>member</th><th>status</th>"
                    f"<th>start (UTC)</th><th>end</th><th>entrypoint</th></tr>{rows}</table>")
    # The policy forbids any request: even a stray URL in a job's name could not load.
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
            + "".join(body) + "</body></html>\n")
