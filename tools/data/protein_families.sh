#!/usr/bin/env bash
# Makes the protein-families data set of configs/train/protein_families*.yaml (issue 15): the 20,000
# UniProtKB sequences of Debian's mmseqs2-examples, each cut to its first PROTEIN_RESIDUES (510)
# residues, labelled by hmmsearch (HMMER 3) with four Pfam HMMs that Debian ships, and split by
# mmseqs2 clusters (30 % identity, 80 % coverage) so that no held-out sequence has a close relative
# in the training set:
#   data/protein_families/train.csv, validation.csv, test.csv   `id,protein,label` (the classifier)
#   data/protein_families/mlm_train.fasta, mlm_validation.fasta  (masked-LM pretraining; no test cluster)
#   data/protein_families/sequences.tsv   every sequence: id, residues, label, E-value, cluster, split
# It downloads nothing: DB.fasta.gz is mmseqs2-examples', the HMMs hmmer-examples', and hmmsearch and
# mmseqs are HMMER's and MMseqs2's (apt-get install mmseqs2 mmseqs2-examples hmmer hmmer-examples).
#
#   tools/data/protein_families.sh [OUT_DIR]     # OUT_DIR defaults to the repository's data/protein_families
#
# The families: the amino-acid Pfam HMMs in hmmer-examples, /usr/share/doc/hmmer/examples/
# (tutorial/*.hmm, testsuite/*.hmm.gz), searched with hmmsearch -E 1e-5 over the cut sequences;
# sequences hit (of 20,000, on their first 510 residues): Pkinase (PF00069.17, protein kinase
# domain) 345, SMC_N (PF02463.10, RecF/RecN/SMC N terminal domain) 62, RRM_1 (PF00076.13, RNA
# recognition motif) 57, fn3 (PF00041.13, fibronectin type III) 42; the others hit too few to learn
# (LuxC 2, 2OG-FeII_Oxy_3 1, Caudal_act, Patched and XYPPX none; US2, in easel's examples, 23; the
# tutorial's globins4, not a Pfam model, 2), so the classes are those four and "none" (no hit).
# A sequence hit by several takes the family with the smallest E-value (then the higher bit score,
# then the name; none of these 20,000 is hit by two). The label describes the residues the model
# sees: a domain beyond residue 510 is not searched (Pkinase hits 407 of the whole sequences).
#
# The split: mmseqs easy-cluster --min-seq-id 0.3 -c 0.8 (cov-mode 0: both sequences covered) over
# the cut sequences; a cluster's stratum is its members' family (none if it has none). Within a
# stratum clusters are taken in the order of a seeded key of their representative's accession
# (MINSTD rounds, exact in any awk's doubles), and each goes whole to the split furthest below its
# share of the stratum's sequences: 20 % test, 20 % validation, 60 % training. (At 10 % the test
# set would hold 3 or 4 sequences of the smallest families, whose 42 and 57 sit in 16 and 19
# clusters.)
# test.csv and validation.csv hold every sequence of their clusters; train.csv holds every family
# sequence of the training clusters and PROTEIN_NONE_RATIO (4) times as many "none" ones (the "none"
# of the training clusters with the smallest seeded keys), so that fine-tuning fits its minutes.
# The masked-LM files hold every sequence of the training (mlm_train) and validation clusters,
# unlabelled; the test clusters are in neither.
#
# PROTEIN_SEED (default 15) draws other splits and another "none" sample; PROTEIN_RESIDUES the cut.
# Rerunning with the same settings rewrites the same bytes (and skips the work when they are there).
set -euo pipefail

