#!/usr/bin/env bash
# Makes the cross-modal digit pairs (issue 15): each item is a handwritten digit (a 20 x 20 grey
# cell of OpenCV's digits.png, from Debian's opencv-doc) and a spoken digit (tools/data/
# spoken_digits.sh), labelled "same" when they name the same digit and "different" otherwise. Test
# pairs hold out both sides: images never seen in training, said by voices never heard in it.
#   data/digit_pairs/train.csv, test.csv          id,image,audio,label
#   data/digit_pairs/train.image_only.csv, ...     the same pairs with the audio column empty
#   data/digit_pairs/train.audio_only.csv, ...     the same pairs with the image column empty
#   data/digit_pairs/img/<digit>/<cell>.pgm        the 5,000 cells (binary PGM)
#   data/digit_pairs/speech -> the spoken digits folder
# It downloads nothing: opencv-doc, imagemagick and the synthesisers spoken_digits.sh names are
# Debian packages (apt-get install opencv-doc imagemagick espeak-ng flite festival
# festvox-kallpc16k sox).
#
#   tools/data/digit_pairs.sh [OUT_DIR]     # OUT_DIR defaults to the repository's data/digit_pairs
#
# digits.png is 100 x 50 cells of 20 x 20 pixels; each band of 5 cell rows is one digit (500
# cells of 0, then 500 of 1, ...). Cell k (row-major, from 0) is img/<k / 500>/<k>.pgm.
# PAIRS_SEED (default 7) holds out 100 cells of each digit for the test set, draws the pairs, and
# shuffles them. Each training image is in PAIRS_PER_IMAGE (default 12, even) pairs and each test
# image in PAIRS_TEST_PER_IMAGE (default 6, even), half of them "same" and half "different", so an
# image alone says nothing about the label; its clip is drawn from the clips of its digit (same) or
# of one of the nine other digits, each as likely (different), so a clip alone says nothing either.
# Training pairs draw training images and clips; test pairs test images and clips (spoken_digits.sh
# holds out whole voices). SPOKEN_DIGITS (default the repository's data/spoken_digits) is where
# spoken_digits.sh writes, or has written, the clips; it is called either way (it skips work that
# is done). Rerunning with the same settings writes the same bytes.
set -euo pipefail

OUT=${1:-}
if [ -n "$OUT" ] && [ "${OUT#/}" = "$OUT" ]; then OUT=$PWD/$OUT; fi  # as given, from the caller's folder
SD=${SPOKEN_DIGITS:-}
if [ -n "$SD" ] && [ "${SD#/}" = "$SD" ]; then SD=$PWD/$SD; fi
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/data/digit_pairs}
SD=${SD:-$ROOT/data/spoken_digits}
SEED=${PAIRS_SEED:-7}
PER_IMAGE=${PAIRS_PER_IMAGE:-12}
TEST_PER_IMAGE=${PAIRS_TEST_PER_IMAGE:-6}

die() {
  echo "digit_pairs.sh: error: $1" >&2
  shift
  for hint in "$@"; do echo "  $hint" >&2; done
  exit 1
}
if ! [[ $SEED =~ ^[0-9]+$ && $PER_IMAGE =~ ^[1-9][0-9]?$ && $TEST_PER_IMAGE =~ ^[1-9][0-9]?$ ]] ||
  ((PER_IMAGE % 2 || TEST_PER_IMAGE % 2)); then
  die "PAIRS_SEED must be a whole number, PAIRS_PER_IMAGE and PAIRS_TEST_PER_IMAGE even numbers from 2 to 98" \
    "(found \"$SEED\", \"$PER_IMAGE\", \"$TEST_PER_IMAGE\")"
fi
command -v convert >/dev/null || die "convert is missing" "install ImageMagick: sudo apt-get install imagemagick"
DIGITS_PNG=/usr/share/doc/opencv-doc/examples/data/digits.png
if ! [ -f "$DIGITS_PNG" ]; then
  if [ -f "$DIGITS_PNG.gz" ]; then DIGITS_PNG=$DIGITS_PNG.gz; else
    die "$DIGITS_PNG is missing" "install OpenCV's examples: sudo apt-get install opencv-doc"
  fi
fi

# The spoken digits (their own checks name any synthesiser that is missing).
tools/data/spoken_digits.sh "$SD"
for s in train test; do [ -f "$SD/$s.csv" ] || die "$SD/$s.csv is missing after spoken_digits.sh"; done

