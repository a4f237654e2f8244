"""Finding a local cluster's processes by its temp dir when its state is gone (after a test)."""

from __future__ import annotations

import re


def temp_dir_pattern(name: str) -> re.Pattern[str]:
    """The temp dir of any local cluster named `name`: `<TMPDIR>/rf-XXXXXXXX/<name>`, the parent
    made by `tempfile.mkdtemp` (8 characters of [a-z0-9_])."""
    return re.compile(r"/rf-[a-z0-9_]{8}/" + re.escape(name) + r"(?![\w.-])")
