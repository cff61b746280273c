#!/usr/bin/env bash
# Makes the WordNet glosses data set of configs/train/wordnet_*.yaml: every synset's gloss (its
# definition, without the quoted usage examples) labelled with its lexicographer file
# (noun.animal, verb.motion, ...; 45 classes), as two CSV manifests `id,text,label`:
#   data/wordnet/train.csv   5,000 synsets
#   data/wordnet/test.csv    1,000 synsets (disjoint from train)
# It does not download anything: it reads Debian's wordnet-base (WordNet 3.0),
# /usr/share/wordnet/data.{noun,verb,adj,adv} (WORDNET_DIR to read another copy).
#
#   tools/data/wordnet_glosses.sh [OUT_DIR]      # OUT_DIR defaults to the repository's data/wordnet
#
# The split is deterministic: each synset gets a pseudo-random key from its part of speech and
# offset (MINSTD rounds, exact in any awk's doubles); synsets sorted by that key, the first
# WORDNET_TEST (1000) are the test set and the next WORDNET_TRAIN (5000) the training set: a
# uniform sample of WordNet's 117,659 synsets, so the classes keep WordNet's own proportions. A
# subsample, because fine-tuning all-MiniLM-L6-v2 on 2 CPU cores runs at some tens of examples a
# second (docs/TRAINING.md). WORDNET_SEED (default 13) picks another sample. Rerunning with the
# same settings rewrites the same bytes (and skips the work when they are already there).
set -euo pipefail

OUT=${1:-}
if [ -n "$OUT" ] && [ "${OUT#/}" = "$OUT" ]; then OUT=$PWD/$OUT; fi  # as given, from the caller's folder
cd "$(dirname "$0")/../.."
OUT=${OUT:-data/wordnet}  # the default is the repository's data/wordnet, wherever it is called from
SRC=${WORDNET_DIR:-/usr/share/wordnet}
N_TEST=${WORDNET_TEST:-1000}
N_TRAIN=${WORDNET_TRAIN:-5000}
SEED=${WORDNET_SEED:-13}

die() {
  echo "wordnet_glosses.sh: error: $1" >&2
  shift
  for hint in "$@"; do echo "  $hint" >&2; done
  exit 1
}
for pos in noun verb adj adv; do
  [ -r "$SRC/data.$pos" ] ||
    die "$SRC/data.$pos is missing or unreadable" \
        "install WordNet 3.0: sudo apt-get install wordnet-base (or tools/bootstrap.sh train wordnet_minilm)" \
        "or set WORDNET_DIR to a folder holding data.noun, data.verb, data.adj and data.adv"
done
for n in "$N_TEST" "$N_TRAIN" "$SEED"; do
  [[ $n =~ ^[0-9]+$ ]] || die "WORDNET_TEST, WORDNET_TRAIN and WORDNET_SEED must be whole numbers (found \"$n\")"
done

stamp="wordnet-3.0 seed=$SEED test=$N_TEST train=$N_TRAIN v1 $(cat "$SRC"/data.{noun,verb,adj,adv} | cksum)"
if [ -f "$OUT/train.csv" ] && [ -f "$OUT/test.csv" ] && [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "wordnet_glosses.sh: $OUT is up to date ($N_TRAIN train, $N_TEST test)" >&2
  exit 0
fi
mkdir -p "$OUT"
tmp=$(mktemp -d "$OUT/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# One line per synset: key <TAB> id <TAB> lexname <TAB> gloss.
# A data line (wndb(5WN)): offset lex_filenum ss_type w_cnt word lex_id ... | gloss. Lines that
# start with spaces are the licence header.
for pos in noun verb adj adv; do
  LC_ALL=C awk -v pos="$pos" -v seed="$SEED" '
    BEGIN {
      # The lexicographer files by number, as WordNet 3.0 lists them in its lexnames file (not
      # shipped by Debian; the table is fixed by the WordNet database format, wndb(5WN)).
      n = split("adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute " \
                "noun.body noun.cognition noun.communication noun.event noun.feeling noun.food noun.group " \
                "noun.location noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession " \
                "noun.process noun.quantity noun.relation noun.shape noun.state noun.substance noun.time " \
                "verb.body verb.change verb.cognition verb.communication verb.competition verb.consumption " \
                "verb.contact verb.creation verb.emotion verb.motion verb.perception verb.possession " \
                "verb.social verb.stative verb.weather adj.ppl", lexname, " ")
      if (n != 45) { print "lexname table: " n " names, expected 45" > "/dev/stderr"; exit 1 }
      posnum = (pos == "noun") ? 1 : (pos == "verb") ? 2 : (pos == "adj") ? 3 : 4
    }
    /^  / { next }
    {
      bar = index($0, " | ")
      if (bar == 0) next
      gloss = substr($0, bar + 3)
      # The definition: the text before the first quoted example ("; \"...\"").
      q = index(gloss, "; \"")
      if (q > 0) gloss = substr(gloss, 1, q - 1)
      else if (substr(gloss, 1, 1) == "\"") gloss = ""
      gsub(/[ \t\r]+$/, "", gloss)
      gsub(/^[ \t]+/, "", gloss)
      if (gloss == "") next
      file = $2 + 0
      if (!(file + 1 in lexname)) { print pos ": offset " $1 ": unknown lexicographer file " $2 > "/dev/stderr"; exit 1 }
      # MINSTD (x = 48271 x mod 2^31 - 1): every product below 2^53, so exact in doubles.
      h = ($1 + posnum * 100000000 + seed * 7919) % 2147483647
      if (h == 0) h = 1
      for (r = 0; r < 4; ++r) h = (h * 48271) % 2147483647
      gsub(/"/, "\"\"", gloss)
      printf "%010d\t%s.%s\t%s\t%s\n", h, pos, $1, lexname[file + 1], gloss
    }' "$SRC/data.$pos"
done >"$tmp/all.tsv"

LC_ALL=C sort -t $'\t' -k1,1 -k2,2 "$tmp/all.tsv" >"$tmp/sorted.tsv"
total=$(wc -l <"$tmp/sorted.tsv")
[ $((N_TEST + N_TRAIN)) -le "$total" ] ||
  die "WORDNET_TEST + WORDNET_TRAIN = $((N_TEST + N_TRAIN)) is more than the $total glosses"
to_csv() { LC_ALL=C awk -F '\t' 'BEGIN { print "id,text,label" } { printf "%s,\"%s\",%s\n", $2, $4, $3 }'; }
head -n "$N_TEST" "$tmp/sorted.tsv" | to_csv >"$tmp/test.csv"
sed -n "$((N_TEST + 1)),$((N_TEST + N_TRAIN))p" "$tmp/sorted.tsv" | to_csv >"$tmp/train.csv"
mv "$tmp/train.csv" "$OUT/train.csv"
mv "$tmp/test.csv" "$OUT/test.csv"
echo "$stamp" >"$OUT/.stamp"
echo "wordnet_glosses.sh: wrote $OUT/train.csv ($N_TRAIN) and $OUT/test.csv ($N_TEST), from $total glosses in $SRC" >&2
