#!/usr/bin/env bash
# Makes the spoken-digits data set (issue 15): the English words "zero" ... "nine" said by Debian's
# speech synthesisers, 16 kHz mono 16-bit WAV trimmed of silence, as three CSV manifests
# `id,audio,label` (label = the digit) whose voices are disjoint: a voice of the validation set
# (which picks the best checkpoint) or of the test set never speaks in the training set:
#   data/spoken_digits/train.csv, valid.csv, test.csv, wav/<voice>/<digit>-<take>.wav
# It downloads nothing: espeak-ng, flite, festival (festvox-kallpc16k) and sox are Debian packages
# (apt-get install espeak-ng flite festival festvox-kallpc16k sox).
#
#   tools/data/spoken_digits.sh [OUT_DIR]        # OUT_DIR defaults to the repository's data/spoken_digits
#
# The voices (a voice is one speaker: what the test set holds out whole):
#   espeak-ng  7 accents (en-us, en-gb, en-gb-scotland, en-gb-x-rp, en-gb-x-gbclan,
#              en-gb-x-gbcwmd, en-029) x 16 variants (m1-m7, f1-f5, klatt, klatt2, croak,
#              whisper) = 112 voices;
#   flite      kal, kal16, awb, rms, slt;
#   festival   kal_diphone.
# Each voice says each digit DIGITS_TAKES (3) times, each take at its own speed and pitch drawn
# from the seed (espeak-ng: -s 120-200 words/min, -p 30-70; flite and festival: durations
# stretched 0.8-1.25; flite's pitch 90-160 Hz). The test voices: espeak-ng
# accent i, variant j when (i + 3 j + seed) mod 5 = 0 (a Latin square: 22 of 112 voices, every
# accent and every variant both in training and in test, never the same voice), and flite's slt.
# The validation voices: (i + 3 j + seed) mod 10 = 1 (11 voices), and flite's rms. DIGITS_SEED
# (default 7) draws other takes and holds out other voices. Rerunning with the same settings
# rewrites the same bytes (and skips the work when they are already there).
set -euo pipefail

OUT=${1:-}
if [ -n "$OUT" ] && [ "${OUT#/}" = "$OUT" ]; then OUT=$PWD/$OUT; fi  # as given, from the caller's folder
cd "$(dirname "$0")/../.."
OUT=${OUT:-data/spoken_digits}
SEED=${DIGITS_SEED:-7}
TAKES=${DIGITS_TAKES:-3}

die() {
  echo "spoken_digits.sh: error: $1" >&2
  shift
  for hint in "$@"; do echo "  $hint" >&2; done
  exit 1
}
for tool in espeak-ng flite text2wave sox; do
  command -v "$tool" >/dev/null ||
    die "$tool is missing" "install the synthesisers: sudo apt-get install espeak-ng flite festival festvox-kallpc16k sox"
done
if ! [[ $SEED =~ ^[0-9]+$ && $TAKES =~ ^[1-9][0-9]?$ ]]; then
  die "DIGITS_SEED must be a whole number and DIGITS_TAKES one from 1 to 99 (found \"$SEED\", \"$TAKES\")"
fi

WORDS=(zero one two three four five six seven eight nine)
ACCENTS=(en-us en-gb en-gb-scotland en-gb-x-rp en-gb-x-gbclan en-gb-x-gbcwmd en-029)
VARIANTS=(m1 m2 m3 m4 m5 m6 m7 f1 f2 f3 f4 f5 klatt klatt2 croak whisper)
FLITE=(kal kal16 awb rms slt)

