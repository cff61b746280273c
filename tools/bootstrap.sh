#!/usr/bin/env bash
# Set up a Debian 12 machine for Tessera, build it, and run the main job or every test.
#   tools/bootstrap.sh demo   install missing packages, build (Release), run the showcase
#   tools/bootstrap.sh test   install missing packages, build (Release + ASan/UBSan), run all tests
# Packages are installed only when missing (idempotent); as root directly, otherwise with sudo.
# Environment: JOBS (parallel build jobs, default: all cores), TESSERA_SKIP_ASAN=1 (tests: skip
# the sanitizer build), BUILD_DIR (default: build).
set -euo pipefail

cd "$(dirname "$0")/.."
mode=${1:-}
case "$mode" in
  demo|test) ;;
  *) echo "usage: tools/bootstrap.sh demo|test" >&2; exit 2 ;;
esac

# Everything comes from Debian 12's own archive. libpng draws attention heatmaps; OpenCV and
# libjpeg (image), libsndfile, libsoxr and FFTW (audio) are for the modality plugins; python3 is
# not needed by the product, its build or its tests.
packages=(build-essential cmake pkgconf libdnnl-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
          libgtest-dev libgmock-dev libpng-dev libopencv-dev libjpeg-dev libsndfile1-dev
          libsoxr-dev libfftw3-dev)
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

if [ "$mode" = demo ]; then
  step() { printf '\n=== %s\n$ %s\n\n' "$1" "${*:2}"; "${@:2}"; }
  step "The runtime" "$tessera" version
  step "red / ball / rolls: one causal head by hand" \
    "$tessera" explain configs/examples/red_ball_rolls.yaml --fractions
  step "A second head, W_O and the residual" "$tessera" explain configs/examples/two_heads.yaml --head 1 --fractions
  step "Scaling by sqrt(d_k): (0.731, 0.269) instead of (0.881, 0.119)" \
    "$tessera" explain configs/examples/scaling.yaml --row 0
  step "crane / lake" "$tessera" explain configs/examples/crane_lake.yaml --row 0
  step "The n = 5 exercise: resolved config and plan" "$tessera" check configs/examples/exercise_n5.yaml
  step "One post-LN Transformer layer, outputs as .npy" \
    "$tessera" forward configs/examples/transformer_layer.yaml --out runs/transformer_layer --dump blocks.0.attn.weights
  step "A ViT-B/16-shaped model: plan" "$tessera" check configs/bench/vit_b16.yaml
  step "A ViT-B/16-shaped model: a real-size forward pass, timed" \
    "$tessera" bench configs/bench/vit_b16.yaml --reps 3 --warmup 1
  echo
  echo "demo: done. The forward pass wrote .npy files to runs/transformer_layer/;" \
       "configs/examples/ holds the lectures' examples, docs/ the configuration and performance notes."
  exit 0
fi

ctest --test-dir "$build/release" --output-on-failure -j "$jobs"
if [ "${TESSERA_SKIP_ASAN:-0}" != 1 ]; then
  cmake -S . -B "$build/asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_SANITIZE=ON
  cmake --build "$build/asan" -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$build/asan" --output-on-failure -j "$jobs"
fi
echo "test: all tests passed" >&2
