#!/usr/bin/env bash
# Makes the multi-task data set of configs/train/multitask.yaml (issue 15): one manifest mixing
# three tasks, each row filling one plugin's column and that task's label, as CSV manifests
# `id,image,audio,text,label` (data.allow_missing: the other columns are empty):
#   fashion  Fashion-MNIST images (Debian's dataset-fashion-mnist), written as 28 x 28 PGM files
#            (the IDX pixels behind a P5 header: no conversion of a value);
#   digits   the spoken digits "0" ... "9" of tools/data/spoken_digits.sh (its speaker-disjoint
#            train / valid / test voices, kept as they are);
#   wordnet  WordNet glosses labelled with their lexicographer file, from
#            tools/data/wordnet_glosses.sh (its train and test synsets; the validation glosses are
#            the last MT_WORDNET_VALID of its training sample).
# Written to OUT (default data/multitask):
#   train.csv, valid.csv, test.csv            the three tasks mixed
#   {train,valid,test}.<task>.csv             one task's rows alone (the single-task baselines)
#   fashion/{train,test}/<index>.pgm          the images the manifests name
# It downloads nothing. Sizes: MT_FASHION_TRAIN (3000) and MT_FASHION_VALID (500) images drawn
# from the 60,000 training images, MT_FASHION_TEST (1000) from the 10,000 test images;
# MT_WORDNET_VALID (500). The draw is MINSTD keys of (index, MT_SEED) sorted, exact in any awk;
# MT_SEED (default 11) draws another sample. Rerunning with the same settings rewrites the same bytes.
#
#   tools/data/multitask.sh [OUT_DIR]
set -euo pipefail

OUT=${1:-}
if [ -n "$OUT" ] && [ "${OUT#/}" = "$OUT" ]; then OUT=$PWD/$OUT; fi  # as given, from the caller's folder
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-data/multitask}
FMNIST=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
N_FTRAIN=${MT_FASHION_TRAIN:-3000}
N_FVALID=${MT_FASHION_VALID:-500}
N_FTEST=${MT_FASHION_TEST:-1000}
N_WVALID=${MT_WORDNET_VALID:-500}
SEED=${MT_SEED:-11}

die() {
  echo "multitask.sh: error: $1" >&2
  shift
  for hint in "$@"; do echo "  $hint" >&2; done
  exit 1
}
for n in "$N_FTRAIN" "$N_FVALID" "$N_FTEST" "$N_WVALID" "$SEED"; do
  [[ $n =~ ^[0-9]+$ ]] || die "MT_FASHION_TRAIN, MT_FASHION_VALID, MT_FASHION_TEST, MT_WORDNET_VALID and MT_SEED must be whole numbers (found \"$n\")"
done
[ $((N_FTRAIN + N_FVALID)) -le 60000 ] || die "MT_FASHION_TRAIN + MT_FASHION_VALID is more than the 60,000 training images"
[ "$N_FTEST" -le 10000 ] || die "MT_FASHION_TEST is more than the 10,000 test images"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  [ -r "$FMNIST/$f" ] || die "$FMNIST/$f is missing or unreadable" \
    "install Fashion-MNIST: sudo apt-get install dataset-fashion-mnist" \
    "or set FASHION_MNIST_DIR to a folder holding the four IDX files"
done

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# The other two tasks' data sets, made by their own scripts where missing (each skips work already done).
SD=${SPOKEN_DIGITS_DIR:-$ROOT/data/spoken_digits}
WN=$ROOT/data/wordnet
[ -f "$SD/train.csv" ] && [ -f "$SD/valid.csv" ] && [ -f "$SD/test.csv" ] || tools/data/spoken_digits.sh "$SD"
tools/data/wordnet_glosses.sh "$WN"
N_WTRAIN_ALL=$(($(wc -l <"$WN/train.csv") - 1))
[ "$N_WVALID" -lt "$N_WTRAIN_ALL" ] || die "MT_WORDNET_VALID ($N_WVALID) leaves no WordNet training glosses ($N_WTRAIN_ALL in all)"

