#!/usr/bin/env bash
# Sharded batch runs under MPI (docs/DISTRIBUTED.md), through the built `tessera` and `mpirun`:
#   1. `mpirun -np 2` and `-np 3` (oversubscribed) write the same bytes as one process: every
#      output, errors.jsonl (two bad items) and manifest.json;
#   2. a rank killed mid-run (SIGKILL, by the hostile test plugin on a chosen item) ends the job
#      with mpirun naming that rank; the manifest keeps the rounds recorded before it; `--resume`
#      with 3 ranks, and after a second kill with 1 process, ends with the same bytes as a run
#      never killed.
#   test_mpi_run.sh BINARY_DIR TEST_PLUGIN_DIR
set -euo pipefail
bin=$(cd "$1" && pwd)
plugins=$(cd "$2" && pwd)
T=$bin/tessera
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera_mpi_run.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/mpi_common.sh"
same() {  # same DIR_A DIR_B: the same files with the same bytes
  diff -r "$1" "$2" >/dev/null || {
    diff -rq "$1" "$2" >&2 || true
    fail "$2 is not byte-identical to $1"
  }
}
done_batches() { grep -o '\[[0-9]*,"' "$1/manifest.json" | tr -d '[,"' | sort -n | tr '\n' ' '; }

# 1. The probe plugin (bytes as ids, in worker processes): 37 lines in batches of 2, lines 12 and
# 29 are bad items. One thread a process, a rank's as one process's: oneDNN's AVX2 kernels give
# other bits for other thread counts.
for i in $(seq 0 36); do
  if [ "$i" = 12 ] || [ "$i" = 29 ]; then echo "line $i FAIL"; else printf 'line %d %*s\n' "$i" $((20 + i % 7)) x; fi
done >"$tmp/lines.txt"
cat >"$tmp/probe.yaml" <<EOF
plugins:
  - name: probe
    path: $plugins
model:
  d_model: 32
  n_heads: 2
  n_layers: 2
  stem: {kind: tokens, vocab_size: 300}
  positions: {kind: learned, max_len: 128}
  head: {kind: pool, pool: mean}
data: {path: lines.txt}
runtime: {batch_size: 2, threads: 1}
task: {kind: embed, attention: {layers: [1]}}
EOF
rc=0
"$T" run "$tmp/probe.yaml" --out "$tmp/one" --quiet >/dev/null || rc=$?
[ "$rc" = 3 ] || fail "one process: exit $rc, not 3 (some items failed)"
[ "$(wc -l <"$tmp/one/errors.jsonl")" = 2 ] || fail "one process: errors.jsonl has not 2 lines"
for n in 2 3; do
  rc=0
  mpi "$n" "$T" run "$tmp/probe.yaml" --out "$tmp/np$n" >"$tmp/np$n.out" 2>"$tmp/np$n.err" || rc=$?
  [ "$rc" = 3 ] || { cat "$tmp/np$n.err" >&2; fail "$n ranks: exit $rc, not 3"; }
  same "$tmp/one" "$tmp/np$n"
  grep -q "run: 19 batches over $n ranks" "$tmp/np$n.err" || fail "$n ranks: no progress line from rank 0"
  [ "$(grep -c "items, .* sequences written" "$tmp/np$n.out")" = 1 ] || fail "$n ranks: the summary is not printed once"
done
echo "sharded runs: 2 and 3 ranks byte-identical to one process"

# 2. The hostile plugin in the ranks' own processes (isolate: false; workers: 0, so no batch is
# encoded ahead of its round): 30 lines, one a batch; rank 1 kills itself on line 7, in the fourth
# round of 2 ranks (batches 6 and 7), so rounds 0-2 are recorded: batches 0-5.
for i in $(seq 0 29); do
  if [ "$i" = 7 ]; then echo "line 7 KILL"; else printf 'line %d %*s\n' "$i" $((10 + i % 5)) y; fi
done >"$tmp/hlines.txt"
sed -e 's/name: probe/name: hostile/' -e 's/lines.txt/hlines.txt/' -e 's/batch_size: 2,/batch_size: 1, isolate: false, workers: 0,/' \
  "$tmp/probe.yaml" >"$tmp/hostile.yaml"
"$T" run "$tmp/hostile.yaml" --out "$tmp/ref" --quiet >/dev/null || fail "one process without HOSTILE_KILL_RANK"
for resume_ranks in 3 1; do
  rc=0
  HOSTILE_KILL_RANK=1 mpi 2 -x HOSTILE_KILL_RANK "$T" run "$tmp/hostile.yaml" --out "$tmp/killed" --force \
    >/dev/null 2>"$tmp/killed.err" || rc=$?
  [ "$rc" != 0 ] || fail "the job with a killed rank exited 0"
  grep -q "rank 1 .*signal 9" "$tmp/killed.err" || { cat "$tmp/killed.err" >&2; fail "mpirun did not name the killed rank"; }
  grep -q '"state": *"running"' "$tmp/killed/manifest.json" || fail "the killed run's manifest is not left 'running'"
  [ "$(done_batches "$tmp/killed")" = "0 1 2 3 4 5 " ] ||
    fail "the killed run recorded batches $(done_batches "$tmp/killed"), not 0-5"
  if [ "$resume_ranks" = 1 ]; then
    "$T" run "$tmp/hostile.yaml" --out "$tmp/killed" --resume --quiet >/dev/null || fail "resume in one process"
  else
    mpi "$resume_ranks" "$T" run "$tmp/hostile.yaml" --out "$tmp/killed" --resume >/dev/null 2>"$tmp/resume.err" ||
      { cat "$tmp/resume.err" >&2; fail "resume on $resume_ranks ranks"; }
    grep -q "6 of 30 batches already done" "$tmp/resume.err" || fail "the resume did not keep the 6 batches"
  fi
  same "$tmp/ref" "$tmp/killed"
  echo "a rank killed on 2 ranks, resumed on $resume_ranks: byte-identical to a run never killed"
done
