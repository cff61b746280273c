#!/usr/bin/env bash
# Cuts the small slice of the protein-families data set that tests/test_train_protein.cpp trains on
# (tests/data/protein_families/, README.md there): sequences cut to their first 126 residues (what a
# max_length 128 model sees), labelled again by hmmsearch -E 1e-5 over those residues (a family
# hit on the whole 510 residues may lie beyond 126), in three classes: Pkinase, RRM_1 and none
# (SMC_N and fn3 have too few hits in their first 126 residues: 19 and 11 of 20,000).
#   train.csv  200 sequences of the training clusters: 60 Pkinase, every RRM_1 (25), 115 none
#   test.csv   100 of the held-out (validation and test) clusters: 40 Pkinase, every RRM_1 (7), 53 none
# Needs the full data set first (tools/data/protein_families.sh, default seed and settings).
#
#   tools/reference/make_protein_families_slice.sh [DATA_DIR [OUT_DIR]]
set -euo pipefail

cd "$(dirname "$0")/../.."
DATA=${1:-data/protein_families}
OUT=${2:-tests/data/protein_families}
EXAMPLES=/usr/share/doc/hmmer/examples
for f in "$DATA/sequences.tsv" "$DATA/train.csv" "$DATA/validation.csv" "$DATA/test_all.csv"; do
  [ -r "$f" ] || { echo "make_protein_families_slice.sh: $f is missing: run tools/data/protein_families.sh first" >&2; exit 1; }
done
command -v hmmsearch >/dev/null || { echo "make_protein_families_slice.sh: sudo apt-get install hmmer hmmer-examples" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Every labelled sequence of the data set's classifier files, cut: id <TAB> split <TAB> residues.
LC_ALL=C awk -F '\t' 'FNR == NR { if (FNR > 1) split_of[$1] = $6; next }
  FNR > 1 { split($0, f, ","); printf "%s\t%s\t%s\n", f[1], split_of[f[1]], substr(f[2], 1, 126) }' \
  "$DATA/sequences.tsv" "$DATA/train.csv" "$DATA/validation.csv" "$DATA/test_all.csv" |
  LC_ALL=C sort -u >"$tmp/cut.tsv"
LC_ALL=C awk -F '\t' '{ printf ">%s\n%s\n", $1, $3 }' "$tmp/cut.tsv" >"$tmp/cut.fasta"
: >"$tmp/hits.tsv"
for fam in Pkinase RRM_1; do
  hmm="$EXAMPLES/tutorial/$fam.hmm"
  [ -r "$hmm" ] || { gzip -dc "$EXAMPLES/testsuite/$fam.hmm.gz" >"$tmp/$fam.hmm"; hmm="$tmp/$fam.hmm"; }
  hmmsearch --cpu 1 --seed 42 -E 1e-5 --noali --tblout "$tmp/$fam.tbl" -o /dev/null "$hmm" "$tmp/cut.fasta"
  LC_ALL=C awk -v fam="$fam" '!/^#/ { printf "%s\t%s\t%s\n", $1, fam, $5 }' "$tmp/$fam.tbl" >>"$tmp/hits.tsv"
done
# Any hit of SMC_N or fn3 in the first 126 residues is left out of "none" as well.
for fam in SMC_N fn3; do
  hmm="$EXAMPLES/tutorial/$fam.hmm"
  [ -r "$hmm" ] || { gzip -dc "$EXAMPLES/testsuite/$fam.hmm.gz" >"$tmp/$fam.hmm"; hmm="$tmp/$fam.hmm"; }
  hmmsearch --cpu 1 --seed 42 -E 1e-5 --noali --tblout "$tmp/$fam.tbl" -o /dev/null "$hmm" "$tmp/cut.fasta"
  LC_ALL=C awk '!/^#/ { print $1 "\tother\t" $5 }' "$tmp/$fam.tbl" >>"$tmp/hits.tsv"
done
LC_ALL=C sort -t $'\t' -k1,1 -k3,3g "$tmp/hits.tsv" | LC_ALL=C awk -F '\t' '$1 != last { print; last = $1 }' >"$tmp/best.tsv"

# id <TAB> split <TAB> label <TAB> residues, in a seeded order (a MINSTD key of the accession).
LC_ALL=C awk -F '\t' '
  BEGIN { for (c = 32; c < 127; ++c) ord[sprintf("%c", c)] = c }
  function key(s,   h, i) {
    h = 1
    for (i = 1; i <= length(s); ++i) h = (h * 48271 + ord[substr(s, i, 1)]) % 2147483647
    for (i = 0; i < 4; ++i) h = (h * 48271) % 2147483647
    return h
  }
  FILENAME ~ /best.tsv$/ { label[$1] = $2; next }
  { l = ($1 in label) ? label[$1] : "none"; if (l != "other") printf "%010d\t%s\t%s\t%s\t%s\n", key($1), $1, $2, l, $3 }' \
  "$tmp/best.tsv" "$tmp/cut.tsv" | LC_ALL=C sort >"$tmp/keyed.tsv"

pick() {  # pick SPLITS LABEL N: the first N of the label in those splits, in key order
  LC_ALL=C awk -F '\t' -v splits="$1" -v label="$2" -v n="$3" \
    'index(" " splits " ", " " $3 " ") && $4 == label && k < n { print; ++k }' "$tmp/keyed.tsv"
}
to_csv() { LC_ALL=C sort -t $'\t' -k2,2 | LC_ALL=C awk -F '\t' 'BEGIN { print "id,protein,label" } { printf "%s,%s,%s\n", $2, $5, $4 }'; }
mkdir -p "$OUT"
{ pick train Pkinase 60; pick train RRM_1 1000; pick train none 115; } | to_csv >"$OUT/train.csv"
{ pick "validation test" Pkinase 40; pick "validation test" RRM_1 1000; pick "validation test" none 53; } | to_csv >"$OUT/test.csv"
for s in train test; do
  echo "make_protein_families_slice.sh: $OUT/$s.csv: $(LC_ALL=C awk -F, 'NR > 1 { n[$3]++ } END { for (l in n) printf "%s %d ", l, n[l] }' "$OUT/$s.csv")" >&2
done
