#!/usr/bin/env bash
# Data-parallel training under MPI (docs/DISTRIBUTED.md), through the built `tessera` and `mpirun`.
# Each rank computes its micro-batches of the global batch, the gradients are summed in rank order,
# and every rank takes the same step; rank 0 alone writes the run folder. With one micro-batch per
# rank the weights are the bits of one process with train.accumulate = N and the same threads:
#   0. a config error said once, by rank 0;
#   1. 2 ranks (accumulate 2) and 3 ranks (accumulate 3) against one process, with dropout and
#      label smoothing: the same best.safetensors, checkpoints and metrics (but the speed);
#   2. rank 1 of 2 killed mid-run, the run resumed on 2 ranks, and in one process: the same bits
#      as one process;
#   3. 3 ranks with accumulate 4 (micro-batches 1, 1 and 2: another order of the sum): within
#      float rounding of one process (a loss within 1e-6 relative).
#   test_mpi_train.sh BINARY_DIR
set -euo pipefail
bin=$(cd "$1" && pwd)
T=$bin/tessera
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera_mpi_train.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/mpi_common.sh"
metrics() { sed -E 's/"examples_per_s":[^,}]*,?//' "$1/metrics.jsonl"; }  # all but the speed
same_run() {  # same_run DIR_A DIR_B: the same weights, checkpoints and metrics
  cmp -s "$1/best.safetensors" "$2/best.safetensors" || fail "$2/best.safetensors is not $1's"
  [ "$(ls "$1/checkpoints")" = "$(ls "$2/checkpoints")" ] || fail "$2 has other checkpoints than $1"
  for d in "$1"/checkpoints/step-*; do
    cmp -s "$d/weights.safetensors" "$2/checkpoints/$(basename "$d")/weights.safetensors" ||
      fail "$2's $(basename "$d") weights are not $1's"
  done
  [ "$(metrics "$1")" = "$(metrics "$2")" ] || {
    diff <(metrics "$1") <(metrics "$2") >&2 || true
    fail "$2/metrics.jsonl is not $1's"
  }
}

# Three classes of short texts: which colour word a line holds, among others.
words=(sky leaf rose sea moss ruby ink lime wine)
colours=(blue green red)
{
  echo "id,text,label"
  for i in $(seq 0 149); do
    c=$((i * 7 % 3))
    echo "t$i,${words[$((i % 9))]} ${colours[$c]} ${words[$(((i * 5) % 9))]} $((i % 13)),${colours[$c]}"
  done
} >"$tmp/all.csv"
{ head -1 "$tmp/all.csv"; sed -n '2,121p' "$tmp/all.csv"; } >"$tmp/train.csv"
{ head -1 "$tmp/all.csv"; sed -n '122,151p' "$tmp/all.csv"; } >"$tmp/valid.csv"
cat >"$tmp/exp.yaml" <<EOF
plugins:
  - name: text
    path: $bin/plugins
    options: {tokenizer: bytes}
model:
  d_model: 32
  n_heads: 2
  n_layers: 2
  stem: {kind: tokens, vocab_size: 259}
  positions: {kind: learned, max_len: 64}
  head: {kind: classifier, n_classes: 3, pool: mean, labels: [blue, green, red]}
data: {path: train.csv}
train:
  max_steps: 12
  batch_size: 12
  lr: 3.0e-3
  warmup_steps: 2
  schedule: cosine
  label_smoothing: 0.1
  dropout: {residual: 0.1, attention: 0.1}
  validation_data: valid.csv
  eval_every: 3
  log_every: 1
runtime: {threads: 1}
EOF
train() {  # train OUT RANKS [--set ...]: a fresh run
  local out=$1 ranks=$2
  shift 2
  if [ "$ranks" = 1 ]; then
    "$T" train "$tmp/exp.yaml" --out "$tmp/$out" --quiet "$@" >/dev/null || fail "one process: $out"
  else
    mpi "$ranks" "$T" train "$tmp/exp.yaml" --out "$tmp/$out" --quiet "$@" >"$tmp/$out.out" ||
      fail "$ranks ranks: $out"
    [ "$(grep -c "^trained " "$tmp/$out.out")" = 1 ] || fail "$ranks ranks: the summary is not printed once"
  fi
}