stamp="spoken-digits v2 seed=$SEED takes=$TAKES $(espeak-ng --version | head -1) $(dpkg-query -W -f='${Version} ' flite festival festvox-kallpc16k sox 2>/dev/null)"
if [ -f "$OUT/train.csv" ] && [ -f "$OUT/valid.csv" ] && [ -f "$OUT/test.csv" ] && [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "spoken_digits.sh: $OUT is up to date ($(($(wc -l <"$OUT/train.csv") - 1)) train, $(($(wc -l <"$OUT/valid.csv") - 1)) valid, $(($(wc -l <"$OUT/test.csv") - 1)) test)" >&2
  exit 0
fi
mkdir -p "$OUT"
tmp=$(mktemp -d "$OUT/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/wav"

# The takes' settings: a seeded MINSTD stream (x = 48271 x mod 2^31 - 1), drawn in one fixed order.
state=$(((SEED * 7919 + 1) % 2147483647))
speed=0 pitch=0 stretch=0 f0=0  # set by draw
draw() {  # draw VAR LO HI: sets VAR to a whole number in [LO, HI] (no subshell: the stream must advance)
  state=$(((state * 48271) % 2147483647))
  printf -v "$1" '%d' $(($2 + state % ($3 - $2 + 1)))
}

# One clip: the synthesiser's WAV ($1) to 16 kHz mono 16-bit, silence trimmed at both ends, into $2.
# No dither (-D): it adds random noise, and the same settings must give the same bytes.
finish() {
  sox -q -G -D "$1" -r 16000 -c 1 -b 16 "$2" silence 1 0.02 0.5% reverse silence 1 0.02 0.5% reverse
  rm -f "$1"
  [ "$(soxi -s "$2")" -gt 1600 ] || die "$2: under 0.1 s of sound after trimming (a synthesiser wrote silence?)"
}

: >"$tmp/train.csv.body"
: >"$tmp/valid.csv.body"
: >"$tmp/test.csv.body"
add() {  # add VOICE DIGIT TAKE SPLIT
  echo "$1/$2-$3,wav/$1/$2-$3.wav,$2" >>"$tmp/$4.csv.body"
}

n=0
for i in "${!ACCENTS[@]}"; do
  for j in "${!VARIANTS[@]}"; do
    voice="espeak-${ACCENTS[$i]}+${VARIANTS[$j]}"
    split="train"
    if (((i + 3 * j + SEED) % 5 == 0)); then split="test"; fi
    if (((i + 3 * j + SEED) % 10 == 1)); then split="valid"; fi
    mkdir -p "$tmp/wav/$voice"
    for d in "${!WORDS[@]}"; do
      for t in $(seq 1 "$TAKES"); do
        draw speed 120 200
        draw pitch 30 70
        espeak-ng -v "${ACCENTS[$i]}+${VARIANTS[$j]}" -s "$speed" -p "$pitch" -w "$tmp/raw.wav" "${WORDS[$d]}"
        finish "$tmp/raw.wav" "$tmp/wav/$voice/$d-$t.wav"
        add "$voice" "$d" "$t" "$split"
        n=$((n + 1))
      done
    done
  done
done
for v in "${FLITE[@]}"; do
  voice="flite-$v"
  split="train"
  if [ "$v" = slt ]; then split="test"; fi
  if [ "$v" = rms ]; then split="valid"; fi
  mkdir -p "$tmp/wav/$voice"
  for d in "${!WORDS[@]}"; do
    for t in $(seq 1 "$TAKES"); do
      draw stretch 80 125
      draw f0 90 160
      flite -voice "$v" -t "${WORDS[$d]}" -o "$tmp/raw.wav" \
        --setf duration_stretch="$((stretch / 100)).$(printf %02d $((stretch % 100)))" --setf int_f0_target_mean="$f0"
      finish "$tmp/raw.wav" "$tmp/wav/$voice/$d-$t.wav"
      add "$voice" "$d" "$t" "$split"
      n=$((n + 1))
    done
  done
done
voice=festival-kal_diphone
mkdir -p "$tmp/wav/$voice"
for d in "${!WORDS[@]}"; do
  for t in $(seq 1 "$TAKES"); do
    draw stretch 80 125
    echo "${WORDS[$d]}" |
      text2wave -o "$tmp/raw.wav" -eval "(Parameter.set 'Duration_Stretch $((stretch / 100)).$(printf %02d $((stretch % 100))))"
    finish "$tmp/raw.wav" "$tmp/wav/$voice/$d-$t.wav"
    add "$voice" "$d" "$t" train
    n=$((n + 1))
  done
done

for s in train valid test; do
  { echo "id,audio,label"; cat "$tmp/$s.csv.body"; } >"$tmp/$s.csv"
done
rm -rf "$OUT/wav"
mv "$tmp/wav" "$OUT/wav"
mv "$tmp/train.csv" "$OUT/train.csv"
mv "$tmp/valid.csv" "$OUT/valid.csv"
mv "$tmp/test.csv" "$OUT/test.csv"
echo "$stamp" >"$OUT/.stamp"
echo "spoken_digits.sh: wrote $n clips: $OUT/train.csv ($(($(wc -l <"$OUT/train.csv") - 1))), $OUT/valid.csv" \
     "($(($(wc -l <"$OUT/valid.csv") - 1))) and $OUT/test.csv ($(($(wc -l <"$OUT/test.csv") - 1))): three sets of voices, none shared" >&2