tmp=$(mktemp -d "$OUT/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Fashion-MNIST: the chosen indices by their MINSTD key, then each image's 784 pixels (after the
# IDX header of 16 bytes) behind a PGM header, and its label's class name.
names='T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot'
pick() {  # N_ITEMS SALT -> the indices 0 .. N_ITEMS-1 in key order
  LC_ALL=C awk -v n="$1" -v seed="$SEED" -v salt="$2" 'BEGIN {
    for (i = 0; i < n; ++i) {
      h = (i + 1 + salt * 1000003 + seed * 7919) % 2147483647
      if (h == 0) h = 1
      for (r = 0; r < 4; ++r) h = (h * 48271) % 2147483647
      printf "%010d %d\n", h, i
    }
  }' | LC_ALL=C sort -k1,1 -k2,2n | awk '{ print $2 }'
}
images() {  # SPLIT(train|t10k) DIR INDEX_FILE -> DIR/<index>.pgm; prints "index<TAB>label" lines
  local split=$1 dir=$2 list=$3
  mkdir -p "$tmp/raw_$split" "$OUT/fashion/$dir"
  gzip -dc "$FMNIST/$split-images-idx3-ubyte.gz" | tail -c +17 | (cd "$tmp/raw_$split" && split -b 784 -d -a 5 - p)
  gzip -dc "$FMNIST/$split-labels-idx1-ubyte.gz" | tail -c +9 | od -An -v -tu1 -w1 | awk '{ print $1 }' >"$tmp/labels_$split"
  while read -r i; do
    chunk=$(printf '%s/raw_%s/p%05d' "$tmp" "$split" "$i")
    { printf 'P5\n28 28\n255\n'; cat "$chunk"; } >"$OUT/fashion/$dir/$i.pgm"
  done <"$list"
  awk -v names="$names" 'BEGIN { split(names, k, ",") } NR == FNR { want[$1] = 1; next }
                         (FNR - 1) in want { printf "%d\t%s\n", FNR - 1, k[$1 + 1] }' "$list" "$tmp/labels_$split"
}
pick 60000 1 >"$tmp/order_train"  # (whole, then cut: head on the pipe would stop sort mid-write)
pick 10000 2 >"$tmp/order_test"
head -n $((N_FTRAIN + N_FVALID)) "$tmp/order_train" >"$tmp/ftrain_all"
head -n "$N_FTEST" "$tmp/order_test" >"$tmp/ftest"
rm -rf "$OUT/fashion"
images train train "$tmp/ftrain_all" >"$tmp/ftrain_labels"
images t10k test "$tmp/ftest" >"$tmp/ftest_labels"
head -n "$N_FTRAIN" "$tmp/ftrain_all" >"$tmp/ftrain"
tail -n +$((N_FTRAIN + 1)) "$tmp/ftrain_all" >"$tmp/fvalid"
fashion_rows() {  # INDEX_FILE LABELS DIR -> manifest rows, in the INDEX_FILE's order
  awk -F '\t' -v dir="$3" 'NR == FNR { label[$1] = $2; next }
    { printf "fashion/%s/%d,fashion/%s/%d.pgm,,,%s\n", dir, $1, dir, $1, label[$1] }' "$2" "$1"
}
fashion_rows "$tmp/ftrain" "$tmp/ftrain_labels" train >"$tmp/train.fashion"
fashion_rows "$tmp/fvalid" "$tmp/ftrain_labels" train >"$tmp/valid.fashion"
fashion_rows "$tmp/ftest" "$tmp/ftest_labels" test >"$tmp/test.fashion"

# Spoken digits: id,audio,label -> the audio column, its path from OUT.
rel=$(realpath -s --relative-to="$OUT" "$SD")
for s in train valid test; do
  tail -n +2 "$SD/$s.csv" | awk -F, -v rel="$rel" '{ printf "digits/%s,,%s/%s,,%s\n", $1, rel, $2, $3 }' >"$tmp/$s.digits"
done

# WordNet: id,"gloss",label -> the text column (the gloss as quoted there). The validation glosses:
# the last N_WVALID of its training sample (itself in key order, a uniform draw).
wn_rows() { tail -n +2 "$1" | awk '{ c1 = index($0, ","); id = substr($0, 1, c1 - 1); rest = substr($0, c1 + 1)
                                     c2 = match(rest, /,[^,]*$/); printf "wordnet/%s,,,%s,%s\n", id, substr(rest, 1, c2 - 1), substr(rest, c2 + 1) }'; }
wn_rows "$WN/train.csv" >"$tmp/wn_train_all"
head -n $((N_WTRAIN_ALL - N_WVALID)) "$tmp/wn_train_all" >"$tmp/train.wordnet"
tail -n "$N_WVALID" "$tmp/wn_train_all" >"$tmp/valid.wordnet"
wn_rows "$WN/test.csv" >"$tmp/test.wordnet"

header="id,image,audio,text,label"
for s in train valid test; do
  for t in fashion digits wordnet; do { echo "$header"; cat "$tmp/$s.$t"; } >"$OUT/$s.$t.csv"; done
  { echo "$header"; cat "$tmp/$s.fashion" "$tmp/$s.digits" "$tmp/$s.wordnet"; } >"$OUT/$s.csv"
done
for s in train valid test; do
  printf 'multitask.sh: %s.csv: %d fashion, %d digits, %d wordnet rows\n' "$s" \
    "$(wc -l <"$tmp/$s.fashion")" "$(wc -l <"$tmp/$s.digits")" "$(wc -l <"$tmp/$s.wordnet")" >&2
done
