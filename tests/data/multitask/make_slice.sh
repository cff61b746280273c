#!/usr/bin/env bash
# Makes this folder's slice from the full multi-task data set (tools/data/multitask.sh) and the
# committed spoken-digits and WordNet slices beside it:
#   tests/data/multitask/make_slice.sh [DATA_DIR]     # DATA_DIR defaults to data/multitask
set -euo pipefail
cd "$(dirname "$0")"
DATA=${1:-../../../data/multitask}
rm -rf fashion
mkdir -p fashion
{
  echo "id,image,audio,text,label"
  # Fashion-MNIST: the first 2 training images of each class in the manifest's (seeded) order.
  tail -n +2 "$DATA/train.fashion.csv" | awk -F, '++n[$5] <= 2' | LC_ALL=C sort -t, -k5,5 -s |
    while IFS=, read -r id image audio text label; do
      cp "$DATA/$image" "fashion/$(basename "$image")"
      echo "$id,fashion/$(basename "$image"),,,$label"
    done
  # Spoken digits: the first two voices of the spoken-digits slice (20 clips).
  sed -n '2,21p' ../spoken_digits/train.csv | awk -F, '{ printf "digits/%s,,../spoken_digits/%s,,%s\n", $1, $2, $3 }'
  # WordNet: the first 6 glosses of each of the WordNet slice's 5 classes (30).
  tail -n +2 ../wordnet/train.csv | awk -F, '++n[$NF] <= 6' | awk '{ c1 = index($0, ","); id = substr($0, 1, c1 - 1); rest = substr($0, c1 + 1)
    c2 = match(rest, /,[^,]*$/); printf "wordnet/%s,,,%s,%s\n", id, substr(rest, 1, c2 - 1), substr(rest, c2 + 1) }'
} >train.csv
