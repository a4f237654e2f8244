"""The fake Lambda's firewall rulesets, enforced on the test bed's instance hosts.

Lambda applies a ruleset's inbound rules to the instances it is attached to; the fake only stores
them. On a bed built with `enforce_firewall`, a thread here follows the fake (every 0.2 s) and gives
each host that is an instance right now an nftables `input` chain in the host's own network
namespace (never the root namespace's), derived from the rulesets attached to that instance:

- accepted: loopback (the API relay, Ray's own loopback traffic), replies to the host's own
  connections, and anything from another instance host of the bed (Lambda's private network
  between instances: NOTES.md "Traffic between instances" assumes it is not filtered, and our
  clusters rely on it; on the bed the private and public addresses are the same);
- accepted: each rule's protocol and port range from its `source_network` (`all`: any port;
  `icmp`: icmp);
- dropped: everything else (Lambda: what no rule allows does not reach the instance).

A host that is no instance (never handed out, or terminated) has no such chain: the bed's other
machines (the owner's client namespace, members' hosts) are left as the bed built them. A ruleset
change reaches the hosts within a poll (Lambda documents no delay either way).
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterable
from typing import Any

TABLE = "rayfleet_bed_fw"
_GONE = ("terminated", "terminating")


def ruleset_nft(rules: Iterable[dict[str, Any]], peers: Iterable[str]) -> str:
    """One nft transaction that replaces the host's table with these rules (the peers: the other
    instance hosts, accepted as Lambda's private network)."""
    lines = ["iif lo accept", "ct state established,related accept"]
    friends = sorted(set(peers))
    if friends:
        lines.append(f"ip saddr {{ {', '.join(friends)} }} accept")
    for rule in rules:
        source = str(ipaddress.IPv4Network(str(rule["source_network"]), strict=False))
        protocol = rule["protocol"]
        if protocol == "all":
            lines.append(f"ip saddr {source} accept")
        elif protocol == "icmp":
            lines.append(f"ip saddr {source} ip protocol icmp accept")
        else:
            low, high = rule["port_range"]
            lines.append(f"ip saddr {source} {protocol} dport {low}-{high} accept")
    body = "\n".join(f"    {line}" for line in lines)
    return (f"table inet {TABLE}\ndelete table inet {TABLE}\n"
            f"table inet {TABLE} {{\n  chain input {{\n"
            f"    type filter hook input priority 0; policy drop;\n{body}\n  }}\n}}\n")


def open_nft() -> str:
    """Remove the table (the host is no instance now)."""
    return f"table inet {TABLE}\ndelete table inet {TABLE}\n"


class EnforcedFirewall:
    """The thread that keeps every instance host's table equal to its rulesets."""

    def __init__(self, fake: Any, hosts: list[Any], interval: float = 0.2) -> None:
        self.fake, self.hosts, self.interval = fake, hosts, interval
        self.peers = [h.ip for h in hosts]
        self.applied: dict[str, str] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bed-firewall", daemon=True)

    def start(self) -> EnforcedFirewall:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def wanted(self) -> dict[str, str]:
        """The nft text each host should have now."""
        with self.fake.lock:
            rulesets = {k: list(v["rules"]) for k, v in self.fake.firewall_rulesets.items()}
        live = {i["ip"]: i for i in self.fake.inventory()
                if i["ip"] and not i["foreign"] and i["status"] not in _GONE}
        out = {}
        for host in self.hosts:
            inst = live.get(host.ip)
            if inst is None:
                out[host.ip] = open_nft()
                continue
            rules = [r for rid in inst["firewall_rulesets"] for r in rulesets.get(rid, [])]
            out[host.ip] = ruleset_nft(rules, [p for p in self.peers if p != host.ip])
        return out

    def sync(self) -> None:
        """Apply what changed (once; the thread calls it every `interval`)."""
        wanted = self.wanted()
        for host in self.hosts:
            text = wanted[host.ip]
            if self.applied.get(host.ip, open_nft()) == text:
                continue
            done = host.run("nft -f -", input=text, timeout=30)
            if done.returncode != 0:
                self.errors.append(f"{host.name}: nft: {done.stderr.strip()}")
                continue
            self.applied[host.ip] = text

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception as exc:  # reported by the bed's owner (`errors`), never swallowed
                self.errors.append(f"{type(exc).__name__}: {exc}")
