"""The fake Lambda API's firewall rulesets (OpenAPI 1.8.3: /firewall-rulesets, /firewall-rulesets/{id}).

A mixin of `FakeLambda` (fake_api.py): rulesets live in `self.firewall_rulesets`, and a ruleset is in
use while an instance that is not terminated lists it, as on Lambda (deleting it is then refused).
"""

from __future__ import annotations

import re
import threading
import uuid
from typing import Any

from tests.lambda_cloud.fake_http import REGIONS, Reject

PROTOCOLS = ("tcp", "udp", "icmp", "all")


class FirewallRulesets:
    """What `FakeLambda` gains: the ruleset store, its endpoints and a test helper."""

    lock: threading.RLock
    instances: dict[str, Any]
    firewall_rulesets: dict[str, dict[str, Any]]

    def _status(self, inst: Any, now: float) -> str:
        raise NotImplementedError

    def add_foreign_ruleset(self, name: str, region: str = "us-east-1") -> str:
        """Someone else's firewall ruleset: rayfleet must never change or delete it."""
        with self.lock:
            rid = uuid.uuid4().hex
            self.firewall_rulesets[rid] = {
                "id": rid, "name": name, "region": region, "foreign": True,
                "created": "2025-01-01T00:00:00Z",
                "rules": [{"protocol": "tcp", "port_range": [22, 22], "source_network": "0.0.0.0/0",
                           "description": "colleague's"}]}
            return rid

    def _ruleset_json(self, ruleset: dict[str, Any], now: float) -> dict[str, Any]:
        users = [i.id for i in self.instances.values()
                 if ruleset["id"] in i.firewall_rulesets and self._status(i, now) != "terminated"]
        return {"id": ruleset["id"], "name": ruleset["name"],
                "region": {"name": ruleset["region"], "description": REGIONS[ruleset["region"]]},
                "rules": [dict(r) for r in ruleset["rules"]], "created": ruleset["created"],
                "instance_ids": users}

    @staticmethod
    def _valid_rules(rules: Any) -> bool:
        import ipaddress

        if not isinstance(rules, list):
            return False
        for rule in rules:
            if not isinstance(rule, dict) or set(rule) - {"protocol", "port_range", "source_network",
                                                          "description"}:
                return False
            if rule.get("protocol") not in PROTOCOLS or not isinstance(rule.get("description"), str) \
                    or len(rule["description"]) > 128:
                return False
            try:
                ipaddress.IPv4Network(rule.get("source_network"), strict=False)
            except (ValueError, TypeError):
                return False
            ports = rule.get("port_range")
            if rule["protocol"] == "icmp":
                if ports is not None:
                    return False
            elif not (isinstance(ports, list) and len(ports) == 2
                      and all(isinstance(p, int) and 1 <= p <= 65535 for p in ports)
                      and ports[0] <= ports[1]):
                return False
        return True

    def _firewall(self, method: str, path: str, body: Any, now: float) -> Any:
        if path == "/firewall-rulesets" and method == "GET":
            return [self._ruleset_json(r, now) for r in self.firewall_rulesets.values()]
        if path == "/firewall-rulesets" and method == "POST":
            if not isinstance(body, dict) or set(body) - {"name", "region", "rules"}:
                raise Reject("global/invalid-parameters", "Invalid request data.")
            name, region, rules = body.get("name"), body.get("region"), body.get("rules")
            if not isinstance(name, str) or not 0 < len(name) <= 64 or region not in REGIONS \
                    or not self._valid_rules(rules):
                raise Reject("global/invalid-parameters", "Invalid name, region or rules.")
            rid = uuid.uuid4().hex
            self.firewall_rulesets[rid] = {"id": rid, "name": name, "region": region,
                                           "rules": rules, "created": "2026-01-01T00:00:00Z"}
            return self._ruleset_json(self.firewall_rulesets[rid], now)
        match = re.fullmatch(r"/firewall-rulesets/([^/]+)", path)
        if match and match.group(1) != "global":
            ruleset = self.firewall_rulesets.get(match.group(1))
            if ruleset is None:
                raise Reject("global/object-does-not-exist",
                              "Firewall ruleset does not exist or you do not have permission to "
                              "access it.")
            if method == "GET":
                return self._ruleset_json(ruleset, now)
            if method == "PATCH":
                if not isinstance(body, dict) or set(body) - {"name", "rules"} or (
                        "rules" in body and not self._valid_rules(body["rules"])):
                    raise Reject("global/invalid-parameters", "Invalid request data.")
                ruleset.update(body)
                return self._ruleset_json(ruleset, now)
            if method == "DELETE":
                if self._ruleset_json(ruleset, now)["instance_ids"]:
                    raise Reject("firewall-rulesets/firewall-ruleset-in-use")
                del self.firewall_rulesets[ruleset["id"]]
                return {}
        raise Reject("global/object-does-not-exist", f"No route {method} {path}.")
