#!/usr/bin/env bash
# The layer rule of docs/ARCHITECTURE.md, checked: every `#include "..."` of a project header in src/,
# cuda/ and data_tools/ points at a file of the same layer or of a layer listed above it in the
# document's table; src/model calls no communicator; cuda/ includes nothing of src/ but src/core.
# usage: layers.sh MEGATRAIN_BIN SOURCE_DIR   (the binary is not used; ctest passes it to every cli test)
set -uo pipefail
src=${2:?source dir}
cd "$src" || exit 1
doc=docs/ARCHITECTURE.md
# "| 5 | runtime | src/runtime | ..." rows between the markers -> "rank folder" lines.
table=$(sed -n '/<!-- layers: begin/,/<!-- layers: end/p' "$doc" |
  awk -F'|' '$2 ~ /^ *[0-9]+ *$/ { gsub(/ /, "", $2); n = split($4, f, ","); for (i = 1; i <= n; i++) { gsub(/^ +| +$/, "", f[i]); print $2, f[i] } }')
[ -n "$table" ] || { echo "layers: no layer table found in $doc"; exit 1; }
# The layer of a path: the longest folder (or file) prefix in the table.
layer_of() {
  local path=$1 best=0 bestlen=0 rank folder
  while read -r rank folder; do
    if [[ $path == "$folder" || $path == "$folder"/* ]] && ((${#folder} > bestlen)); then best=$rank bestlen=${#folder}; fi
  done <<<"$table"
  echo "$best"
}
bad=0 checked=0
while IFS= read -r file; do
  from=$(layer_of "$file")
  ((from == 0)) && continue
  while IFS=: read -r line inc; do
    # An include is a path from the repository root or from src/ (both are include directories).
    if [ -f "src/$inc" ]; then target="src/$inc"; elif [ -f "$inc" ]; then target=$inc; else continue; fi
    to=$(layer_of "$target")
    checked=$((checked + 1))
    if ((to > from)); then
      echo "layers: $file:$line includes \"$inc\" (layer $to) from layer $from: an upward include (see $doc)"
      bad=$((bad + 1))
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" | sed -E 's/^([0-9]+):[^"]*"([^"]+)".*/\1:\2/')
done < <(git ls-files src cuda data_tools 2>/dev/null || find src cuda data_tools -type f)
# Model code never calls a communicator: every exchange goes through src/parallel.
while IFS= read -r hit; do
  echo "layers: $hit: model code calls a communicator; move the exchange into a function of src/parallel"
  bad=$((bad + 1))
done < <(grep -nE '(->|\.)(all_reduce|all_gather|reduce_scatter|broadcast|send|recv|batch_p2p|all_to_all|alltoall)[a-z_]*\(' -r src/model)
echo "layers: $checked project includes checked, $bad violation(s)"
((bad == 0))
