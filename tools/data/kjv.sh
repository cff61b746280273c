#!/bin/sh
# Makes data/kjv/kjv.txt, the King James Bible as plain text for a character-level LM, from
# Debian's bible-kjv package (its `bible` command). It does not download anything.
#
# What the text is: one line per verse, verse numbers stripped, and each chapter's heading
# ("Genesis 1", "Exodus 12", ...) kept on a line of its own before its verses: the headings are
# the book structure a reader sees, and cost little (1,189 short lines of 34,669). The blank lines
# `bible` prints around headings are dropped (a text file's empty lines are not items anyway).
# ASCII only; 4,150,830 bytes, 31,102 verses. The first lines:
#   Genesis 1
#   In the beginning God created the heaven and the earth.
#
# Usage: tools/data/kjv.sh [OUT_DIR]   (default data/kjv; run from the repository root)
# Idempotent: an existing complete kjv.txt is left as it is; the file is written to a temporary
# name and renamed into place, so an interrupted run leaves no half file.
set -eu

out_dir=${1:-data/kjv}
out="$out_dir/kjv.txt"

if ! command -v bible >/dev/null 2>&1; then
  echo "kjv.sh: the \`bible\` command is missing: install Debian's bible-kjv package" \
       "(sudo apt-get install bible-kjv), or run tools/bootstrap.sh train kjv_char_gpt, which does" >&2
  exit 1
fi

if [ -s "$out" ] && [ "$(wc -l <"$out")" -eq 32291 ]; then
  echo "kjv.sh: $out is already made" >&2
  exit 0
fi

mkdir -p "$out_dir"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
# Verse lines look like "  12 And God said, ...": strip the indent and the number. Heading lines
# ("Genesis 1") are kept as they are; blank lines go.
bible -l 100000 gen1:1-rev22:21 |
  awk '/^ +[0-9]+ / { sub(/^ +[0-9]+ /, ""); print; next }
       NF          { print }' >"$tmp"

lines=$(wc -l <"$tmp")
if [ "$lines" -ne 32291 ]; then
  echo "kjv.sh: bible printed $lines lines of text, expected 32291 (31,102 verses and 1,189" \
       "chapter headings): is bible-kjv complete? (dpkg -L bible-kjv)" >&2
  exit 1
fi
mv "$tmp" "$out"
trap - EXIT
echo "kjv.sh: wrote $out ($(wc -c <"$out") bytes, $lines lines)" >&2
