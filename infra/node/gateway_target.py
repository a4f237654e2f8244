"""What the gateway reads of a request's target before any rule, and what it sends upstream.

aiohttp hands the gateway a percent-decoded path that is not normalized, and yarl collapses dot
segments when it re-parses a URL for the client session: a rule that checked
`/static/%2E%2E/api/jobs/` passed a path that reached Ray as `/api/jobs/`. So the target is read
once, here: a path whose decoded form is not already in normal form, or that holds an encoded
separator or escape (`/`, `\\`, `?`, `#`, `%`), a `;`, a control character or an empty segment, is
refused whole (400). What every rule then reads is the decoded path, and what goes upstream is
that same path encoded once, sent as it is (no second parse may change it). Standard library
only: it ships to heads in the node package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

#: A job's id in a request's path: Ray's own submission ids (`raysubmit_<16 letters>`) and Ray job
#: ids (`02000000`) fit. Which ids a member may give a job of theirs: `member_may_name`.
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: What Ray reads as a Ray job id (`JobID.from_hex`: hex of JobID's 4 bytes, either case). Ray's
#: job API (`find_job_by_ids`) tries an id as that first, then as a submission id: a submission
#: named `02000000` was answered with whichever job holds Ray job id 02000000.
RAY_JOB_ID = re.compile(r"[0-9a-fA-F]{8}")
#: Encoded characters that would change the path's structure once decoded.
_ENCODED_STRUCTURE = re.compile(r"%(2f|5c|3f|23|25)", re.IGNORECASE)
#: What stays unescaped when the authorized path is encoded for Ray (RFC 3986's pchar, no `;`).
_SAFE = "/:@!$&'()*+,=-._~"


class BadTarget(ValueError):
    """The request's target is not one the gateway forwards (answered 400 with this text)."""


@dataclass(frozen=True)
class Target:
    #: Decoded and in normal form: what every rule reads.
    path: str
    #: The query as the client sent it (still encoded): it never changes the path.
    query: str = ""

    def upstream(self) -> str:
        """The path and query to send to Ray: the authorized path encoded once."""
        encoded = quote(self.path, safe=_SAFE)
        return f"{encoded}?{self.query}" if self.query else encoded


def read(raw: str) -> Target:
    """The target of a request line's `raw` path-and-query, or BadTarget naming what is wrong."""
    raw_path, _, query = raw.partition("?")
    if "#" in raw:
        raise BadTarget("a request target holds no fragment (#)")
    if _ENCODED_STRUCTURE.search(raw_path):
        raise BadTarget("the path holds an encoded '/', '\\', '?', '#' or '%'; send it unencoded")
    if "\\" in raw_path or ";" in raw_path:
        raise BadTarget("the path holds a '\\' or ';'")
    try:
        path = unquote(raw_path, errors="strict")
    except UnicodeDecodeError:
        raise BadTarget("the path is not UTF-8 once decoded") from None
    if not path.startswith("/"):
        raise BadTarget("the path must start with '/'")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise BadTarget("the path holds a control character")
    segments = path.split("/")[1:]
    for i, segment in enumerate(segments):
        if segment in (".", ".."):
            raise BadTarget("the path holds a '.' or '..' segment; send its normal form")
        if segment == "" and i != len(segments) - 1:  # a trailing '/' is Ray's own form
            raise BadTarget("the path holds an empty segment ('//')")
    if any(c in query for c in "\\") or any(ord(c) < 0x20 for c in query):
        raise BadTarget("the query holds a '\\' or a control character")
    return Target(path, query)


def job_id_or_none(text: str) -> str | None:
    """`text` when it is a submission id the gateway accepts, else None."""
    return text if JOB_ID.fullmatch(text) else None


def member_may_name(text: str) -> str | None:
    """Why a member may not give a job of theirs the submission id `text`, or None when they
    may: one id means one job, in Ray's job API as in the gateway's records."""
    if JOB_ID.fullmatch(text) is None:
        return "1 to 64 letters, digits, '_' or '-'"
    if RAY_JOB_ID.fullmatch(text):
        return ("8 hex digits is how Ray names a Ray job id, and Ray reads such an id as one "
                "(another job's); use another id, e.g. with a letter past 'f', or leave it out")
    return None


def job_path(job_id: str, action: str = "") -> str:
    """`/api/jobs/<id><action>` with the id quoted (ids are checked first; this is the second
    line: nothing in an id can add a segment or a query)."""
    return f"/api/jobs/{quote(job_id, safe='')}{action}"
