"""Time from `invoke up --provider=slurm` to all Ray nodes alive, next to the classic sleep recipe.

Both run on the same real Slurm (the test bed's 2-node cluster, submitted through its login host
over SSH) in the same run, alternating, for 1 and 2 nodes:

- rayfleet: from starting `invoke up` to the moment the batch script saw every node alive in the
  GCS (`ready_at` in its info file); also the whole `invoke up` (until the dashboard answered),
  and where Ray's part went (the info file's timeline: GCS listening, head registered, the rest).
- recipe: the script HPC users copy (head, `sleep 10`, each worker then `sleep 5`), from `sbatch`
  to the moment it would start the user's program (after its sleeps), with the number of nodes
  alive at that moment.

Prints one line per run and a summary with the ratio at each size and the growth per extra node.
Usage: python bench/slurm_up.py [--reps 2] [--quick]   (root; needs the test bed's packages)
--quick: one run at 1 node of each method (CI runs it so the bench cannot rot).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from tests.testbed.slurm import SlurmCluster  # noqa: E402

RECIPE = """#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --output=recipe-%j.out
export RAY_USAGE_STATS_ENABLED=0 RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0
nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
read -r -a nodes_array <<< "$(echo $nodes)"
head_node=${{nodes_array[0]}}
head_node_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address)
port=6379
ip_head=$head_node_ip:$port
srun --nodes=1 --ntasks=1 -w "$head_node" ray start --head --node-ip-address="$head_node_ip" \\
  --port=$port --num-cpus=1 --object-store-memory=100000000 --block &
sleep 10
worker_num=$((SLURM_JOB_NUM_NODES - 1))
for ((i = 1; i <= worker_num; i++)); do
  srun --nodes=1 --ntasks=1 -w "${{nodes_array[$i]}}" ray start --address "$ip_head" \\
    --num-cpus=1 --object-store-memory=100000000 --block &
  sleep 5