OUT=${1:-}
if [ -n "$OUT" ] && [ "${OUT#/}" = "$OUT" ]; then OUT=$PWD/$OUT; fi  # as given, from the caller's folder
cd "$(dirname "$0")/../.."
OUT=${OUT:-data/protein_families}
SEED=${PROTEIN_SEED:-15}
RESIDUES=${PROTEIN_RESIDUES:-510}
RATIO=${PROTEIN_NONE_RATIO:-4}
MLM_VALIDATION=${PROTEIN_MLM_VALIDATION:-1000}
DB=/usr/share/doc/mmseqs2/example-data/DB.fasta.gz
EXAMPLES=/usr/share/doc/hmmer/examples
FAMILIES=(Pkinase SMC_N RRM_1 fn3)
HMMS=("$EXAMPLES/tutorial/Pkinase.hmm" "$EXAMPLES/testsuite/SMC_N.hmm.gz" "$EXAMPLES/testsuite/RRM_1.hmm.gz"
      "$EXAMPLES/tutorial/fn3.hmm")

die() {
  echo "protein_families.sh: error: $1" >&2
  shift
  for hint in "$@"; do echo "  $hint" >&2; done
  exit 1
}
install_hint="install them: sudo apt-get install mmseqs2 mmseqs2-examples hmmer hmmer-examples"
for tool in hmmsearch mmseqs; do
  command -v "$tool" >/dev/null || die "$tool is missing" "$install_hint"
done
for f in "$DB" "${HMMS[@]}"; do
  [ -r "$f" ] || die "$f is missing or unreadable" "$install_hint"
done
if ! [[ $SEED =~ ^[0-9]+$ && $RESIDUES =~ ^[1-9][0-9]{0,5}$ && $RATIO =~ ^[0-9]+$ && $MLM_VALIDATION =~ ^[0-9]+$ ]]; then
  die "PROTEIN_SEED, PROTEIN_NONE_RATIO and PROTEIN_MLM_VALIDATION must be whole numbers, PROTEIN_RESIDUES one" \
      "from 1 to 999999 (found \"$SEED\", \"$RATIO\", \"$MLM_VALIDATION\", \"$RESIDUES\")"
fi

