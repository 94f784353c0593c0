# Two hosts on this machine for the cross-host benches (sourced, not run): network
# namespaces joined by a veth pair whose both ends are rate-limited with `tc tbf`, each
# command run on a host in its own PID, IPC and mount namespaces with a fresh /dev/shm,
# so nothing one-host (shared memory, pidfds) reaches across. Needs root.
#
#   source benches/namespaced_hosts.sh; make_hosts RATE; on 0 CMD...; on 1 CMD...
# Sets H (namespaces), V (veth ends), A (addresses), SECRET (a job secret file); removes
# everything on exit.
H=(cc2h0 cc2h1)
V=(cc2v0 cc2v1)
A=(10.88.0.1 10.88.0.2)
SECRET=""
remove_hosts() {
  for h in "${H[@]}"; do ip netns del "$h" 2>/dev/null || true; done
  [ -z "$SECRET" ] || rm -f "$SECRET"
}
make_hosts() {
  local rate=$1
  [ "$(id -u)" = 0 ] || { echo "namespaced hosts need root" >&2; exit 1; }
  trap remove_hosts EXIT
  remove_hosts
  SECRET=$(mktemp)
  chmod 600 "$SECRET"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SECRET"
  ip link add "${V[0]}" type veth peer name "${V[1]}"
  for h in 0 1; do
    ip netns add "${H[$h]}"
    ip link set "${V[$h]}" netns "${H[$h]}"
    ip netns exec "${H[$h]}" ip addr add "${A[$h]}/24" dev "${V[$h]}"
    ip netns exec "${H[$h]}" ip link set "${V[$h]}" up
    ip netns exec "${H[$h]}" ip link set lo up
    ip netns exec "${H[$h]}" tc qdisc add dev "${V[$h]}" root tbf rate "$rate" burst 512kb latency 100ms
  done
}
# `on H CMD...`: CMD on host H, PID 1 of its own namespaces with a fresh /dev/shm.
on() {
  local h=$1
  shift
  ip netns exec "${H[$h]}" unshare --pid --fork --ipc --mount --mount-proc \
    sh -c 'mount -t tmpfs tmpfs /dev/shm && exec "$@"' sh "$@"
}
