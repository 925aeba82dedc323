#!/usr/bin/env bash
# Put the shared offline corpus (C4-format shards of real English text, ~18M T5 tokens; see
# ../shared/data/README.md beside the repository) into data/local/corpus/ (git-ignored), where the `h200` scale of
# `train reproduce` reads it:
#   data.train      = ["data/local/corpus/en-train.*.json.gz"]
#   data.validation = ["data/local/corpus/en-validation.*.json.gz"]
#
# usage: scripts/link_shared_corpus.sh [--copy] [SRC] [DEST]
#   SRC   default ../shared/data/corpus: the shared/ folder beside the repository root
#   DEST  default data/local/corpus (relative to the repository root)
#   --copy  copy the files (~21 MB) instead of symlinking them: needed when the folder must
#           travel to another machine (e.g. the device tool's `carry: ["data/local/corpus"]`,
#           where symlinks arrive dangling).
set -euo pipefail
copy=0
if [[ "${1:-}" == "--copy" ]]; then copy=1; shift; fi
if [[ "${1:-}" == -* ]]; then echo "usage: $0 [--copy] [SRC] [DEST]" >&2; exit 2; fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="${1:-$root/../shared/data/corpus}"
dest="${2:-$root/data/local/corpus}"
shopt -s nullglob
files=("$src"/en-train.*.json.gz "$src"/en-validation.*.json.gz)
if (( ${#files[@]} == 0 )); then
    echo "no en-train.*.json.gz / en-validation.*.json.gz files in $src" >&2
    exit 1
fi
mkdir -p "$dest"
src_abs="$(cd "$src" && pwd)"
for f in "${files[@]}"; do
    name="$(basename "$f")"
    rm -f "$dest/$name"
    if (( copy )); then
        cp "$src_abs/$name" "$dest/$name"
    else
        ln -s "$src_abs/$name" "$dest/$name"
    fi
done
echo "$([[ $copy == 1 ]] && echo copied || echo linked) ${#files[@]} files from $src_abs into $dest"