stamp="digit-pairs v1 seed=$SEED per_image=$PER_IMAGE/$TEST_PER_IMAGE $(sha256sum <"$DIGITS_PNG" | cut -c1-16) $(cat "$SD/train.csv" "$SD/test.csv" | sha256sum | cut -c1-16) $(dpkg-query -W -f='${Version}' imagemagick 2>/dev/null)"
if [ -f "$OUT/train.csv" ] && [ -f "$OUT/test.csv" ] && [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "digit_pairs.sh: $OUT is up to date ($(($(wc -l <"$OUT/train.csv") - 1)) train, $(($(wc -l <"$OUT/test.csv") - 1)) test pairs)" >&2
  exit 0
fi
mkdir -p "$OUT"
tmp=$(mktemp -d "$OUT/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The cells: ImageMagick cuts the sheet row by row into 5,000 binary PGM files (no metadata, so
# the same sheet gives the same bytes).
src=$DIGITS_PNG
if [ "${src%.gz}" != "$src" ]; then
  gzip -dc "$src" >"$tmp/digits.png"
  src=$tmp/digits.png
fi
[ "$(identify -format '%w x %h' "$src")" = "2000 x 1000" ] || die "$src is not the 2000 x 1000 sheet of digits.png"
mkdir -p "$tmp/cells"
convert "$src" -crop 20x20 +repage +adjoin -depth 8 "$tmp/cells/%d.pgm"
for d in 0 1 2 3 4 5 6 7 8 9; do mkdir -p "$tmp/img/$d"; done
for ((k = 0; k < 5000; k++)); do mv "$tmp/cells/$k.pgm" "$tmp/img/$((k / 500))/$k.pgm"; done

# Seeded draws: a MINSTD stream (x = 48271 x mod 2^31 - 1), drawn in one fixed order.
state=$(((SEED * 7919 + 3) % 2147483647))
below() {  # below N: a whole number in [0, N) into $r
  state=$(((state * 48271) % 2147483647))
  r=$((state % $1))
}
# shuffle NAME: the array NAME in a seeded order (Fisher-Yates).
shuffle() {
  local -n a=$1
  local i t
  for ((i = ${#a[@]} - 1; i > 0; i--)); do
    below $((i + 1))
    t=${a[i]}
    a[i]=${a[r]}
    a[r]=$t
  done
}

# Images: of each digit's 500 cells, the first 100 of a seeded order are test images.
declare -a train_img test_img
for d in 0 1 2 3 4 5 6 7 8 9; do
  cells=()
  for ((k = d * 500; k < d * 500 + 500; k++)); do cells+=("$k"); done
  shuffle cells
  for ((i = 0; i < 500; i++)); do
    if ((i < 100)); then test_img+=("$d:${cells[i]}"); else train_img+=("$d:${cells[i]}"); fi
  done
done

# Clips by split and digit, from spoken_digits.sh's manifests (id,audio,label).
declare -A clips  # [split,digit] = space-separated audio paths
for s in train test; do
  for d in 0 1 2 3 4 5 6 7 8 9; do clips[$s,$d]=""; done
  while IFS=, read -r _ audio label; do
    [[ $label =~ ^[0-9]$ ]] || die "$SD/$s.csv: \"$label\" is not a digit label"
    clips[$s,$label]+="$audio "
  done < <(tail -n +2 "$SD/$s.csv")
  for d in 0 1 2 3 4 5 6 7 8 9; do [ -n "${clips[$s,$d]}" ] || die "$SD/$s.csv has no clip of $d"; done
done

# pairs SPLIT N IMAGES...: N pairs for each image, half "same", half "different", shuffled,
# written as SPLIT.csv and its two one-modality variants.
pairs() {
  local split=$1 per=$2 img d k j other label n=0
  shift 2
  local -a lines=()
  for img in "$@"; do
    d=${img%%:*}
    k=${img#*:}
    for ((j = 0; j < per; j++)); do
      if ((j % 2 == 0)); then
        other=$d
        label=same
      else
        below 9
        other=$(((d + 1 + r) % 10))
        label=different
      fi
      local -a pool
      read -r -a pool <<<"${clips[$split,$other]}"
      below ${#pool[@]}
      lines+=("img/$d/$k.pgm,speech/${pool[r]},$label")
    done
  done
  shuffle lines
  {
    echo "id,image,audio,label"
    for line in "${lines[@]}"; do
      printf '%s-%05d,%s\n' "$split" "$n" "$line"
      n=$((n + 1))
    done
  } >"$tmp/$split.csv"
  # The ablations' inputs: the same pairs and labels, one column left empty (data.allow_missing).
  awk -F, -v OFS=, 'NR > 1 { $3 = "" } 1' "$tmp/$split.csv" >"$tmp/$split.image_only.csv"
  awk -F, -v OFS=, 'NR > 1 { $2 = "" } 1' "$tmp/$split.csv" >"$tmp/$split.audio_only.csv"
}
pairs train "$PER_IMAGE" "${train_img[@]}"
pairs test "$TEST_PER_IMAGE" "${test_img[@]}"

rm -rf "$OUT/img" "$OUT/speech"
mv "$tmp/img" "$OUT/img"
ln -s "$SD" "$OUT/speech"
for f in train test train.image_only test.image_only train.audio_only test.audio_only; do mv "$tmp/$f.csv" "$OUT/$f.csv"; done
echo "$stamp" >"$OUT/.stamp"
echo "digit_pairs.sh: wrote $OUT/train.csv ($(($(wc -l <"$OUT/train.csv") - 1)) pairs of 4,000 images) and" \
     "$OUT/test.csv ($(($(wc -l <"$OUT/test.csv") - 1)) pairs of the 1,000 held-out images and held-out voices)" >&2
