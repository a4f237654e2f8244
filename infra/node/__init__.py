"""Everything rayfleet runs on a cluster's nodes, in one package that reaches the head whole.

The idle watcher (`autodown`) and each provider's removal action (`<provider>/autodown.py`), the
Lambda and Slurm Ray node providers, GCP's queued-slice joiner, Slurm's node helper, the one
supervisor of every head daemon (`supervise`), and what they stand on: `errors` (the base of
rayfleet's error tree), `identity` (launch tags), `net`, `rayproc` (processes, identified by pid
and start time), `files` (the one atomic write) and `retry` (the one poll/retry loop).

The rule: modules here import only the standard library, Ray (and what Ray itself depends on,
e.g. filelock), requests and this package; GCP's modules also call Google's client, which GCP
nodes get from the node installer, and import it lazily, inside the calls. The laptop ships this
package to a head as one zip (`infra.core.shipping`), so nothing keeps a list of its files;
tests/node/test_node_package.py proves the rule for every module. Laptop code may import from here
(this is the lowest layer); nothing here imports the laptop's modules.
"""
