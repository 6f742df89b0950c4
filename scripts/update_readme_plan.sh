#!/usr/bin/env bash
# Regenerates the `megatrain plan` excerpt in README.md from the binary, or checks that it is current.
# The excerpt is the fenced block right after the README line
#   <!-- plan-excerpt: plan --config configs/llama-3b.yaml --world-size 8 ... -->
# and is that command's output, with the pipeline schedule's lines (`stage N: F0.0 ...`) cut to
# 96 characters + " ..." when longer than 100.
#   usage: scripts/update_readme_plan.sh [--check] [MEGATRAIN_BIN]   (default build/megatrain)
#   --check: change nothing; exit 1 with a diff when the README differs from the binary's output.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
[[ ${1:-} == --check ]] && { check=1; shift; }
bin=${1:-build/megatrain}
[[ -x $bin ]] || { echo "update_readme_plan.sh: $bin not found or not executable: build it first" >&2; exit 2; }

marker=$(grep -m1 -n '^<!-- plan-excerpt: .* -->$' README.md || true)
[[ -n $marker ]] || { echo "update_readme_plan.sh: README.md has no '<!-- plan-excerpt: ARGS -->' line" >&2; exit 2; }
line=${marker%%:*}
args=$(sed -e 's/^.*<!-- plan-excerpt: //' -e 's/ -->$//' <<<"${marker#*:}")
[[ $(sed -n "$((line + 1))p" README.md) == '```' ]] || { echo "update_readme_plan.sh: README.md line $((line + 1)) must open the excerpt's fence (\`\`\`)" >&2; exit 2; }
end=$(awk -v s=$((line + 2)) 'NR >= s && /^```$/ { print NR; exit }' README.md)
[[ -n $end ]] || { echo "update_readme_plan.sh: the excerpt after README.md line $line is never closed" >&2; exit 2; }

tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.plan"' EXIT
# shellcheck disable=SC2086  # the marker's arguments are words without quoting
"$bin" $args >"$tmp.plan" || { echo "update_readme_plan.sh: '$bin $args' failed" >&2; exit 1; }
{
  head -n "$((line + 1))" README.md
  awk '{ if (/^stage [0-9]+: / && length($0) > 100) print substr($0, 1, 96) " ..."; else print }' "$tmp.plan"
  tail -n "+$end" README.md
} >"$tmp"

if cmp -s "$tmp" README.md; then
  echo "README.md: the plan excerpt matches '$bin $args'"
  exit 0
fi
if ((check)); then
  echo "README.md: the plan excerpt (after line $line) differs from '$bin $args' (run scripts/update_readme_plan.sh to rewrite it):" >&2
  diff README.md "$tmp" >&2 || true
  exit 1
fi
cat "$tmp" >README.md
echo "README.md: plan excerpt rewritten from '$bin $args'"
