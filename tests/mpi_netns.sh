# Two "hosts" on one machine for MPI, sourced by tests/test_mpi_veth.sh and
# tools/microbench/mpi_scaling.sh: two network namespaces (each with a UTS namespace, for a host
# name of its own) joined by a veth pair, 10.77.S.1 and 10.77.S.2, and `mpi_pair ARGS...`, which
# runs `mpirun -np 2 ARGS...` from the first with one rank in each. mpirun reaches the second
# "host" through a launch agent (what ssh is on a cluster) that enters its namespaces; the ranks
# talk TCP over the pair. The namespaces are held by two sleeping processes and entered with
# nsenter, so nothing is mounted (`ip netns` would bind-mount, which a chroot refuses); they go
# when the holders are killed. Needs root, iproute2 and util-linux (unshare, nsenter).
#   netns_pair_up TMPDIR   (returns 1, saying why on stderr, when namespaces cannot be made)
#   netns_pair_down
netns_pair_up() {
  netns_dir=$1
  netns_sub=$(($$ % 200 + 20))
  netns_tag=t$$
  unshare --net --uts sleep 100000 2>"$netns_dir/netns.err" &
  netns_pa=$!
  unshare --net --uts sleep 100000 2>>"$netns_dir/netns.err" &
  netns_pb=$!
  sleep 0.2
  if ! kill -0 "$netns_pa" 2>/dev/null || ! kill -0 "$netns_pb" 2>/dev/null ||
    [ "$(readlink /proc/$netns_pa/ns/net)" = "$(readlink /proc/self/ns/net)" ]; then
    echo "cannot make a network namespace here: $(cat "$netns_dir/netns.err")" >&2
    netns_pair_down
    return 1
  fi
  nsenter --target "$netns_pa" --uts hostname "${netns_tag}a"
  nsenter --target "$netns_pb" --uts hostname "${netns_tag}b"
  ip link add "${netns_tag}va" netns "$netns_pa" type veth peer name "${netns_tag}vb" netns "$netns_pb" || {
    netns_pair_down
    return 1
  }
  nsenter --target "$netns_pa" --net ip addr add "10.77.$netns_sub.1/24" dev "${netns_tag}va"
  nsenter --target "$netns_pb" --net ip addr add "10.77.$netns_sub.2/24" dev "${netns_tag}vb"
  for p in "$netns_pa" "$netns_pb"; do nsenter --target "$p" --net ip link set lo up; done
  nsenter --target "$netns_pa" --net ip link set "${netns_tag}va" up
  nsenter --target "$netns_pb" --net ip link set "${netns_tag}vb" up
  netns_a=${netns_tag}a netns_b=${netns_tag}b
  cat >"$netns_dir/agent.sh" <<EOF
#!/bin/sh
# Called as ssh would be (options, host, command): the command in that host's namespaces.
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
case \$host in 10.77.$netns_sub.2) pid=$netns_pb ;; *) pid=$netns_pa ;; esac
exec nsenter --target "\$pid" --net --uts /bin/sh -c "\$*"
EOF
  chmod +x "$netns_dir/agent.sh"
  printf '10.77.%s.1 slots=1\n10.77.%s.2 slots=1\n' "$netns_sub" "$netns_sub" >"$netns_dir/hosts"
}
netns_pair_down() {
  kill "${netns_pa:-}" "${netns_pb:-}" 2>/dev/null || true
  wait "${netns_pa:-}" "${netns_pb:-}" 2>/dev/null || true
}
# A command in the first namespace (a) or the second (b).
in_ns() {
  local pid
  if [ "$1" = a ]; then pid=$netns_pa; else pid=$netns_pb; fi
  shift
  nsenter --target "$pid" --net --uts "$@"
}
mpi_pair() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in_ns a mpirun -np 2 --hostfile "$netns_dir/hosts" \
    --mca plm_rsh_agent "$netns_dir/agent.sh" --mca plm_rsh_no_tree_spawn 1 --mca btl self,tcp \
    --mca btl_tcp_if_include "10.77.$netns_sub.0/24" --mca oob_tcp_if_include "10.77.$netns_sub.0/24" "$@"
}
