"""The folder `member-add` writes for each member: everything their shell needs, nothing to run.

    <cluster>-<name>/                 0700
      <cluster>-<name>.rayfleet.json  the bundle (0600): what `rayfleet join` reads
      ray-token                       the member's token (0600): RAY_AUTH_TOKEN_PATH
      ca.pem                          the cluster's CA certificate
      ca-bundle.pem                   the cluster's CA and the public CAs (certifi's list and the
                                      system's): REQUESTS_CA_BUNDLE and SSL_CERT_FILE each
                                      *replace* the default list, so other HTTPS keeps working
      env.sh                          `source` it (bash or zsh): the variables stock Ray reads,
                                      its paths resolved from where the folder is at that moment
      README.txt                      the same steps in words
      .rayignore, .gitignore          the access files above: they stay out of every working-dir
                                      upload and out of the student's git; code kept in the
                                      folder itself still uploads

The token is in the bundle and in `ray-token`, both 0600 in the one folder that is sent.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from infra.core import versions
from infra.core.errors import UsageError
from infra.core.sharing import membership
from infra.node import shell
from infra.node.files import atomic_write

ENV_FILE = "env.sh"
README_FILE = "README.txt"
#: Ray's upload honours a .rayignore in any folder it packs (and .gitignore, unless told not to):
#: without them the token travels with `--working-dir .` to the head, where every member's job
#: runs as the same user and could read it.
IGNORE_FILES = (".rayignore", ".gitignore")
#: The access files only, not `*`: a member who keeps their code in this folder and runs
#: `--working-dir .` from it uploads their code (with `*` the upload was empty: "can't open file").
IGNORE_ALL = ("# Your access to the cluster: never upload or commit it.\n"
              f"{membership.TOKEN_FILE}\n*.rayfleet.json\n{membership.CA_FILE}\n"
              f"{membership.CA_BUNDLE_FILE}\nenv.sh\nREADME.txt\n.rayignore\n.gitignore\n")


def bundle_name(cluster: str, member: str) -> str:
    return f"{cluster}-{member}.rayfleet.json"


def ray_install() -> str:
    """What a member installs: the cluster's own Ray (the head runs this machine's version)."""
    return f'pip install "ray[default]=={versions.node_pins()["ray_version"]}"'


#: env.sh's first lines: where the script lies, in bash or zsh, and one line (a non-zero
#: return) from any other shell. The shell-specific expansions run through `eval`, so that dash
#: or sh never expand them (theirs would be "Bad substitution" and a wrong token path).
SHELL_CHECK = """if [ -n "${BASH_VERSION:-}" ]; then eval '_rayfleet_src="${BASH_SOURCE[0]}"'
elif [ -n "${ZSH_VERSION:-}" ]; then eval '_rayfleet_src="${(%):-%x}"'
else
  echo "env.sh: source it from bash or zsh (this shell is neither): run bash, then source env.sh" >&2
  return 1 2>/dev/null || exit 1
fi"""


def env_script(cluster: str, member: str, address: str) -> str:
    """env.sh: the variables Ray's job CLI and JobSubmissionClient read for a joined cluster,
    with the folder's files found relative to the script itself when it is sourced (the folder
    may have moved). RAY_ADDRESS is left alone: an https address there makes a plain
    `python script.py` (ray.init()) fail with "Invalid Ray address"; the job CLI reads
    RAY_API_SERVER_ADDRESS first."""
    here = '"$_rayfleet_dir"'
    lines = [
        f"# Source this file (bash or zsh): `source {cluster}-{member}/env.sh`. Then Ray's own",
        f"# `ray job submit | list | logs | stop` and JobSubmissionClient() reach cluster {cluster!r}",
        f"# as {member}, through its gateway, with the cluster's CA pinned. Keep ray-token private.",
        SHELL_CHECK,
        '_rayfleet_dir="$(CDPATH= cd -- "$(dirname -- "$_rayfleet_src")" && pwd)" || return 1',
        f"export RAY_API_SERVER_ADDRESS={shlex.quote(address)}",
        "export RAY_AUTH_MODE=token",
        f"export RAY_AUTH_TOKEN_PATH={here}/{membership.TOKEN_FILE}",
        f"export REQUESTS_CA_BUNDLE={here}/{membership.CA_BUNDLE_FILE}",
        f"export SSL_CERT_FILE={here}/{membership.CA_BUNDLE_FILE}",
        "unset _rayfleet_dir _rayfleet_src",
    ]
    return "\n".join(lines) + "\n"


def send_line(folder: Path, member: str) -> str:
    """The one line the owner sends with the folder."""
    return (f"send the folder {folder.name}/ privately to {member} (it holds their token); they "
            "run: " + shell.all_of(ray_install(), shell.argv("source", f"{folder.name}/env.sh"),
                                   shell.argv("ray", "job", "submit", "--working-dir", ".", "--",
                                              "python", "train.py")))


def readme(cluster: str, member: str, folder: str, address: str = "") -> str:
    dashboard = address or "the address in env.sh (RAY_API_SERVER_ADDRESS)"
    return f"""You are member {member!r} of the Ray cluster {cluster!r}. This folder is your access:
keep it private (ray-token and the .rayfleet.json file hold your token).

With only Ray (bash or zsh):
    {ray_install()}
    source {folder}/env.sh
    ray job submit --working-dir . -- python train.py
    ray job list; ray job logs JOB_ID; ray job stop JOB_ID

Your code may live in this folder or anywhere else: --working-dir . uploads the folder you run
it from, never ray-token, the bundle or the CA files (.rayignore keeps them out).

The dashboard: open {dashboard} in a browser and sign in with the contents of the file
ray-token. Your browser must trust the cluster's certificate: import ca.pem (this folder) as a
trusted authority (Firefox: Settings > Certificates > Authorities > Import; macOS: Keychain
Access; Windows: certmgr), or accept the warning once for that address.

When the cluster refuses something (a budget spent, access ended, a job that is not yours),
`ray job submit` prints a long Python traceback: the cluster's one-line reason is its LAST line
(a 429, 400 or 404), or for 401/403 the line that starts "Response:" or ends in "(rayfleet's
gateway)" in the middle of it. Look there first.

With rayfleet (`pip install` a copy of the rayfleet repository; its command is `rayfleet`):
    rayfleet join {folder}
    rayfleet submit --cluster {cluster} train.py
    rayfleet logs JOB_ID --cluster {cluster}
    rayfleet usage --cluster {cluster}      your hours, cost and budget left
"""


def same_person(target: Path, cluster: str, member: str) -> bool:
    """Whether `target` may be written for `member` of `cluster`: it does not exist, or it is that
    person's earlier folder or bundle file (then refreshed: bundle, token, env.sh and README
    replaced, every other file kept). Anything else there is refused in one line: it may be
    another person's access, or files of the owner's own."""
    if not target.exists():
        return False
    if target.is_dir():
        found = sorted(target.glob("*.rayfleet.json"))
        bundle_file = found[0] if len(found) == 1 else None
    else:
        bundle_file = target
    held = None
    if bundle_file is not None:
        try:
            held = json.loads(bundle_file.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            held = None
    if isinstance(held, dict) and held.get("cluster") == cluster and held.get("member") == member:
        return True
    whose = (f"{held.get('member')!r} of cluster {held.get('cluster')!r}"
             if isinstance(held, dict) and held.get("member") else "no member bundle of "
             f"{member!r}")
    raise UsageError(f"--out {target}: it exists and holds {whose}; pick another --out or move "
                     "it away (rayfleet replaces only a folder of the same person)")


def write(target: Path, bundle: dict[str, str]) -> Path:
    """The member's folder at `target` (new, or that person's earlier folder: its bundle, token,
    env.sh and README replaced, other files kept); the bundle's path in it."""
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    for old in target.glob("*.rayfleet.json"):
        if old.name != bundle_name(bundle["cluster"], bundle["member"]):
            old.unlink()
    path = refresh(target, bundle)
    atomic_write(target / README_FILE, readme(bundle["cluster"], bundle["member"], target.name,
                                               bundle["address"]), mode=0o644)
    return path


def refresh(target: Path, bundle: dict[str, str]) -> Path:
    """An existing member folder rewritten for `bundle` (a new address or CA, the same token)."""
    cluster, member = bundle["cluster"], bundle["member"]
    membership.write_credentials(target, bundle["ca_cert"], bundle["token"])
    path = target / bundle_name(cluster, member)
    atomic_write(path, json.dumps(bundle, indent=2), mode=0o600)
    atomic_write(target / ENV_FILE, env_script(cluster, member, bundle["address"]), mode=0o644)
    for name in IGNORE_FILES:
        atomic_write(target / name, IGNORE_ALL, mode=0o644)
    return path
