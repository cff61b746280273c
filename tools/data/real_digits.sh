#!/usr/bin/env bash
# Makes the real-speech check of the spoken-digit recipes (issue 15): recordings of people that
# Debian ships, cut at their pauses into word-sized clips, as a CSV manifest `id,audio,utterance`
# for `tessera run` (docs/TRAINING.md, "Spoken digits: real recordings"):
#   data/real_digits/clips.csv, wav/<recording>-<n>.wav
# It downloads nothing. The recordings (apt-get install pocketsphinx-testdata alsa-utils sox):
#   pocketsphinx-testdata  cards/001-005.wav (16 kHz: "ten of clubs", "four queen of clubs",
#                          "seven of clubs", "five five", "eight of spades four of clubs seven of
#                          hearts"), tidigits/dhd.2934z.raw (8 kHz headerless: "two nine three four
#                          zero"), numbers.raw and goforward.raw (16 kHz headerless; the package
#                          ships no transcript of numbers.raw; goforward.raw says "go forward ten
#                          meters");
#   alsa-utils             /usr/share/sounds/alsa/*.wav (48 kHz: "front center", "rear left", ...;
#                          no digit: what a model says of words it never learnt).
# Each recording becomes 16 kHz mono 16-bit, its peak at -1 dBFS, and is cut wherever it stays
# under 4 % of full scale for 0.08 s; pieces under 0.1 s are dropped. The cuts are sox's, so a word may be split or
# two run together: the utterance column keeps the recording's words for the reader, not a label.
#
#   tools/data/real_digits.sh [OUT_DIR]       # OUT_DIR defaults to the repository's data/real_digits
set -euo pipefail

OUT=${1:-}
if [ -n "$OUT" ] && [ "${OUT#/}" = "$OUT" ]; then OUT=$PWD/$OUT; fi  # as given, from the caller's folder
cd "$(dirname "$0")/../.."
OUT=${OUT:-data/real_digits}

die() {
  echo "real_digits.sh: error: $1" >&2
  shift
  for hint in "$@"; do echo "  $hint" >&2; done
  exit 1
}
PS=/usr/share/pocketsphinx/test/data
ALSA=/usr/share/sounds/alsa
command -v sox >/dev/null || die "sox is missing" "sudo apt-get install sox"
[ -f "$PS/cards/001.wav" ] || die "$PS/cards/001.wav is missing" "sudo apt-get install pocketsphinx-testdata"
[ -f "$ALSA/Front_Center.wav" ] || die "$ALSA/Front_Center.wav is missing" "sudo apt-get install alsa-utils"

mkdir -p "$OUT"
tmp=$(mktemp -d "$OUT/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/wav"
echo "id,audio,utterance" >"$tmp/clips.csv"

# cut NAME UTTERANCE SOX_INPUT...: the recording as 16 kHz mono, cut at its pauses.
cut() {
  local name=$1 utterance=$2
  shift 2
  sox -q -G -D "$@" -r 16000 -c 1 -b 16 "$tmp/whole.wav" gain -n -1
  sox -q -D "$tmp/whole.wav" "$tmp/piece.wav" silence 1 0.02 4% 1 0.08 4% : newfile : restart
  local n=0 piece
  for piece in "$tmp"/piece*.wav; do
    [ -f "$piece" ] || continue
    if [ "$(soxi -s "$piece")" -ge 1600 ]; then
      n=$((n + 1))
      mv "$piece" "$tmp/wav/$name-$n.wav"
      echo "$name-$n,wav/$name-$n.wav,$utterance" >>"$tmp/clips.csv"
    fi
    rm -f "$piece"
  done
  rm -f "$tmp/whole.wav"
}

cut cards-001 "ten of clubs" "$PS/cards/001.wav"
cut cards-002 "four queen of clubs" "$PS/cards/002.wav"
cut cards-003 "seven of clubs" "$PS/cards/003.wav"
cut cards-004 "five five" "$PS/cards/004.wav"
cut cards-005 "eight of spades four of clubs seven of hearts" "$PS/cards/005.wav"
cut tidigits-2934z "two nine three four zero" -t raw -r 8000 -e signed -b 16 -c 1 -L "$PS/tidigits/dhd.2934z.raw"
cut numbers "(no transcript ships)" -t raw -r 16000 -e signed -b 16 -c 1 -L "$PS/numbers.raw"
cut goforward "go forward ten meters" -t raw -r 16000 -e signed -b 16 -c 1 -L "$PS/goforward.raw"
for f in "$ALSA"/*.wav; do
  base=$(basename "$f" .wav)
  words=$(echo "$base" | tr '_' ' ' | tr '[:upper:]' '[:lower:]')
  cut "alsa-$(echo "$base" | tr '_[:upper:]' '-[:lower:]')" "$words" "$f"
done

rm -rf "$OUT/wav"
mv "$tmp/wav" "$OUT/wav"
mv "$tmp/clips.csv" "$OUT/clips.csv"
echo "real_digits.sh: wrote $OUT/clips.csv ($(($(wc -l <"$OUT/clips.csv") - 1)) clips)" >&2
