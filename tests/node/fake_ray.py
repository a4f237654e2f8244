"""A stand-in `ray` package for tests of how a node loads Ray's CLI (raycli, setup/users/ray.sh)."""

from __future__ import annotations

from pathlib import Path

from infra.node import raycli


def fake_ray(root: Path, version: str) -> Path:
    """`root` made a PYTHONPATH entry holding a `ray` of `version`, whose CLI module imports the
    optional groups as Ray's does (each in a try), and whose `main` prints one line: the name it
    was run as, how many groups it got, its Python, $RF_PROBE, then its arguments."""
    ray = root / "ray"
    for name in raycli.OPTIONAL_GROUPS:
        module = root / (name.replace(".", "/") + ".py")
        module.parent.mkdir(parents=True, exist_ok=True)
        for parent in module.relative_to(root).parents:
            if parent != Path("."):
                (root / parent / "__init__.py").touch()
        module.write_text("")
    (ray / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (ray / "scripts").mkdir(exist_ok=True)
    (ray / "scripts" / "__init__.py").touch()
    groups = "".join(f"try:\n    import {name}\n    got.append({name!r})\nexcept ImportError:\n"
                     "    pass\n" for name in raycli.OPTIONAL_GROUPS)
    (ray / "scripts" / "scripts.py").write_text(
        "import os\nimport sys\ngot = []\n" + groups
        + "def main():\n    print(sys.argv[0], len(got), sys.executable,"
          " os.environ.get('RF_PROBE', '-'), *sys.argv[1:])\n    return 0\n")
    return root
