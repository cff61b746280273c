#!/usr/bin/env bash
# Cuts the committed spoken-digits slice (this folder) from the data set tools/data/spoken_digits.sh
# makes with its defaults (DIGITS_SEED 7, 3 takes): 16 training voices x 10 digits x take 1, and
# 6 test voices x 10 digits x take 1, as FLAC (lossless: the same samples as the WAV files).
#
#   tools/data/spoken_digits.sh /tmp/sd && tests/data/spoken_digits/make_slice.sh /tmp/sd
set -euo pipefail
SRC=${1:?usage: make_slice.sh SPOKEN_DIGITS_DIR}
cd "$(dirname "$0")"
TRAIN=(espeak-en-us+m1 espeak-en-us+f1 espeak-en-gb+m3 espeak-en-gb+f2 espeak-en-gb-scotland+m1
  espeak-en-gb-scotland+f3 espeak-en-gb-x-rp+m2 espeak-en-gb-x-rp+f3 espeak-en-gb-x-gbclan+m3
  espeak-en-gb-x-gbclan+f1 espeak-en-gb-x-gbcwmd+m1 espeak-en-gb-x-gbcwmd+f2 espeak-en-029+m1
  espeak-en-029+f1 flite-kal festival-kal_diphone)
TEST=(espeak-en-us+m2 espeak-en-gb+f3 espeak-en-gb-scotland+m3 espeak-en-gb-x-rp+m1 espeak-en-029+f3 flite-slt)
rm -rf flac
mkdir flac
write() {  # write SET TAKES VOICE...
  local set=$1 takes=$2 v d t
  shift 2
  echo "id,audio,label" >"$set.csv"
  for v in "$@"; do
    grep -q "^$v/" "$SRC/$set.csv" || { echo "make_slice.sh: $v is not a $set voice of $SRC" >&2; exit 1; }
    mkdir -p "flac/$v"
    for d in 0 1 2 3 4 5 6 7 8 9; do
      for t in $(seq 1 "$takes"); do
        sox -q -D "$SRC/wav/$v/$d-$t.wav" "flac/$v/$d-$t.flac"
        echo "$v/$d-$t,flac/$v/$d-$t.flac,$d" >>"$set.csv"
      done
    done
  done
}
write train 1 "${TRAIN[@]}"
write test 1 "${TEST[@]}"
