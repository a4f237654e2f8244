"""The Lambda Cloud API's refusals as typed errors (api.py raises them, chosen by the answer's
`error.code` through `ERRORS`, never by its message text). api.py re-exports every name here:
callers catch `api.NotFound` and the like.
"""

from __future__ import annotations

from infra.node.errors import ProviderError, UsageError


class LambdaError(ProviderError):
    """The Lambda API refused or failed a request. `code` is the API's `error.code`."""

    def __init__(self, message: str, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class InvalidApiKey(LambdaError):
    """401 global/invalid-api-key."""


class AccountInactive(LambdaError):
    """403 global/account-inactive (or an invalid billing address)."""


class NotFound(LambdaError):
    """404 global/object-does-not-exist."""


class InvalidParameters(LambdaError):
    """400 global/invalid-parameters (includes a duplicate SSH key name)."""


class InsufficientCapacity(LambdaError):
    """400 instance-operations/launch/insufficient-capacity: try the next choice."""


class QuotaExceeded(LambdaError):
    """400 global/quota-exceeded: no choice will work until the quota is raised."""


class FileSystemInWrongRegion(LambdaError):
    """400 instance-operations/launch/file-system-in-wrong-region."""


class Duplicate(LambdaError):
    """400/409 global/duplicate."""


class RulesetInUse(LambdaError):
    """400 firewall-rulesets/firewall-ruleset-in-use: instances still use it (terminate first)."""


class Unavailable(LambdaError):
    """429/5xx/network errors that outlasted the retries."""


class LaunchOutcomeUnknown(LambdaError):
    """A launch request was sent but its answer was lost (timeout, 5xx, reset).

    The instance may or may not exist: find it by name before launching again.
    """


class MissingApiKey(UsageError):
    """No API key in LAMBDA_API_KEY or ~/.lambda_cloud/lambda_keys."""


ERRORS: dict[str, type[LambdaError]] = {
    "global/invalid-api-key": InvalidApiKey,
    "global/account-inactive": AccountInactive,
    "global/invalid-address": AccountInactive,
    "global/object-does-not-exist": NotFound,
    "global/invalid-parameters": InvalidParameters,
    "global/quota-exceeded": QuotaExceeded,
    "instance-operations/launch/insufficient-capacity": InsufficientCapacity,
    "instance-operations/launch/file-system-in-wrong-region": FileSystemInWrongRegion,
    "global/duplicate": Duplicate,
    "firewall-rulesets/firewall-ruleset-in-use": RulesetInUse,
}