stamp="protein-families v1 seed=$SEED residues=$RESIDUES none_ratio=$RATIO mlm_validation=$MLM_VALIDATION families=${FAMILIES[*]}"
stamp+=" $(dpkg-query -W -f='${Package}=${Version} ' mmseqs2 mmseqs2-examples hmmer hmmer-examples 2>/dev/null)"
stamp+=" $(cat "$DB" "${HMMS[@]}" tools/data/protein_families.sh | cksum)"
files=(train.csv validation.csv test.csv test_all.csv mlm_train.fasta mlm_validation.fasta sequences.tsv)
up_to_date=1
for f in "${files[@]}"; do [ -f "$OUT/$f" ] || up_to_date=0; done
if [ "$up_to_date" = 1 ] && [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "protein_families.sh: $OUT is up to date ($(($(wc -l <"$OUT/train.csv") - 1)) train," \
       "$(($(wc -l <"$OUT/validation.csv") - 1)) validation, $(($(wc -l <"$OUT/test.csv") - 1)) test)" >&2
  exit 0
fi
mkdir -p "$OUT"
tmp=$(mktemp -d "$OUT/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The sequences, cut: one record per line, named by accession (">sp|P69905|HBA_HUMAN ..." -> P69905).
gzip -dc "$DB" | LC_ALL=C awk -v cut="$RESIDUES" '
  function flush() { if (name != "") printf ">%s\n%s\n", name, substr(seq, 1, cut) }
  /^>/ { flush(); split(substr($1, 2), f, "|"); name = (f[2] != "") ? f[2] : f[1]; seq = ""; next }
  { gsub(/[ \t\r]/, ""); seq = seq $0 }
  END { flush() }' >"$tmp/all.fasta"
n=$(grep -c '^>' "$tmp/all.fasta")
[ "$(grep '^>' "$tmp/all.fasta" | sort | uniq -d | wc -l)" = 0 ] || die "$DB: two records share an accession"
echo "protein_families.sh: $n sequences, cut to $RESIDUES residues; hmmsearch with ${FAMILIES[*]}" >&2

# Labels: the hit with the smallest full-sequence E-value (ties: the higher score, then the name).
: >"$tmp/hits.tsv"
for i in "${!FAMILIES[@]}"; do
  hmm="${HMMS[$i]}"
  if [ "${hmm%.gz}" != "$hmm" ]; then
    gzip -dc "$hmm" >"$tmp/${FAMILIES[$i]}.hmm"
    hmm="$tmp/${FAMILIES[$i]}.hmm"
  fi
  hmmsearch --cpu 2 --seed 42 -E 1e-5 --noali --tblout "$tmp/${FAMILIES[$i]}.tbl" -o /dev/null "$hmm" "$tmp/all.fasta"
  # tblout: target, accession, query, accession, E-value, score, ...
  LC_ALL=C awk -v fam="${FAMILIES[$i]}" '!/^#/ { printf "%s\t%s\t%s\t%s\n", $1, fam, $5, $6 }' \
    "$tmp/${FAMILIES[$i]}.tbl" >>"$tmp/hits.tsv"
done
LC_ALL=C sort -t $'\t' -k1,1 -k3,3g -k4,4gr -k2,2 "$tmp/hits.tsv" | LC_ALL=C awk -F '\t' '$1 != last { print; last = $1 }' \
  >"$tmp/best.tsv"

# Clusters at 30 % identity over 80 % of both sequences (the same on any thread count; the rows'
# order is not, so they are sorted).
mmseqs easy-cluster "$tmp/all.fasta" "$tmp/clu" "$tmp/mmseqs" --min-seq-id 0.3 -c 0.8 --threads 2 -v 1 >/dev/null ||
  die "mmseqs easy-cluster failed (run it by hand with -v 3 to see why)"
LC_ALL=C sort "$tmp/clu_cluster.tsv" >"$tmp/clusters.tsv"

# Everything in one table, in accession order: id, residues, label, E-value, cluster, split.
LC_ALL=C awk -F '\t' -v seed="$SEED" -v ratio="$RATIO" -v families="${FAMILIES[*]}" -v out="$tmp" '
  BEGIN {
    for (c = 32; c < 127; ++c) ord[sprintf("%c", c)] = c
    nf = split(families, fam, " ")
    for (i = 1; i <= nf; ++i) rank[fam[i]] = i
  }
  # A seeded key of a string: MINSTD rounds (x = 48271 x mod 2^31 - 1); every product under 2^53.
  function key(s,   h, i) {
    h = (seed * 7919 + 1) % 2147483647
    for (i = 1; i <= length(s); ++i) h = (h * 48271 + ord[substr(s, i, 1)]) % 2147483647
    for (i = 0; i < 4; ++i) h = (h * 48271) % 2147483647
    return h
  }
  FILENAME == out "/best.tsv" { label[$1] = $2; evalue[$1] = $3; next }
  FILENAME == out "/clusters.tsv" { cluster[$2] = $1; next }
  /^>/ { id = substr($1, 2); next }
  {
    ids[++n] = id; len[id] = length($0); seq[id] = $0
    if (!(id in cluster)) { print "no cluster for " id > "/dev/stderr"; exit 1 }
    c = cluster[id]
    l = (id in label) ? label[id] : "none"
    # A cluster s stratum: its members family (the first in the list when they differ).
    if (!(c in stratum) || (l != "none" && (stratum[c] == "none" || rank[l] < rank[stratum[c]]))) stratum[c] = l
    members[c, l]++
  }
  END {
    for (c in stratum) {
      size = members[c, stratum[c]]
      total[stratum[c]] += size
      printf "%s\t%010d\t%s\t%d\n", stratum[c], key(c), c, size > (out "/strata.tsv")
    }
    close(out "/strata.tsv")
    # In key order, each cluster goes to the split furthest below its share of the stratum.
    name[1] = "test"; share[1] = 0.2; name[2] = "validation"; share[2] = 0.2; name[3] = "train"; share[3] = 0.6
    cmd = "LC_ALL=C sort -t \"\t\" -k1,1 -k2,2 -k3,3 " out "/strata.tsv"
    while ((cmd | getline line) > 0) {
      split(line, f, "\t")
      if (f[1] != prev) { got[1] = got[2] = got[3] = 0; prev = f[1] }
      best = 1
      for (s = 2; s <= 3; ++s) if (share[s] * total[f[1]] - got[s] > share[best] * total[f[1]] - got[best]) best = s
      got[best] += f[4]
      split_of[f[3]] = name[best]
    }
    close(cmd)
    for (k = 1; k <= n; ++k) {
      id = ids[k]
      l = (id in label) ? label[id] : "none"
      printf "%s\t%d\t%s\t%s\t%s\t%s\t%010d\t%s\n", id, len[id], l, (id in evalue) ? evalue[id] : "-", cluster[id],
             split_of[cluster[id]], key(id), seq[id] > (out "/joined.tsv")
    }
  }' "$tmp/best.tsv" "$tmp/clusters.tsv" "$tmp/all.fasta"
LC_ALL=C sort -t $'\t' -k1,1 "$tmp/joined.tsv" >"$tmp/sorted.tsv"

{
  printf 'id\tresidues\tlabel\tevalue\tcluster\tsplit\n'
  cut -f 1-6 "$tmp/sorted.tsv"
} >"$tmp/sequences.tsv"
to_csv() { LC_ALL=C awk -F '\t' 'BEGIN { print "id,protein,label" } { printf "%s,%s,%s\n", $1, $8, $3 }'; }
for s in train validation test; do
  # Every family sequence of the split's clusters, and RATIO times as many "none" (smallest keys).
  families_in=$(LC_ALL=C awk -F '\t' -v s="$s" '$6 == s && $3 != "none"' "$tmp/sorted.tsv" | wc -l)
  {
    LC_ALL=C awk -F '\t' -v s="$s" '$6 == s && $3 != "none"' "$tmp/sorted.tsv"
    LC_ALL=C awk -F '\t' -v s="$s" '$6 == s && $3 == "none"' "$tmp/sorted.tsv" | LC_ALL=C sort -t $'\t' -k7,7 -k1,1 |
      LC_ALL=C awk -v n="$((RATIO * families_in))" 'NR <= n'
  } | LC_ALL=C sort -t $'\t' -k1,1 | to_csv >"$tmp/$s.csv"
done
LC_ALL=C awk -F '\t' '$6 == "test"' "$tmp/sorted.tsv" | to_csv >"$tmp/test_all.csv"
LC_ALL=C awk -F '\t' '$6 == "train" { printf ">%s\n%s\n", $1, $8 }' "$tmp/sorted.tsv" >"$tmp/mlm_train.fasta"
LC_ALL=C awk -F '\t' '$6 == "validation"' "$tmp/sorted.tsv" | LC_ALL=C sort -t $'\t' -k7,7 -k1,1 |
  LC_ALL=C awk -F '\t' -v n="$MLM_VALIDATION" 'NR <= n' | LC_ALL=C sort -t $'\t' -k1,1 |
  LC_ALL=C awk -F '\t' '{ printf ">%s\n%s\n", $1, $8 }' >"$tmp/mlm_validation.fasta"

for f in "${files[@]}"; do mv "$tmp/$f" "$OUT/$f"; done
echo "$stamp" >"$OUT/.stamp"
count() { LC_ALL=C awk -F, 'NR > 1 { n[$3]++ } END { for (l in n) printf "%s %d, ", l, n[l] }' "$1" | sed 's/, $//'; }
for s in train validation test test_all; do
  echo "protein_families.sh: $OUT/$s.csv: $(($(wc -l <"$OUT/$s.csv") - 1)) ($(count "$OUT/$s.csv"))" >&2
done
echo "protein_families.sh: $OUT/mlm_train.fasta: $(grep -c '^>' "$OUT/mlm_train.fasta")," \
     "mlm_validation.fasta: $(grep -c '^>' "$OUT/mlm_validation.fasta") sequences;" \
     "$(cut -f1 "$tmp/clusters.tsv" | uniq | wc -l) clusters" >&2
