"""The test network: one namespace holding a bridge, one namespace per member, veth pairs between.

    root namespace:  unreachable <subnet>   (nothing for the test subnet ever leaves the machine)
    rft<id>-br:      br0 ── p0 ┄ eth0 of rft<id>-c   (client, .10)
                         ├── p1 ┄ eth0 of rft<id>-h1  (.11)
                         └── p2 ┄ eth0 of rft<id>-h2  (.12) ...

The root namespace has no address on the subnet; it reaches members only through `nsenter` into the
client namespace (see `Testbed.proxy_command`). Members get no default route either.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

NETNS_PREFIX = "rft"
#: Every test subnet is a /24 of this; nothing else on the machine may be targeted.
TEST_SUPERNET = ipaddress.ip_network("10.200.0.0/16")
#: Route protocol number that marks our blackhole routes, so cleanup never removes anyone else's.
ROUTE_PROTO = "200"
IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network


def ip(*args: str, stdin: str | None = None) -> str:
    """Run `ip ARGS`; raise with its stderr on failure."""
    proc = subprocess.run(["ip", *args], input=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def netns_path(name: str) -> str:
    return f"/run/netns/{name}"


def list_netns() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def run_id_of(netns: str) -> str | None:
    """The run id in one of our namespace names (`rft<id>-<role>`), else None."""
    if not netns.startswith(NETNS_PREFIX) or "-" not in netns:
        return None
    return netns[len(NETNS_PREFIX) :].split("-", 1)[0]


def delete_netns(name: str) -> None:
    if name in list_netns():
        ip("netns", "delete", name)


def _check_test_subnet(subnet: IPNet) -> None:
    if not subnet.subnet_of(TEST_SUPERNET):  # type: ignore[arg-type]
        raise ValueError(f"{subnet} is outside the test range {TEST_SUPERNET}")


def block_subnet(subnet: IPNet) -> None:
    """Make the subnet unreachable from the root namespace (must precede any namespace)."""
    _check_test_subnet(subnet)
    ip("route", "replace", "unreachable", str(subnet), "proto", ROUTE_PROTO)


def unblock_subnet(subnet: IPNet) -> None:
    _check_test_subnet(subnet)
    if subnet in routes_within(subnet, ours_only=True):
        ip("route", "delete", "unreachable", str(subnet), "proto", ROUTE_PROTO)


def routes_within(supernet: IPNet, ours_only: bool = False) -> set[IPNet]:
    """Destinations of root-namespace routes inside `supernet` (only our blackholes if `ours_only`)."""
    args = ["-j", "route", "show", "table", "all"]
    if ours_only:
        args += ["proto", ROUTE_PROTO]
    found: set[IPNet] = set()
    for route in json.loads(ip(*args) or "[]"):
        dst = route.get("dst", "")
        if dst in ("", "default") or ":" in dst:
            continue
        network = ipaddress.ip_network(dst, strict=False)
        if network.subnet_of(supernet):  # type: ignore[arg-type]
            found.add(network)
    return found


@dataclass(frozen=True)
class Member:
    """One namespace on the test network."""

    netns: str
    ip: str


def build(subnet: IPNet, bridge_ns: str, members: Sequence[Member]) -> None:
    """Create the bridge namespace and the members' namespaces, wired and addressed.

    Interfaces are created directly inside their namespaces (`ip -n ... peer ... netns ...`), so no
    name ever appears in the root namespace, where concurrent runs could collide.
    """
    _check_test_subnet(subnet)
    ip("-batch", "-", stdin="".join(f"netns add {ns}\n" for ns in [bridge_ns, *(m.netns for m in members)]))
    bridge = ["link add br0 type bridge", "link set br0 up", "link set lo up"]
    for i, member in enumerate(members):
        bridge += [
            f"link add p{i} type veth peer name eth0 netns {member.netns}",
            f"link set p{i} master br0",
            f"link set p{i} up",
        ]
    ip("-n", bridge_ns, "-batch", "-", stdin="\n".join(bridge) + "\n")
    for member in members:
        cmds = [
            "link set lo up",
            f"addr add {member.ip}/{subnet.prefixlen} dev eth0",
            "link set eth0 up",
        ]
        ip("-n", member.netns, "-batch", "-", stdin="\n".join(cmds) + "\n")