done
# Here the recipe starts the user's program. Record when, and how many nodes were really alive.
ready=$(date +%s.%N)
alive=$(python3 -c "
from ray._raylet import GcsClient
c = GcsClient(address='$ip_head')
print(sum(1 for n in c.get_all_node_info(timeout=5).values() if n.state == 0))")
echo "{{\\"ready_at\\": $ready, \\"alive\\": $alive}}" > recipe-$SLURM_JOB_ID.json
wait
"""


def spec_text(cluster: SlurmCluster, nodes: int, extra: str = "") -> str:
    login = cluster.login_host
    return f"""provider: slurm
submit:
  host: {login.ip}
  user: {login.ssh_user}
  key: {login.ssh_key_path}
  proxy_command: {cluster.testbed.proxy_command}
  known_hosts: {cluster.testbed.known_hosts_path}
  workdir: {cluster.jobs_dir}
nodes: {nodes}
cpus_per_node: 1
object_store_memory_mb: 100
ready_timeout_s: 120
{extra}"""


def run_ours(cluster: SlurmCluster, work: Path, nodes: int, env: dict[str, str],
             extra: str = "") -> dict[str, float]:
    """`extra`: spec lines added to the bench's (a test turns off what it does not time)."""
    spec = work / f"bench{nodes}.yaml"
    spec.write_text(spec_text(cluster, nodes, extra))
    started = time.time()
    up = subprocess.run([sys.executable, "-m", "invoke", "up", "--cluster", str(spec)], cwd=ROOT,
                        env=env, capture_output=True, text=True, check=False)
    finished = time.time()
    try:
        if up.returncode != 0:
            raise SystemExit(f"invoke up failed: {up.stderr.strip()[-500:]}")
        state = json.loads((Path(env["RAYFLEET_HOME"]) / "state" / f"bench{nodes}.json").read_text())
        job_name = state["resources"][0]["id"]
        submitted = float(state["resources"][0]["attrs"]["submitted_at"])
        info = json.loads((cluster.jobs_dir / f"{job_name}.json").read_text())
    finally:
        # Always: a job left running would be killed with the test bed, its temp dirs left behind.
        subprocess.run([sys.executable, "-m", "invoke", "teardown", "--cluster", str(spec)],
                       cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    # Where the time went: this machine until sbatch, Slurm until the batch script ran, its
    # environment setup (modules, env, token check), Ray;
    # Ray's part split at the GCS listening and the head node registered (the batch script's
    # timeline): the workers can only register after the head did (Ray looks the head up).
    line = info.get("timeline", {})
    setup = line.get("setup_done", info["started_at"])
    gcs, head = line.get("gcs_listening", setup), line.get("head_alive", 0.0)
    return {"alive": info["ready_at"] - started, "up": finished - started,
            "nodes": len(info["nodes"]), "client": submitted - started,
            "slurm": info["started_at"] - submitted, "setup": setup - info["started_at"],
            "ray": info["ready_at"] - setup, "gcs": gcs - setup, "head": head - gcs,
            "workers": info["ready_at"] - head}


def run_recipe(cluster: SlurmCluster, nodes: int) -> dict[str, float]:
    started = time.time()
    job_id = cluster.sbatch(RECIPE.format(nodes=nodes))
    result = cluster.jobs_dir / f"recipe-{job_id}.json"
    deadline = time.monotonic() + 120
    while not result.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"recipe job {job_id} wrote no result; see {cluster.jobs_dir}")
        time.sleep(0.1)
    data = json.loads(result.read_text())
    cluster.run(f"scancel {job_id}", check=True)
    cluster.wait_job(job_id, timeout=60)
    return {"alive": data["ready_at"] - started, "nodes": data["alive"]}


def main() -> None:
    args = common.options(__doc__, 2, raw=True, quick="one run at 1 node of each method")
    sizes = (1,) if args.quick else (1, 2)
    work, env = common.slurm_scratch("rf-slurm-bench-")
    results: dict[tuple[str, int], list[float]] = {}
    with SlurmCluster(2, work / "slurm") as cluster:
        print(f"2-node Slurm test bed up in {cluster.timings['up']}s; machine: "
              f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
        for rep in range(args.reps):
            for nodes in sizes:
                ours = run_ours(cluster, work, nodes, env)
                recipe = run_recipe(cluster, nodes)
                results.setdefault(("ours", nodes), []).append(ours["alive"])
                results.setdefault(("recipe", nodes), []).append(recipe["alive"])
                print(f"rep {rep + 1}, {nodes} node(s): rayfleet {ours['alive']:.1f}s to "
                      f"{ours['nodes']} alive (client {ours['client']:.1f} + Slurm "
                      f"{ours['slurm']:.1f} + script setup {ours['setup']:.1f} + Ray "
                      f"{ours['ray']:.1f} [GCS {ours['gcs']:.1f}, head "
                      f"{ours['head']:.1f}, workers {ours['workers']:.1f}]; invoke up "
                      f"{ours['up']:.1f}s)"
                      f" | recipe {recipe['alive']:.1f}s ({recipe['nodes']} alive then); load "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
    med = {key: statistics.median(values) for key, values in results.items()}
    print("\nmedian seconds from submission to all nodes alive:")
    for nodes in sizes:
        print(f"  {nodes} node(s): rayfleet {med[('ours', nodes)]:.1f}  recipe "
              f"{med[('recipe', nodes)]:.1f}  ratio {med[('ours', nodes)] / med[('recipe', nodes)]:.2f}")
    if len(sizes) > 1:
        print(f"growth per extra node: rayfleet {med[('ours', 2)] - med[('ours', 1)]:+.1f}s, "
              f"recipe {med[('recipe', 2)] - med[('recipe', 1)]:+.1f}s")
    print("target: ratio <= 0.50 at 2 nodes; growth well under the recipe's +5 s")


if __name__ == "__main__":
    main()
