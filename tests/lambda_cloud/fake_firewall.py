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
    #: How many PATCH/DELETE of a ruleset after each change of it get Lambda's 409 (the change
    #: is still being applied). A count, not a time: tests stay deterministic on a busy machine.
    ruleset_conflicts: int = 0

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
    def _valid_rules(rules: list[dict[str, Any]]) -> bool:
        """What the reference states in prose only (its schema has checked the rest): `port_range`
        is not allowed for icmp and required for the others; a range runs upwards."""
        for rule in rules:
            ports = rule.get("port_range")
            if (rule["protocol"] == "icmp") != (ports is None):
                return False
            if ports is not None and ports[0] > ports[1]:
                return False
        return True

    def _conflict(self, ruleset: dict[str, Any]) -> None:
        """409 (documented on POST/PATCH/DELETE) while the ruleset's last change is being applied:
        for the next `ruleset_conflicts` PATCH/DELETE after it."""
        if ruleset.get("pending", 0) > 0:
            ruleset["pending"] -= 1
            raise Reject("global/internal-error", "The firewall ruleset is being updated.")

    def _firewall(self, method: str, path: str, body: Any, now: float) -> Any:
        if path == "/firewall-rulesets" and method == "GET":
            return [self._ruleset_json(r, now) for r in self.firewall_rulesets.values()]
        if path == "/firewall-rulesets" and method == "POST":
            name, region, rules = body["name"], body["region"], body["rules"]
            if not name or not self._valid_rules(rules):
                raise Reject("global/invalid-parameters", "Invalid name or rules.")
            rid = uuid.uuid4().hex
            self.firewall_rulesets[rid] = {"id": rid, "name": name, "region": region,
                                           "rules": rules, "created": "2026-01-01T00:00:00Z",
                                           "pending": self.ruleset_conflicts}
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
                if "rules" in body and not self._valid_rules(body["rules"]):
                    raise Reject("global/invalid-parameters", "Invalid request data.")
                self._conflict(ruleset)
                ruleset.update(body, pending=self.ruleset_conflicts)
                return self._ruleset_json(ruleset, now)
            if method == "DELETE":
                self._conflict(ruleset)
                if self._ruleset_json(ruleset, now)["instance_ids"]:
                    raise Reject("firewall-rulesets/firewall-ruleset-in-use")
                del self.firewall_rulesets[ruleset["id"]]
                return {}
        raise Reject("global/object-does-not-exist", f"No route {method} {path}.")
