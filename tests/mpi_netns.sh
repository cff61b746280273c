# Two "hosts" on one machine for MPI, sourced by tests/test_mpi_veth.sh and
# tools/microbench/mpi_scaling.sh: two network namespaces joined by a veth pair, 10.77.S.1 and
# 10.77.S.2, and `mpi_pair ARGS...`, which runs `mpirun -np 2 ARGS...` from the first with one rank
# in each. mpirun reaches the second "host" through a launch agent (what ssh is on a cluster) that
# runs the command in that namespace under its own host name (a UTS namespace); the ranks talk TCP
# over the pair. Needs root, iproute2 and util-linux's unshare.
#   netns_pair_up TMPDIR   (returns 1, saying why on stderr, when namespaces cannot be made)
#   netns_pair_down
netns_pair_up() {
  netns_dir=$1
  netns_tag=t$$
  netns_a=${netns_tag}a netns_b=${netns_tag}b netns_sub=$(($$ % 200 + 20))
  ip netns add "$netns_a" 2>"$netns_dir/netns.err" || {
    echo "cannot make a network namespace here: $(cat "$netns_dir/netns.err")" >&2
    return 1
  }
  ip netns add "$netns_b"
  ip link add "${netns_tag}va" type veth peer name "${netns_tag}vb"
  ip link set "${netns_tag}va" netns "$netns_a"
  ip link set "${netns_tag}vb" netns "$netns_b"
  ip -n "$netns_a" addr add "10.77.$netns_sub.1/24" dev "${netns_tag}va"
  ip -n "$netns_b" addr add "10.77.$netns_sub.2/24" dev "${netns_tag}vb"
  for n in "$netns_a" "$netns_b"; do ip -n "$n" link set lo up; done
  ip -n "$netns_a" link set "${netns_tag}va" up
  ip -n "$netns_b" link set "${netns_tag}vb" up
  cat >"$netns_dir/agent.sh" <<EOF
#!/bin/sh
# Called as ssh would be (options, host, command): the command in that host's namespace.
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
case \$host in 10.77.$netns_sub.2) ns=$netns_b ;; *) ns=$netns_a ;; esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$ns; \$*"
EOF
  chmod +x "$netns_dir/agent.sh"
  printf '10.77.%s.1 slots=1\n10.77.%s.2 slots=1\n' "$netns_sub" "$netns_sub" >"$netns_dir/hosts"
}
netns_pair_down() {
  ip netns del "$netns_a" 2>/dev/null || true
  ip netns del "$netns_b" 2>/dev/null || true
}
# A command in the first namespace (a) or the second (b), under that host's name.
in_ns() {
  local ns
  if [ "$1" = a ]; then ns=$netns_a; else ns=$netns_b; fi
  shift
  ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns; \"\$@\"" sh "$@"
}
mpi_pair() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in_ns a mpirun -np 2 --hostfile "$netns_dir/hosts" \
    --mca plm_rsh_agent "$netns_dir/agent.sh" --mca plm_rsh_no_tree_spawn 1 --mca btl self,tcp \
    --mca btl_tcp_if_include "10.77.$netns_sub.0/24" --mca oob_tcp_if_include "10.77.$netns_sub.0/24" "$@"
}
