"""A member in a browser: the gateway's login page, and answers that keep Ray's dashboard quiet.

Ray's dashboard opens its "Authentication Token Required" dialog whenever one of its background
calls is answered 401 or 403, and a browser that opens the gateway's address holds no token yet.
So a visitor without a valid token gets a login page of ours at `/` (one field: the token from
their bundle), which opens a session (gateway_sessions.py: the cookie holds its id, never the
token) and leads to the dashboard; and a member's dashboard page carries a note saying which tabs
show them nothing (gateway_dashboard.py answers the page's own calls), with a sign-out button; a
request the gateway does not open is answered 404 with one line, never 401/403. Writes stay 403.
Ray and what Ray brings only.
"""

from __future__ import annotations

import html
from typing import Any

#: The gateway's own path for the login form (nothing of Ray's lives under /rayfleet/).
LOGIN_PATH = "/rayfleet/login"
LOGOUT_PATH = "/rayfleet/logout"
#: Ray's own cookie name, holding a session id of the gateway's (gateway_sessions.py): a raw token
#: a browser kept there from before is refused, and the next sign-in overwrites it.
COOKIE = "ray-authentication-token"
#: The pages a browser opens first: a visitor without a valid token gets the login page there.
ENTRY_PAGES = ("/", "/index.html")

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{cluster}: sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: system-ui, sans-serif; max-width: 32rem; margin: 4rem auto; padding: 0 1rem;
       color: #222; }}
input {{ width: 100%; padding: .5rem; font-family: monospace; box-sizing: border-box; }}
button {{ margin-top: 1rem; padding: .5rem 1.5rem; }}
.error {{ color: #b00020; }} .hint {{ color: #555; font-size: .9rem; }}
</style></head>
<body><h1>{cluster}</h1>
<p>This Ray cluster is shared. Sign in with your member token: the contents of the file
<code>ray-token</code> in the member folder your instructor sent you.</p>
{error}
<form method="post" action="{action}">
<label for="token">Member token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<button type="submit">Sign in</button>
</form>
<p class="hint">This browser then keeps a session for this address only (not your token), for 12
hours at most, until you sign out, or until the owner removes you. Ask the cluster's owner if
your token is refused.</p>
</body></html>
"""


def login_page(cluster: str, error: str = "", status: int = 200) -> Any:
    from aiohttp import web

    shown = f'<p class="error" role="alert">{html.escape(error)}</p>' if error else ""
    text = _PAGE.format(cluster=html.escape(cluster), error=shown, action=LOGIN_PATH)
    return web.Response(status=status, text=text, content_type="text/html",
                        headers={"Cache-Control": "no-store"})


def set_session(answer: Any, session_id: str, max_age: float) -> None:
    """The session's cookie on `answer`: never readable by the page's scripts, sent over TLS only
    and by no other site's page."""
    answer.set_cookie(COOKIE, session_id, max_age=int(max_age), path="/", httponly=True,
                      samesite="Strict", secure=True)


def signed_in(session_id: str, max_age: float) -> Any:
    """After a good token: the session's cookie, then the dashboard."""
    from aiohttp import web

    answer = web.Response(status=303, headers={"Location": "/", "Cache-Control": "no-store"})
    set_session(answer, session_id, max_age)
    return answer


def signed_out() -> Any:
    """After sign-out: the cookie gone from the browser, then the login page."""
    from aiohttp import web

    answer = web.Response(status=303, headers={"Location": "/", "Cache-Control": "no-store"})
    answer.del_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="Strict")
    return answer


def wants_page(request: Any) -> bool:
    """A browser opening a page (not a script or Ray's client asking for JSON)."""
    return request.method == "GET" and "text/html" in request.headers.get("Accept", "")


#: Said at the foot of every dashboard page a member opens: which tabs show them nothing and why.
_BANNER = ('<div id="rayfleet-member" role="note" style="position:fixed;bottom:0;left:0;right:0;'
           'z-index:2000;padding:4px 12px;font:13px system-ui,sans-serif;background:#fff8e1;'
           'border-top:1px solid #e0c060;color:#333">Signed in as {name}, a member of this shared '
           'cluster. <span id="rayfleet-usage">{usage}</span>Jobs, Actors and Logs show {scope}; '
           'Cluster shows every node, but only the '
           'workers of {scope}. Serve, Metrics and profiling are not open to members (they cannot be '
           'split by member). <form method="post" action="{logout}" style="display:inline">'
           '<button type="submit" id="rayfleet-sign-out">Sign out</button></form></div>')


def with_banner(page: bytes, name: str, sees_all: bool, usage: str = "") -> bytes:
    """The dashboard's page with the member's note before `</body>` (outside the element the
    dashboard renders into, so it stays on every tab); `usage`: their usage and budget's line
    (gateway_usage_view.banner_line, the figures `rayfleet usage` prints)."""
    scope = "every member's jobs" if sees_all else "your own jobs"
    note = _BANNER.format(name=html.escape(name), scope=scope, logout=LOGOUT_PATH,
                          usage=html.escape(usage)).encode()
    head, found, tail = page.rpartition(b"</body>")
    return head + note + found + tail if found else page + note


def closed_view(method: str, path: str) -> Any:
    """A member's request the gateway does not open: a read is 404 (the dashboard shows the view
    as unavailable, no token dialog), a write 403."""
    from aiohttp import web

    text = (f"{method} {path} is not open to members: they submit, list, read the logs of, stop "
            "and delete their own jobs (docs/concepts/sharing.md)\n")
    return web.Response(status=404 if method in ("GET", "HEAD") else 403, text=text)
