#!/usr/bin/env bash
# MPI scaling on this machine (docs/DISTRIBUTED.md, "Speed"): 2 ranks x 1 thread against 1 process
# x 2 threads, side by side in alternation, for a batch run and for data-parallel training; then,
# as root, the allreduce over a veth pair between two network namespaces against the pair's own
# TCP bandwidth (iperf3). A developer's measurement, not a test. Prints medians and ranges.
#   tools/microbench/mpi_scaling.sh [BUILD_DIR] [REPS]      # defaults: build/release, 5
# Needs: the build, Debian's dataset-fashion-mnist (both workloads), openmpi-bin; for the veth
# part root, iproute2 and iperf3.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(cd "${1:-build/release}" && pwd)
reps=${2:-5}
T=$bin/tessera
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera_mpi_scaling.XXXXXX")
source tests/mpi_netns.sh
trap 'netns_pair_down; rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive
stats() {  # stats V1 V2 ...: "median (min to max)"
  printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
    printf "%.0f (%.0f to %.0f)", m, v[1], v[NR]}'
}
ratios() {  # ratios "A1 A2 ..." "B1 B2 ...": the median of B_i / A_i, pair by pair
  paste <(printf '%s\n' $1) <(printf '%s\n' $2) | awk '{print $2 / $1}' | sort -g |
    awk '{v[NR] = $1} END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f (%.3f to %.3f)", m, v[1], v[NR]}'
}
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(mpirun --version | head -1); $(date -u +%Y-%m-%d)"

# A batch run: Fashion-MNIST's 10,000 test images through a small ViT encoder (embed).
run_cmd=(run configs/experiments/fashion_mnist_embed.yaml --force)
a=() b=()
for _ in $(seq 1 "$reps"); do
  a+=("$("$T" "${run_cmd[@]}" --out "$tmp/r1" --threads 2 2>/dev/null | sed -nE 's/.*; ([0-9.]+) items\/s/\1/p')")
  b+=("$(mpirun -np 2 "$T" "${run_cmd[@]}" --out "$tmp/r2" --threads 1 2>/dev/null | sed -nE 's/.*; ([0-9.]+) items\/s/\1/p')")
done
cmp -s "$tmp/r1/embeddings.npy" "$tmp/r2/embeddings.npy" || echo "warning: the two runs' embeddings differ"
echo "batch run, items/s: 1 process x 2 threads $(stats "${a[@]}"); 2 ranks x 1 thread $(stats "${b[@]}");" \
  "ratio $(ratios "${a[*]}" "${b[*]}")"

# Training: the Fashion-MNIST ViT recipe, 200 steps of 128 on 12,000 images, no evaluation in the
# timed part (examples/s from the training loop's start, as metrics.jsonl logs it).
train_cmd=(train configs/train/fashion_mnist_vit.yaml --force --quiet --set train.max_minutes=0
  --set train.max_steps=200 --set train.eval_every=100000 --set train.log_every=200 --set train.test_data=
  --set train.test_labels= --set train.validation=0.02 --set data.limit=12000)
eps() { grep '"examples_per_s"' "$1/metrics.jsonl" | tail -1 | sed -E 's/.*"examples_per_s":([0-9.]*).*/\1/'; }
a=() b=()
for _ in $(seq 1 "$reps"); do
  "$T" "${train_cmd[@]}" --out "$tmp/t1" --set runtime.threads=2 >/dev/null
  a+=("$(eps "$tmp/t1")")
  mpirun -np 2 "$T" "${train_cmd[@]}" --out "$tmp/t2" --set runtime.threads=1 >/dev/null
  b+=("$(eps "$tmp/t2")")
done
echo "training, examples/s: 1 process x 2 threads $(stats "${a[@]}"); 2 ranks x 1 thread $(stats "${b[@]}");" \
  "ratio $(ratios "${a[*]}" "${b[*]}")"

# The veth pair: its TCP bandwidth, then the allreduce between the two namespaces.
if [ "$(id -u)" = 0 ] && command -v iperf3 >/dev/null && netns_pair_up "$tmp"; then
  in_ns b iperf3 -s -1 -D -B "10.77.$netns_sub.2" >/dev/null
  sleep 0.5
  link=$(in_ns a iperf3 -c "10.77.$netns_sub.2" -t 5 -f g | sed -nE 's/.* ([0-9.]+) Gbits\/sec .*receiver/\1/p')
  echo "veth pair, TCP (iperf3, 5 s, one stream): $link Gbit/s = $(awk -v g="$link" 'BEGIN {printf "%.2f", g / 8}') GB/s"
  echo "allreduce over the veth pair (2 ranks, one in each namespace):"
  mpi_pair "$bin/bench_allreduce" --max-mib 64
else
  echo "veth pair: skipped (needs root, iproute2 and iperf3)"
fi
echo "allreduce between 2 ranks on this machine (shared memory):"
mpirun -np 2 "$bin/bench_allreduce" --max-mib 64
