#!/usr/bin/env bash
# rayfleet address guard: only root and the autoscaler's user open connections to the given
# addresses from this node.
#
#   sudo bash guard.sh ADDRESS_OR_NAME...
#
# Run as root (the SSH user's sudo, or root itself) after users.sh and before Ray starts;
# idempotent (the table is replaced as a whole, in one nft transaction). Names are resolved here,
# once (IPv4 and IPv6). Who may still connect:
#   - root: the cloud's own agents (e.g. Google's guest agent, OS Login) run as root;
#   - rayfleet-scaler, where it exists (the head): Ray's autoscaler, the idle watcher that removes
#     the cluster and the queued-slice joiner, all of which need the VM's service account.
# Everyone else gets its new connections to those addresses refused (a TCP reset, ECONNREFUSED):
# rayfleet-ray, so every Ray job, and the SSH user too (nothing of rayfleet's that needs them
# runs as it; with its sudo it can still ask as root). Replies on connections others opened to this
# node are not new, so a server of Ray's that a guarded address talks to keeps answering.
# Why: on a Google VM the metadata server hands the VM's service-account token to any local
# process that asks (infra/providers/gcp_tpu/NOTES.md, "What a job can reach").
set -Eeuo pipefail

readonly TABLE=rayfleet_guard
readonly SCALER_USER=rayfleet-scaler

die() { printf 'guard.sh: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (sudo bash guard.sh ...): it changes the node's firewall"
[ $# -ge 1 ] || die "usage: guard.sh ADDRESS_OR_NAME..."
if ! command -v nft >/dev/null && command -v apt-get >/dev/null; then
  # Debian's images have it (priority important); an image without it gets it from its mirror.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null 2>&1 || true
fi
command -v nft >/dev/null || die "nft not found: install the nftables package on the image"

v4=() v6=()
for arg in "$@"; do
  case $arg in
    *:*) v6+=("$arg") ;;
    *[!0-9.]*)
      # A name: every address it has here (a node's resolver may answer for it alone).
      while read -r ip _; do
        case $ip in *:*) v6+=("$ip") ;; *) v4+=("$ip") ;; esac
      done < <(getent ahosts "$arg" | awk '{print $1}' | sort -u) ;;
    *) v4+=("$arg") ;;
  esac
done
[ ${#v4[@]} -gt 0 ] || [ ${#v6[@]} -gt 0 ] || die "none of $* has an address here"

allowed=0
if id -u "$SCALER_USER" >/dev/null 2>&1; then allowed="$allowed, $(id -u "$SCALER_USER")"; fi

rule() {  # FAMILY ADDRESS...
  local family=$1 set
  shift
  # One set of the distinct addresses, comma-separated.
  set=$(printf '%s\n' "$@" | sort -u | paste -sd, -)
  printf '    %s daddr { %s } ct state new meta skuid != { %s } meta l4proto tcp reject with tcp reset\n' \
    "$family" "$set" "$allowed"
  printf '    %s daddr { %s } ct state new meta skuid != { %s } reject\n' "$family" "$set" "$allowed"
}
rules=""
[ ${#v4[@]} -eq 0 ] || rules+=$(rule ip "${v4[@]}")$'\n'
[ ${#v6[@]} -eq 0 ] || rules+=$(rule ip6 "${v6[@]}")$'\n'
# `add` then `delete` makes the delete succeed on a first run; the whole file is one transaction.
nft -f - <<EOF
add table inet $TABLE
delete table inet $TABLE
table inet $TABLE {
  chain output {
    type filter hook output priority 0; policy accept;
$rules  }
}
EOF
