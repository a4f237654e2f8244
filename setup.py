"""Build hook, beside pyproject.toml (which holds everything else): ship templates/ and setup/.

They stay at the top of the checkout, where contributors edit them; a wheel carries copies as
package data in infra/_shipped/, where infra/core/paths.py (`shipped`) finds them once rayfleet is
installed without its checkout. An editable install reads the checkout itself. MANIFEST.in puts
both folders in the sdist, so a wheel built from it has them too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: Top-level folders of the checkout that the package needs at run time.
SHIPPED = ("templates", "setup")


class BuildPyWithShipped(build_py):
    """`build_py`, then the shipped folders copied into the built package."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for name in SHIPPED:
            target = Path(self.build_lib) / "infra" / "_shipped" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(ROOT / name, target,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithShipped})