# 0. A config error under mpirun: said once (by rank 0), and the job fails.
rc=0
mpi 2 "$T" train "$tmp/exp.yaml" --out "$tmp/bad" --set train.lr=-1 >/dev/null 2>"$tmp/bad.err" || rc=$?
[ "$rc" != 0 ] || fail "a config error under mpirun exited 0"
[ "$(grep -c "problem(s) in" "$tmp/bad.err")" = 1 ] || { cat "$tmp/bad.err" >&2; fail "the config error is not said once"; }

# 1. Bit for bit against one process with accumulate = N.
train one2 1 --set train.accumulate=2
train np2 2 --set train.accumulate=2
same_run "$tmp/one2" "$tmp/np2"
train np2a1 2  # accumulate 1: raised to the 2 ranks (another config: its hash is in the checkpoints)
cmp -s "$tmp/one2/best.safetensors" "$tmp/np2a1/best.safetensors" || fail "2 ranks, accumulate 1: other weights"
[ "$(metrics "$tmp/one2" | tail -n +2)" = "$(metrics "$tmp/np2a1" | tail -n +2)" ] ||
  fail "2 ranks, accumulate 1: other metrics"
train one3 1 --set train.accumulate=3
train np3 3 --set train.accumulate=3
same_run "$tmp/one3" "$tmp/np3"
echo "2 and 3 ranks: the same bits as one process with accumulate 2 and 3"

# 2. Rank 1 killed (SIGKILL) once the first checkpoint is written, the run resumed on 2 ranks and
# (killed again) in one process: the same bits as one process from the start (300 steps, a
# checkpoint every 3).
long=(--set train.accumulate=2 --set train.max_steps=300)
train ref 1 "${long[@]}"
for resume_ranks in 2 1; do
  rc=0
  mpi 2 "$T" train "$tmp/exp.yaml" --out "$tmp/split" --force --quiet "${long[@]}" >/dev/null 2>"$tmp/split.err" &
  job=$!
  rm -f "$tmp/split/checkpoints/latest"
  for _ in $(seq 1 2000); do
    [ -e "$tmp/split/checkpoints/latest" ] && break
    sleep 0.005
  done
  victim=""
  for p in $(pgrep -P "$(pgrep -P "$job" -x mpirun || echo "$job")" || true); do  # the rank whose environment says 1
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$p; fi
  done
  [ -n "$victim" ] || fail "no rank 1 to kill (did the run end first?)"
  kill -9 "$victim" 2>/dev/null || true
  wait "$job" || rc=$?
  killed_at=$(cat "$tmp/split/checkpoints/latest" 2>/dev/null || echo "?")
  [ "$rc" != 0 ] || fail "the job with a killed rank exited 0"
  grep -q "rank 1 .*signal 9" "$tmp/split.err" || { cat "$tmp/split.err" >&2; fail "mpirun did not name the killed rank"; }
  [ ! -e "$tmp/split/summary.json" ] || fail "the killed run finished anyway"
  if [ "$resume_ranks" = 1 ]; then
    "$T" train "$tmp/exp.yaml" --out "$tmp/split" --resume --quiet "${long[@]}" >/dev/null || fail "the resume in one process"
  else
    mpi "$resume_ranks" "$T" train "$tmp/exp.yaml" --out "$tmp/split" --resume --quiet "${long[@]}" >/dev/null ||
      fail "the resume on $resume_ranks ranks"
  fi
  cmp -s "$tmp/ref/best.safetensors" "$tmp/split/best.safetensors" || fail "killed on 2 ranks, resumed on $resume_ranks: other weights"
  [ "$(metrics "$tmp/ref")" = "$(metrics "$tmp/split")" ] || fail "killed on 2 ranks, resumed on $resume_ranks: other metrics"
  echo "rank 1 killed on 2 ranks (latest checkpoint $killed_at), resumed on $resume_ranks: the same bits as one process"
done

# 3. Another order of the sum: within rounding.
train one4 1 --set train.accumulate=4
train np3a4 3 --set train.accumulate=4
last_loss() { grep '"grad_norm"' "$1/metrics.jsonl" | tail -1 | sed -E 's/.*"loss":([^,}]*).*/\1/'; }
a=$(last_loss "$tmp/one4")
b=$(last_loss "$tmp/np3a4")
awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * (a < 0 ? -a : a)) }' ||
  fail "3 ranks with accumulate 4: loss $b, one process $a: further apart than 1e-6"
echo "3 ranks, accumulate 4: last loss $b against $a in one process"
