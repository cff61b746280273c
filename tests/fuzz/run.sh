#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan) and runs each one for a while, one at a time.
#
#   tests/fuzz/run.sh                     # every harness, 20 s each (a smoke run)
#   tests/fuzz/run.sh 600 npy image       # these harnesses, 600 s each
#   FUZZ_RUNS=1000000 tests/fuzz/run.sh 1800 npy   # stop at 1,000,000 executions (or 1800 s)
#   FUZZ_NO_BUILD=1 tests/fuzz/run.sh ... # skip configure + build
#
# Seeds are assembled at run time from tests/data (small files only, nothing copied into git) and
# tests/fuzz/corpus/<harness>/, plus every saved finding in tests/data/fuzz-regressions/<harness>/,
# into build/fuzz/seeds/<harness>; what the fuzzer finds new goes to build/fuzz/corpus/<harness>
# (kept between runs), crashes to build/fuzz/findings/<harness>/. Prints each harness's executions,
# exec/s, coverage (cov: edges, ft: features) and findings; exits 1 if any harness found anything.
# Environment: FUZZ_BUILD (build folder, default build/fuzz), FUZZ_RUNS (-runs), FUZZ_ARGS (more
# libFuzzer flags), FUZZ_NICE (default 10).
# The whole script is one block, read before it runs: editing the file during a run is harmless.
{
set -u -o pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${FUZZ_BUILD:-build/fuzz}
SECONDS_EACH=${1:-20}
shift || true
ALL=(safetensors npy idx yaml hf_folder tokenizer fasta manifest run_manifest image audio)
HARNESSES=("$@")
[ ${#HARNESSES[@]} -eq 0 ] && HARNESSES=("${ALL[@]}")

if [ -z "${FUZZ_NO_BUILD:-}" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_FUZZ=ON -DTESSERA_MPI=OFF \
    -DTESSERA_BUILD_TESTS=OFF "${launcher[@]}" >/dev/null || exit 2
  nice -n "${FUZZ_NICE:-10}" cmake --build "$BUILD" -j"${FUZZ_JOBS:-2}" --target tessera_fuzzers || exit 2
fi

# Copies the files given (at most 64 KiB each) into a seed folder.
seed() {
  local dir=$1; shift
  local f
  for f in "$@"; do
    [ -f "$f" ] || continue
    [ "$(stat -c %s "$f")" -le 65536 ] || continue
    cp "$f" "$dir/$(echo "${f#$ROOT/}" | tr '/' '_')"
  done
}
# Writes one seed made of several files joined by NUL bytes (see each harness's comment).
joined() {
  local out=$1; shift
  local first=1 f
  : >"$out"
  for f in "$@"; do
    [ $first -eq 1 ] || printf '\0' >>"$out"
    first=0
    if [ -f "$f" ]; then cat "$f" >>"$out"; else printf '%s' "$f" >>"$out"; fi
  done
}

make_seeds() {
  local h=$1 dir=$BUILD/seeds/$1 D=$ROOT/tests/data
  rm -rf "$dir" && mkdir -p "$dir"
  case $h in
    safetensors) seed "$dir" "$D"/safetensors/*.safetensors "$D"/config/weights/*.safetensors ;;
    npy) seed "$dir" "$D"/npy/*.npy "$D"/image/chelsea_tiny_png.rgb.npy "$D"/audio/cards_001.whisper_trim50.npy ;;
    idx)
      seed "$dir" "$D"/image/fashion-mnist-slice/*labels*.gz
      # The image files are larger than a seed should be: their first 2 KiB, unpacked and packed.
      local g
      for g in "$D"/image/fashion-mnist-slice/*images*.gz; do
        gzip -dc "$g" | head -c 2048 >"$dir/$(basename "$g" .gz).head"
        gzip -c "$dir/$(basename "$g" .gz).head" >"$dir/$(basename "$g" .gz).head.gz"
      done ;;
    yaml)
      seed "$dir" "$D"/config/*.yaml "$D"/config/include/*.yaml "$ROOT"/configs/examples/*.yaml
      joined "$dir/include" "$D/config/include/child.yaml" "$D/config/include/base.yaml" "model.n_layers=2"
      printf 'model:\n  include: inc.yaml\n  n_heads: 4\n' >"$dir/main"
      joined "$dir/include2" "$dir/main" "$D/config/include/base.yaml" $'model.positions.max_len=16\nmodel.stem.vocab_size=12'
      joined "$dir/set" "$D/config/minimal.yaml" "" $'model.d_model=16\nplugins[0].options.max_length=64' ;;
    hf_folder)
      local families=(bert bert_cls bert_mlm bert_mlm_untied esm esm_untied gpt2 gpt2_untied vit vit_pooler ast) i
      for i in "${!families[@]}"; do
        local m=$D/hf/${families[$i]}/model
        { printf "\\x$(printf %02x "$i")"; cat "$m/config.json"; } >"$dir/${families[$i]}"
        { printf "\\x$(printf %02x "$i")"; joined /dev/stdout "$m/config.json" "$m/tokenizer_config.json" \
            "$m/special_tokens_map.json" "$m/preprocessor_config.json" "$m/model.safetensors.index.json" \
            "$m/modules.json" "$m/1_Pooling/config.json"; } >"$dir/${families[$i]}.all"
      done ;;
    tokenizer)
      local H=$D/hf
      { printf '\x00'; cat "$H/bert/model/vocab.txt"; } >"$dir/wordpiece_bert"
      { printf '\x03'; cat "$H/bert_cls/model/vocab.txt"; } >"$dir/wordpiece_small"
      { printf '\x00'; joined /dev/stdout "$H/esm/model/vocab.txt" "" "MKTAYIAKQR <mask> hello"; } >"$dir/wordpiece_esm"
      { printf '\x01'; joined /dev/stdout "$H/gpt2/model/vocab.json" "$H/gpt2/model/merges.txt" "Hello world, it's me"; } >"$dir/bpe"
      { printf '\x05'; joined /dev/stdout "$H/gpt2_untied/model/vocab.json" "$H/gpt2_untied/model/merges.txt"; } >"$dir/bpe_special"
      { printf '\x02'; joined /dev/stdout "$D/text/chars.txt" "" "hello, world"; } >"$dir/chars" ;;
    fasta) seed "$dir" "$D"/protein/messy.fasta; head -c 8192 "$D/protein/uniprot_sample.fasta" >"$dir/uniprot_head.fasta" ;;
    manifest)
      { printf '\x00'; cat "$D/wordnet/test.csv"; } >"$dir/wordnet.csv"
      { printf '\x02'; head -c 4096 "$D/wordnet/train.csv"; } >"$dir/wordnet_missing.csv" ;;
    run_manifest) TESSERA_FUZZ_SEED_DIR=$dir "$BUILD/fuzz/fuzz_run_manifest" -runs=0 >/dev/null 2>&1 ;;
    image) seed "$dir" "$D"/image/*.{png,jpg,tif,bmp,ppm,pgm,webp} ;;
    audio)
      seed "$dir" "$D"/audio/*.{wav,flac,oga}
      local w
      for w in "$D"/audio/*.{wav,flac,oga}; do head -c 8192 "$w" >"$dir/$(basename "$w").head"; done ;;
  esac
  [ -d tests/fuzz/corpus/$h ] && cp tests/fuzz/corpus/$h/* "$dir"/ 2>/dev/null
  [ -d tests/data/fuzz-regressions/$h ] && cp tests/data/fuzz-regressions/$h/* "$dir"/ 2>/dev/null
  true
}

export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ROOT/tests/fuzz/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
summary="harness        execs      exec/s  cov    ft     corpus  findings"
for h in "${HARNESSES[@]}"; do
  bin=$BUILD/fuzz/fuzz_$h
  [ -x "$bin" ] || { echo "no harness $bin" >&2; status=2; continue; }
  make_seeds "$h"
  mkdir -p "$BUILD/corpus/$h" "$BUILD/findings/$h"
  flags=()
  case $h in
    yaml) flags=(-dict=tests/fuzz/yaml.dict) ;;
    safetensors|hf_folder|manifest|run_manifest|tokenizer) flags=(-dict=tests/fuzz/json.dict) ;;
  esac
  # Longer inputs only slow these down (each byte goes through a file and a tokenizer).
  case $h in
    fasta|manifest) flags+=(-max_len=2048) ;;
    tokenizer) flags+=(-max_len=16384) ;;
    audio) flags+=(-max_len=8192) ;;
  esac
  runs=()
  [ -n "${FUZZ_RUNS:-}" ] && runs=(-runs="$FUZZ_RUNS")
  log=$BUILD/fuzz/$h.log
  before=$(ls "$BUILD/findings/$h" | wc -l)
  echo "== $h: ${SECONDS_EACH}s ${FUZZ_RUNS:+or $FUZZ_RUNS runs}, log $log"
  # shellcheck disable=SC2086
  nice -n "${FUZZ_NICE:-10}" "$bin" -max_total_time="$SECONDS_EACH" "${runs[@]}" -timeout=20 -rss_limit_mb=2560 \
    -print_final_stats=1 -artifact_prefix="$BUILD/findings/$h/" "${flags[@]}" ${FUZZ_ARGS:-} \
    "$BUILD/corpus/$h" "$BUILD/seeds/$h" >"$log" 2>&1
  rc=$?
  after=$(ls "$BUILD/findings/$h" | wc -l)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{print $2}')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | awk '{print $2}')
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | awk '{print $2}')
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | awk '{print $2}')
  corp=$(echo "$last" | grep -o 'corp: [0-9]*' | awk '{print $2}')
  found=$((after - before))
  if [ $rc -ne 0 ] || [ $found -ne 0 ]; then
    status=1
    echo "!! $h: exit $rc, $found new finding(s) in $BUILD/findings/$h:"
    grep -E 'ERROR: |SUMMARY: |runtime error|==[0-9]+==' "$log" | head -5
  fi
  summary+=$(printf '\n%-14s %-10s %-7s %-6s %-6s %-7s %s' "$h" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
    "$([ $rc -eq 0 ] && [ $found -eq 0 ] && echo none || echo "exit $rc, $found file(s)")")
done
echo "$summary"
exit $status
}
