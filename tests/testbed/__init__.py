"""A real multi-host test bed on one machine: SSH hosts in namespaces, and real Slurm. See README.md."""

from tests.testbed.core import Testbed
from tests.testbed.hosts import RAY_SAFE_ENV, Host, Node
from tests.testbed.slurm import LocalSlurm, SlurmCluster

__all__ = ["RAY_SAFE_ENV", "Host", "LocalSlurm", "Node", "SlurmCluster", "Testbed"]
