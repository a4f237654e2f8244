"""Small network facts shared by the API clients."""

from __future__ import annotations

import ipaddress
import urllib.parse


def is_loopback(host_or_url: str) -> bool:
    """True for localhost and 127.0.0.0/8 / ::1, given a host name or a URL.

    Plain http and anonymous credentials are allowed only there: that is where test fakes live.
    """
    host = urllib.parse.urlsplit(host_or_url).hostname if "://" in host_or_url else host_or_url
    host = host or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
