"""The node package (infra/node/) as one zip built from this checkout, and putting it on a head.

What runs on a cluster's nodes reaches them whole: `node_zip` packs `infra/__init__.py` and every
module under `infra/node/`, whatever they are, so no list of files exists to forget one in. The
zip goes on the head's PYTHONPATH (Python imports from a zip as from a folder). Its name carries a
hash of its content: a daemon or Ray monitor that runs with one zip keeps reading that one (Python
reads modules from a zip lazily, by offsets it read once), while a later `up` ships its own.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import zipfile
from pathlib import Path
from typing import Any

import infra
import infra.node

#: On the head, relative to the login user's home: the zips, one per content.
NODE_DIR = "rayfleet/node"
#: A fixed time for every entry, so the same sources give the same bytes (and the same name).
_EPOCH = (2020, 1, 1, 0, 0, 0)


@functools.cache
def node_zip(subpackages: tuple[str, ...] | None = None) -> bytes:
    """`infra/__init__.py` and the whole `infra/node/` tree (.py files), deterministic.

    With `subpackages`, only infra/node/'s own modules and those subpackages of it (e.g.
    ("slurm",)): for a zip that must stay small, the other providers' node code stays out."""
    top = Path(infra.__file__).parent
    node = Path(infra.node.__file__).parent
    files = [top / "__init__.py"]
    files += sorted(p for p in node.rglob("*.py") if "__pycache__" not in p.parts
                    and (subpackages is None or len(p.relative_to(node).parts) == 1
                         or p.relative_to(node).parts[0] in subpackages))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            entry = zipfile.ZipInfo(str(Path("infra") / path.relative_to(top)), _EPOCH)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, path.read_bytes())
    return out.getvalue()


def zip_name(subpackages: tuple[str, ...] | None = None) -> str:
    return f"rayfleet-node-{hashlib.sha256(node_zip(subpackages)).hexdigest()[:12]}.zip"


def head_path() -> str:
    """Where the zip lives on a head, relative to the login user's home."""
    return f"{NODE_DIR}/{zip_name()}"


def node_zip_base64(subpackages: tuple[str, ...] | None = None) -> str:
    """The zip for a script that writes it itself (Slurm's batch script), in 76-column lines."""
    return base64.encodebytes(node_zip(subpackages)).decode().rstrip("\n")


#: The longest piece of the zip in one environment string: Linux refuses to start a program with
#: a string over 128 KiB (MAX_ARG_STRLEN), and srun hands the zip to worker steps in environment.
PART_BYTES = 96 * 1024


def node_zip_parts(subpackages: tuple[str, ...] | None = None) -> list[str]:
    """`node_zip_base64` in pieces of whole lines, each under PART_BYTES: every line holds a
    multiple of 4 characters, so the pieces joined decode to the zip."""
    parts: list[str] = []
    lines: list[str] = []
    size = 0
    for line in node_zip_base64(subpackages).splitlines():
        if lines and size + len(line) + 1 > PART_BYTES:
            parts.append("\n".join(lines))
            lines, size = [], 0
        lines.append(line)
        size += len(line) + 1
    parts.append("\n".join(lines))
    return parts


def put(sftp: Any, remote: str, data: bytes, mode: int) -> None:
    """Write a file on a head through SFTP: created with `mode` before any byte is in it, then
    renamed over `remote`, so a reader never sees half of it."""
    tmp = f"{remote}.rayfleet-tmp"
    with sftp.open(tmp, "wb") as handle:
        handle.chmod(mode)
        handle.write(data)
    sftp.posix_rename(tmp, remote)


def upload(sftp: Any) -> str:
    """Put the zip on the head (unless that content is there already); its home-relative path.
    The caller made `NODE_DIR`."""
    remote = head_path()
    try:
        if sftp.stat(remote).st_size == len(node_zip()):
            return remote
    except OSError:
        pass
    put(sftp, remote, node_zip(), 0o644)
    return remote
