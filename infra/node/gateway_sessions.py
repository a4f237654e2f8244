"""A member in a browser, signed in: sessions that are not tokens, sign-out, and whose pages may write.

- Signing in (the gateway's login form, or the dashboard's own `POST /api/authenticate`, which
  Ray's page sends the pasted token to) gives the browser a cookie that holds a random session id,
  never the token. The cookie keeps Ray's name (`ray-authentication-token`), so a browser still
  holding a raw token there from before is simply refused and signs in again, and each sign-in
  overwrites it: HttpOnly, Secure, SameSite=Strict, for SESSION_S at most.
- Sessions live in the gateway's memory only: a restart of the gateway asks every browser to sign
  in again. Nothing of them is on disk, where a job running as the owner's account (local) could
  read it. A session ends at sign-out (`POST /rayfleet/logout`), SESSION_S after sign-in, and at
  the first request after its token no longer names the same member in the members file:
  removal, expiry, a new token (the owner's, at `member-remove` and `rotate-token`).
- A valid token always signs in, whatever failed before it from the same address (a campus NAT is
  one address for a whole class): it is checked before any block. Failed sign-ins from one address
  past gateway_state's limit are answered 429 after a pause (`pause`). That is not what stops
  guessing: tokens and session ids are 32 random bytes, so a billion guesses a second for the age
  of the universe, against a thousand valid tokens, would hit one with a chance below 1 in 10^40.
  The count and the pause keep a stuck script or a scan from costing the head much; they never
  decide a valid token's fate.
- A request that changes something (`POST`, `PUT`, `DELETE`, `PATCH`) or opens a WebSocket, sent by
  a browser (it carries a cookie, an `Origin` or a `Referer`), must come from the gateway's own
  origin: a page elsewhere, even one on the same host (SameSite does not tell ports apart), cannot
  act with a member's cookie. Ray's CLI and SDK send none of the three and present their token in a
  header, which no other origin can make a browser send.
Ray and what Ray brings only (node rule).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from infra.node import gateway_browser as gb
from infra.node import gateway_state as gs

#: How long a browser's sign-in lasts at most (the cookie's max-age and the session's own end).
SESSION_S = 12 * 3600.0
#: A member's open sessions (their browsers); past it, their oldest ends.
MAX_PER_MEMBER = 32
#: How long a refused attempt from an address past the failure limit waits for its 429.
PAUSE_S = 1.0
#: Methods that change something; a WebSocket (a GET) is checked like them.
WRITES = frozenset({"POST", "PUT", "DELETE", "PATCH"})


@dataclass
class Session:
    token: str  # in this process's memory only: the gateway reads every request's token anyway
    member_id: str
    ends: float  # time.monotonic()


class Sessions:
    """The browsers signed in, by session id."""

    def __init__(self, lifetime: float = SESSION_S) -> None:
        self.lifetime = lifetime
        self._open: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._open)

    def open(self, token: str, who: gs.Member) -> str:
        """A new session for `who`, signed in with `token`; its id (the cookie's value)."""
        now = time.monotonic()
        for sid, session in list(self._open.items()):
            if session.ends <= now:
                del self._open[sid]
        theirs = [sid for sid, s in self._open.items() if s.member_id == who.id]
        for sid in theirs[:max(0, len(theirs) - MAX_PER_MEMBER + 1)]:  # oldest first
            del self._open[sid]
        sid = secrets.token_urlsafe(32)
        self._open[sid] = Session(token, who.id, now + self.lifetime)
        return sid

    def token(self, sid: str, members: gs.Members) -> str | None:
        """The token session `sid` was opened with, while it lasts and that token still names
        the same member, unexpired; None (and the session ended) otherwise."""
        session = self._open.get(sid)
        if session is None:
            return None
        who = members.lookup(session.token)
        if (time.monotonic() >= session.ends or who is None or who.id != session.member_id
                or gs.expired(who)):
            del self._open[sid]
            return None
        return session.token

    def close(self, sid: str | None) -> None:
        if sid:
            self._open.pop(sid, None)


def presented(request: Any, sessions: Sessions, members: gs.Members) -> str | None:
    """The token a request presents: Ray's header forms first (the stock CLI and SDK send
    `Authorization: Bearer`; `X-Ray-Authorization` for proxies that strip it), then a browser's
    session cookie, resolved here. None: nothing presented; "": a cookie whose session is unknown
    or has ended (refused like a wrong token, but no guess: it counts as no failed sign-in)."""
    for name in ("Authorization", "X-Ray-Authorization"):
        value = request.headers.get(name, "")
        if value:
            return value[7:].strip() if value.lower().startswith("bearer ") else value.strip()
    sid = request.cookies.get(gb.COOKIE)
    if not sid:
        return None
    return sessions.token(sid, members) or ""


def login_note(token: str | None) -> str:
    """What the login page says to a browser without a valid credential."""
    if token is None:
        return ""
    if token == "":
        return "Your session has ended (signed out, 12 hours passed, or your access changed); " \
               "sign in again."
    return "That token was not accepted (revoked, expired or mistyped)."


async def pause() -> None:
    """The wait before a refused attempt's 429 from an address past the failure limit."""
    await asyncio.sleep(PAUSE_S)


def _origin(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme.lower(), 0)
    except ValueError:
        return None
    if not parts.scheme or not parts.hostname:
        return None
    return parts.scheme.lower(), parts.hostname.lower(), port


def foreign_origin(request: Any) -> str | None:
    """Why a browser's write (or WebSocket) is refused: it came from a page of another origin,
    or says none; None: it may go on (not a write, or not a browser's, or from our own pages)."""
    headers = request.headers
    websocket = headers.get("Upgrade", "").lower() == "websocket"
    if request.method not in WRITES and not websocket:
        return None
    origin, referer = headers.get("Origin"), headers.get("Referer")
    if not (headers.get("Cookie") or origin or referer):
        return None  # Ray's CLI and SDK: a header token, which no other page can make us get
    claimed = origin if origin is not None else referer or ""
    own = f"{request.scheme}://{request.host}"
    if _origin(claimed) is not None and _origin(claimed) == _origin(own):
        return None
    said = f"Origin {claimed[:100]!r}" if origin is not None else \
        f"Referer {claimed[:100]!r}" if referer else "no Origin"
    return (f"{request.method} refused: a browser's request with a cookie must come from this "
            f"gateway's own pages ({own}); it came with {said}")


async def login(gateway: Any, request: Any, seen: dict[str, Any]) -> Any:
    """The login form: a valid token signs in at once (checked before any block); a wrong one
    counts as a failed sign-in from that address, answered 429 after a pause past the limit."""
    source = seen["source"]
    form = await request.post()
    token = str(form.get("token") or "").strip()
    who = gateway.identify(token) if token else None
    if who is not None and not gs.expired(who):
        gateway.audit.write(**seen, who=who.name, member_id=who.id, role=who.role, status=303)
        return gb.signed_in(gateway.sessions.open(token, who), SESSION_S)
    wait = gateway.failures.blocked(source)
    if wait:
        await pause()
        gateway.audit.write(**seen, status=429)
        return gb.login_page(gateway.config.cluster, f"Too many failed sign-ins from {source}; "
                             f"try again in {wait:.0f} s.", status=429)
    gateway.failures.failed(source)
    gateway.audit.write(**seen, status=403)
    why = "has expired" if who is not None else "was not accepted"
    return gb.login_page(gateway.config.cluster, f"That token {why}; check your bundle or ask "
                         "the cluster's owner.", status=403)


def authenticate(gateway: Any, request: Any) -> Any:
    """The dashboard's own login (Ray's page POSTs the pasted token here; the gateway has checked
    it): a session cookie, as Ray's answer would set its cookie, but never holding the token."""
    from aiohttp import web

    token = presented(request, gateway.sessions, gateway.members) or ""
    who = gateway.identify(token)
    answer = web.json_response({"status": "authenticated", "message": "Token is valid"})
    if who is not None:
        gb.set_session(answer, gateway.sessions.open(token, who), SESSION_S)
    return answer


def logout(gateway: Any, request: Any, seen: dict[str, Any]) -> Any:
    """Sign-out: the session ends here and its cookie in the browser; then the login page."""
    gateway.sessions.close(request.cookies.get(gb.COOKIE))
    gateway.audit.write(**seen, status=303, page="logout")
    return gb.signed_out()
