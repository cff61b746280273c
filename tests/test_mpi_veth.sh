#!/usr/bin/env bash
# MPI across two "hosts" on one machine (docs/DISTRIBUTED.md): two network namespaces joined by a
# veth pair, 10.77.X.1 and 10.77.X.2, each with its own host name; mpirun starts in the first and
# reaches the second through a launch agent (what ssh is on a cluster) that enters it, and the
# ranks talk TCP over the pair (btl tcp, restricted to its subnet). Over it:
#   1. the communicator's suite on 2 ranks (one in each namespace);
#   2. a sharded batch run on 2 ranks, byte-identical to one process;
#   3. data-parallel training on 2 ranks, the bits of one process with accumulate 2.
# Needs root (network namespaces) and iproute2; exits 77 (skipped) without them.
#   test_mpi_veth.sh BINARY_DIR TEST_PLUGIN_DIR
set -euo pipefail
bin=$(cd "$1" && pwd)
plugins=$(cd "$2" && pwd)
T=$bin/tessera
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
  echo "skipped: needs root, ip (iproute2) and unshare to make network namespaces"
  exit 77
fi
tag=t$$
na=${tag}a nb=${tag}b sub=$(($$ % 200 + 20))
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera_mpi_veth.XXXXXX")
cleanup() {
  ip netns del "$na" 2>/dev/null || true
  ip netns del "$nb" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*" >&2
  exit 1
}
if ! ip netns add "$na" 2>"$tmp/netns.err"; then
  echo "skipped: cannot make a network namespace here ($(cat "$tmp/netns.err"))"
  exit 77
fi
ip netns add "$nb"
ip link add "${tag}va" type veth peer name "${tag}vb"
ip link set "${tag}va" netns "$na"
ip link set "${tag}vb" netns "$nb"
ip -n "$na" addr add "10.77.$sub.1/24" dev "${tag}va"
ip -n "$nb" addr add "10.77.$sub.2/24" dev "${tag}vb"
for n in "$na" "$nb"; do ip -n "$n" link set lo up; done
ip -n "$na" link set "${tag}va" up
ip -n "$nb" link set "${tag}vb" up

# The launch agent: called as ssh would be (options, host, command), it runs the command in the
# host's namespace, under the host's own name.
cat >"$tmp/agent.sh" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
case \$host in 10.77.$sub.2) ns=$nb ;; *) ns=$na ;; esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$ns; \$*"
EOF
chmod +x "$tmp/agent.sh"
printf '10.77.%s.1 slots=1\n10.77.%s.2 slots=1\n' "$sub" "$sub" >"$tmp/hosts"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive
in_a() { ip netns exec "$na" unshare --uts /bin/sh -c "hostname $na; \"\$@\"" sh "$@"; }
mpi2() {
  in_a mpirun -np 2 --hostfile "$tmp/hosts" --mca plm_rsh_agent "$tmp/agent.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl self,tcp --mca btl_tcp_if_include "10.77.$sub.0/24" --mca oob_tcp_if_include "10.77.$sub.0/24" \
    -x OMP_WAIT_POLICY "$@"
}

# Where the ranks are: one in each namespace, each seeing its own address.
where=$(mpi2 /bin/sh -c 'echo "$(hostname) $(ip -4 -o addr show | grep -o "10\.77\.[0-9]*\.[0-9]*")"' | sort)
[ "$where" = "$(printf '%s 10.77.%s.1\n%s 10.77.%s.2' "$na" "$sub" "$nb" "$sub")" ] ||
  fail "the ranks are not one in each namespace: $where"

# 1. The communicator.
TESSERA_TEST_RANKS=2 mpi2 -x TESSERA_TEST_RANKS "$bin/tests/test_comm" >"$tmp/comm.out" 2>&1 || { cat "$tmp/comm.out" >&2; fail "test_comm over the veth pair"; }
[ "$(grep -c "PASSED" "$tmp/comm.out")" = 2 ] && ! grep -q "FAILED" "$tmp/comm.out" || fail "test_comm did not pass on both ranks"
echo "test_comm: 2 ranks over the veth pair"

# 2. A sharded batch run.
for i in $(seq 0 24); do printf 'line %d %*s\n' "$i" $((12 + i % 5)) z; done >"$tmp/lines.txt"
cat >"$tmp/run.yaml" <<EOF
plugins:
  - name: probe
    path: $plugins
model:
  d_model: 32
  n_heads: 2
  n_layers: 2
  stem: {kind: tokens, vocab_size: 300}
  positions: {kind: learned, max_len: 64}
  head: {kind: pool, pool: mean}
data: {path: lines.txt}
runtime: {batch_size: 2}
task: {kind: embed}
EOF
"$T" run "$tmp/run.yaml" --out "$tmp/one" --quiet >/dev/null || fail "one process"
mpi2 "$T" run "$tmp/run.yaml" --out "$tmp/two" --quiet >/dev/null || fail "the sharded run over the veth pair"
diff -r "$tmp/one" "$tmp/two" >/dev/null || fail "the sharded run over the veth pair is not byte-identical to one process"
echo "sharded run: 2 ranks over the veth pair, byte-identical to one process"

# 3. Data-parallel training.
{
  echo "id,text,label"
  for i in $(seq 0 59); do echo "t$i,word$((i % 7)) $((i % 3)) tail,c$((i % 3))"; done
} >"$tmp/train.csv"
cat >"$tmp/train.yaml" <<EOF
plugins:
  - name: text
    path: $bin/plugins
    options: {tokenizer: bytes}
model:
  d_model: 32
  n_heads: 2
  n_layers: 1
  stem: {kind: tokens, vocab_size: 259}
  positions: {kind: learned, max_len: 64}
  head: {kind: classifier, n_classes: 3, pool: mean}
data: {path: train.csv}
train: {max_steps: 8, batch_size: 8, accumulate: 2, lr: 3.0e-3, eval_every: 4, validation: 0.2}
runtime: {threads: 1}
EOF
"$T" train "$tmp/train.yaml" --out "$tmp/t1" --quiet >/dev/null || fail "training in one process"
mpi2 "$T" train "$tmp/train.yaml" --out "$tmp/t2" --quiet >/dev/null || fail "training over the veth pair"
cmp -s "$tmp/t1/best.safetensors" "$tmp/t2/best.safetensors" || fail "training over the veth pair: other weights"
echo "training: 2 ranks over the veth pair, the bits of one process with accumulate 2"
