#!/usr/bin/env bash
# Training throughput and peak memory, Tessera against PyTorch, in one run, alternating (A B C A B C
# ...), for docs/PERFORMANCE.md "Training: side by side with PyTorch". Developer tool.
#
#   tools/reference/bench_train_side_by_side.sh OUT_DIR [ROUNDS]
#
# Environment: TESSERA (default build/release/tessera), TORCH_NEW (a python whose torch is PyPI's
# current release: tools/reference/requirements-torch-current.txt), TORCH_DEBIAN (a python with
# Debian's torch 1.13, default /usr/bin/python3; "none" skips it), THREADS (default 2), MODELS (default
# "vit gpt bert"), PRECISIONS (default "f32 bf16"). Needs Fashion-MNIST (dataset-fashion-mnist)
# and data/kjv/kjv.txt (tools/data/kjv.sh). Each figure lands in OUT_DIR as one JSON file per run;
# the summary (medians over the rounds) is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: bench_train_side_by_side.sh OUT_DIR [ROUNDS]}
rounds=${2:-2}
tessera=${TESSERA:-build/release/tessera}
threads=${THREADS:-2}
fm=/usr/share/datasets/fashion-mnist
mkdir -p "$out"

tessera_run() {  # model precision round
  local cfg reps=20 warm=3 shape=()
  case $1 in
    # The tables' ViT: the recipe's shape before 2026-12-05 (4x4 patches, d_ff 256), which
    # bench_train_torch.py builds; the recipe itself now has 7x7 patches and d_ff 512.
    vit) cfg=configs/train/fashion_mnist_vit.yaml
         shape=(--set plugins.0.options.patch_size=4 --set model.stem.n_features=16
                --set model.positions.max_len=50 --set model.d_ff=256) ;;
    gpt) cfg=configs/train/kjv_char_gpt.yaml ;;
    bert) cfg=configs/bench/bert_base_train.yaml reps=5 warm=1 ;;
  esac
  "$tessera" bench --train "$cfg" --threads "$threads" --reps $reps --warmup $warm \
    --set train.precision="$2" "${shape[@]}" --json "$out/tessera-$1-$2-$3.json" >/dev/null
}
torch_run() {  # python label model precision round
  local py=$1 label=$2 m=$3 p=$4 r=$5 args=()
  case $m in
    vit) args=(--images $fm/train-images-idx3-ubyte.gz --labels $fm/train-labels-idx1-ubyte.gz) ;;
    gpt) args=(--text data/kjv/kjv.txt $(gpt_shape)) ;;
    bert) args=(--text data/kjv/kjv.txt --steps 5 --warmup 1) ;;
  esac
  [ "$p" = bf16 ] && args+=(--bf16)
  OMP_WAIT_POLICY=PASSIVE "$py" tools/reference/bench_train_torch.py "$m" --threads "$threads" "${args[@]}" \
    >"$out/$label-$m-$p-$r.json"
}
# The char GPT's shape, read off its config, so both sides train the same model.
gpt_shape() {
  local f=configs/train/kjv_char_gpt.yaml
  get() { sed -n "s/^  $1: *\([0-9]*\).*/\1/p" "$f" | head -n 1; }
  echo --d-model "$(get d_model)" --layers "$(get n_layers)" --heads "$(get n_heads)" --d-ff "$(get d_ff)" \
       --seq "$(get seq_len)" --batch "$(get batch_size)"
}

for r in $(seq 1 "$rounds"); do
  for m in ${MODELS:-vit gpt bert}; do
    for p in ${PRECISIONS:-f32 bf16}; do
      echo "round $r: $m $p" >&2
      tessera_run "$m" "$p" "$r"
      [ -n "${TORCH_NEW:-}" ] && torch_run "$TORCH_NEW" torch-current "$m" "$p" "$r"
      if [ "$p" = f32 ] && [ "${TORCH_DEBIAN:-}" != none ]; then
        torch_run "${TORCH_DEBIAN:-/usr/bin/python3}" torch-debian "$m" "$p" "$r"
      fi
    done
  done
done
python3 - "$out" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    who, model, prec, _ = os.path.basename(f)[:-5].rsplit("-", 3)
    j = json.load(open(f))
    runs.setdefault((model, prec, who), []).append(j)
print("| model | precision | who | examples/s (median of rounds; min-max) | step spread | peak RSS MiB |")
print("|---|---|---|---|---|---|")
for (model, prec, who), js in sorted(runs.items()):
    e = [j["examples_per_s"] for j in js]
    label = who if who == "tessera" else f"{who} ({js[0].get('torch', '?')})"
    print(f"| {model} | {prec} | {label} | {statistics.median(e):.1f} ({min(e):.1f}-{max(e):.1f}) | "
          f"{statistics.median(j['spread'] for j in js):.2f}x | {max(j['max_rss_bytes'] for j in js) / 2**20:.0f} |")
EOF
