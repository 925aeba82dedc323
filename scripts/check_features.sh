#!/usr/bin/env bash
# Checks that every package selection resolves the features of the `train` build for the
# dependencies it shares with it (cargo resolves features per selection: a difference makes
# `cargo test -p <crate>` compile candle and its dependencies a second time). Run by .ci/run;
# on a failure, add the crates it lists to crates/workspace-hack/Cargo.toml with the features
# shown for the `train` build.
set -euo pipefail
cd "$(dirname "$0")/.."
feats() { cargo tree --offline "$@" -f "{p} {f}" --prefix none 2>/dev/null | sed 's/ (\*)//' | awk '{print $1"@"$2, $3}' | sort -u; }
run=$(mktemp) sel=$(mktemp)
trap 'rm -f "$run" "$sel"' EXIT
feats -p lowbit-cli -e normal,build > "$run"
status=0
for p in --workspace -p\ lowbit-optim -p\ lowbit-model -p\ lowbit-data -p\ lowbit-train -p\ lowbit-reproduce -p\ lowbit-cli; do
  # shellcheck disable=SC2086
  feats $p -e normal,build,dev > "$sel"
  differ=$(join -j1 "$run" "$sel" | awk '$2 != $3')
  if [ -n "$differ" ]; then
    echo "cargo test $p resolves other features than the train build (crate, train build's, this selection's):"
    echo "$differ"
    status=1
  fi
done
[ $status = 0 ] && echo "one feature set: every package selection matches the train build"
exit $status
