#!/usr/bin/env bash
# Installs Tessera into a temporary prefix, builds the out-of-tree example plugin (DNA k-mers)
# against the installed CMake package, and runs an experiment with it through the installed tool.
# Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd) src=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
fail() { echo "test_install: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" > /dev/null
[ -x "$prefix/bin/tessera" ] || fail "no installed tool"
[ -f "$prefix/include/tessera/plugin.h" ] || fail "no installed plugin.h"

cmake -S "$src/plugins/example_kmers" -B "$prefix/build-kmers" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release > "$prefix/configure.log" || { cat "$prefix/configure.log"; fail "configure failed"; }
cmake --build "$prefix/build-kmers" > "$prefix/build.log" || { cat "$prefix/build.log"; fail "build failed"; }
[ -f "$prefix/build-kmers/libtessera_kmers.so" ] || fail "no plugin library"
nm -D --defined-only "$prefix/build-kmers/libtessera_kmers.so" | grep -q " T tessera_plugin_entry$" || fail "entry not exported"
[ "$(nm -D --defined-only "$prefix/build-kmers/libtessera_kmers.so" | grep -c ' T ')" = 1 ] || fail "exports more than one symbol"

export TESSERA_PLUGIN_PATH="$prefix/build-kmers"
listing=$("$prefix/bin/tessera" plugins)
echo "$listing" | grep -q "^kmers  *dna  *1.0.0  *$prefix/build-kmers/libtessera_kmers.so" || { echo "$listing"; fail "kmers not listed"; }
# The installed plugins are found beside the installed library, without any path.
echo "$listing" | grep -q "^protein  *protein  *[0-9.]*  *$prefix/lib/tessera/plugins/libtessera_protein.so" ||
  { echo "$listing"; fail "installed plugins not found"; }
# ... and the build tree they were built in is not searched (its plugins would shadow them).
if echo "$listing" | grep -q "$build/plugins"; then echo "$listing"; fail "the installed tessera searches the build tree"; fi

cd "$src/plugins/example_kmers"
set +e
"$prefix/bin/tessera" run example.yaml --out "$prefix/run" --quiet > "$prefix/run.log" 2>&1
rc=$?
set -e
[ "$rc" = 3 ] || { cat "$prefix/run.log"; fail "expected exit code 3 (one broken record), got $rc"; }
grep -q '"id":"example.fasta#3"' "$prefix/run/errors.jsonl" || fail "the broken record is not in errors.jsonl"
grep -q "'7' is not a nucleotide letter" "$prefix/run/errors.jsonl" || fail "errors.jsonl lacks the reason"
[ "$(wc -l < "$prefix/run/index.jsonl")" = 2 ] || fail "expected 2 embeddings in index.jsonl"
# `tessera bench --plugins` reads the inputs installed with the tool (share/tessera/bench-data),
# not the source tree's: every case, one pass each, run from outside both trees.
data="$prefix/share/tessera/bench-data"
for f in image/chelsea.jpg audio/librivox_0880.wav protein/uniprot_sample.fasta text/corpus.txt text/README.md; do
  [ -f "$data/$f" ] || fail "no $f in the installed bench data"
done
help=$("$prefix/bin/tessera" bench --help)
[[ "$help" == *"$data"* ]] || { echo "$help"; fail "bench --data does not default to $data"; }
cd "$prefix"
set +e
"$prefix/bin/tessera" bench --plugins --reps 1 --warmup 1 --json "$prefix/bench.json" > "$prefix/bench.log" 2>&1
rc=$?
set -e
[ "$rc" = 0 ] || { cat "$prefix/bench.log"; fail "the installed bench --plugins failed with exit code $rc"; }
grep -qF "\"$data/" "$prefix/bench.json" || { cat "$prefix/bench.json"; fail "the bench read no installed input"; }
if grep -qF "$src/tests/data" "$prefix/bench.json"; then fail "the installed bench read the source tree's inputs"; fi
echo "test_install: ok"
