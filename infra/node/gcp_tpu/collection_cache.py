"""A Google API client whose collections are made once.

googleapiclient makes a collection (`compute.instances()`, `tpu.projects().locations().nodes()`)
anew at every call of its accessor: every method of the collection again, each with a docstring
rendered from the API's schemas, tens of milliseconds of CPU. Every call rayfleet makes goes
through one, so a poll loop on the head (the autoscaler, the idle watcher) paid that at every
request. A collection holds no state of a request (each method call returns a new HttpRequest), so
one made once serves every later call.
"""

from __future__ import annotations

from typing import Any


class Collections:
    """`client` (a discovery Resource) with its collection accessors answering the same collection
    (itself wrapped) at every call; every other attribute is the client's own."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._made: dict[str, Collections] = {}

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._client, name)
        # The discovery document's sub-collections of this resource; methods (get, list, ...) and
        # list_next are not among them and stay the client's own.
        if name not in self._client._resourceDesc.get("resources", {}):
            return found

        def collection() -> Collections:
            if name not in self._made:
                self._made[name] = Collections(found())
            return self._made[name]

        return collection
