"""Validators match the whole value: `re.match(...$)` lets one trailing newline through (Python's
`$` also matches before a final "\\n"), and a newline in a value that lands in a shell script or
an #SBATCH line is a new line of it. Each case is the valid value plus "\\n"."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.cli import loading
from infra.core import serve
from infra.core.errors import SpecError, UsageError
from infra.node import identity
from infra.node.lambda_cloud import tags

GCP = ('provider: gcp-tpu\nproject: {project}\nzone: {zone}\nlabels: {labels}\n'
       'tpu_workers: {{tpu: {{accelerator_type: v4-8, max_workers: 2}}}}\n')

SPECS = [
    # (file name, YAML with the "\n" in a double-quoted string, field the error names)
    ("ok.yaml", 'provider: slurm\ncpus_per_node: 4\npartition: "debug\\n"\n', "partition"),
    ("ok.yaml", 'provider: slurm\ncpus_per_node: 4\nenvironment: {modules: ["gcc\\n"]}\n',
     "environment.modules"),
    ("ok.yaml", 'provider: slurm\ncpus_per_node: 4\nenvironment: {env_vars: {"A\\n": x}}\n',
     "environment.env_vars"),
    ("ok.yaml", 'provider: slurm\ncpus_per_node: 4\nextra_sbatch_options: ["--mail-type=END\\n"]\n',
     "extra_sbatch_options"),
    ("ok.yaml", GCP.format(project='"my-class-project\\n"', zone="us-central2-b", labels="{}"),
     "project"),
    ("ok.yaml", GCP.format(project="my-class-project", zone='"us-central2-b\\n"', labels="{}"),
     "zone"),
    ("ok.yaml", GCP.format(project="my-class-project", zone="us-central2-b",
                           labels='{"team\\n": x}'), "labels"),
    ("ok.yaml", GCP.format(project="my-class-project", zone="us-central2-b",
                           labels='{team: "x\\n"}'), "labels"),
]


@pytest.mark.parametrize(("file_name", "text", "field"), SPECS)
def test_a_trailing_newline_is_refused_naming_the_field(tmp_path: Path, file_name: str, text: str,
                                                       field: str) -> None:
    path = tmp_path / file_name
    path.write_text(text)
    # The same spec without the newline is valid: the newline alone is what is refused.
    valid = tmp_path / "valid.yaml"
    valid.write_text(text.replace("\\n", ""))
    loading.load_spec(valid)
    with pytest.raises(SpecError) as caught:
        loading.load_spec(path)
    message = str(caught.value)
    assert field in message and "\n" not in message, message


def test_a_cluster_name_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ok\n.yaml"
    path.write_text("provider: local\n")
    with pytest.raises(SpecError, match="cluster name"):
        loading.load_spec(path)


def test_the_small_validators_match_whole_values(tmp_path: Path) -> None:
    assert identity.is_cluster_id("0123abcd") and not identity.is_cluster_id("0123abcd\n")
    assert tags.valid("rayfleet-cluster", "x") and not tags.valid("rayfleet-cluster\n", "x")
    with pytest.raises(UsageError, match="TARGET"):
        serve.load("examples.serve_model:app\n", tmp_path)
