#!/usr/bin/env bash
# MPI across two "hosts" on one machine (docs/DISTRIBUTED.md): two network namespaces joined by a
# veth pair (tests/mpi_netns.sh), the ranks one in each, talking TCP over the pair. Over it:
#   1. the communicator's suite on 2 ranks (one in each namespace);
#   2. a sharded batch run on 2 ranks, byte-identical to one process;
#   3. data-parallel training on 2 ranks, the bits of one process with accumulate 2.
# Needs root (network namespaces), iproute2 and util-linux; exits 77 (skipped) without them.
#   test_mpi_veth.sh BINARY_DIR TEST_PLUGIN_DIR
set -euo pipefail
bin=$(cd "$1" && pwd)
plugins=$(cd "$2" && pwd)
T=$bin/tessera
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v unshare >/dev/null || ! command -v nsenter >/dev/null; then
  echo "skipped: needs root, ip (iproute2), unshare and nsenter to make network namespaces"
  exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera_mpi_veth.XXXXXX")
source "$(dirname "$0")/mpi_netns.sh"
cleanup() {
  netns_pair_down
  rm -rf "$tmp"
}
trap cleanup EXIT
source "$(dirname "$0")/mpi_common.sh"
if ! netns_pair_up "$tmp"; then
  echo "skipped: no network namespaces here"
  exit 77
fi
mpi2() { mpi_pair -x OMP_WAIT_POLICY "$@"; }
na=$netns_a nb=$netns_b sub=$netns_sub

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
runtime: {batch_size: 2, threads: 1}
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
