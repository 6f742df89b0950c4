#!/usr/bin/env bash
# `megatrain plan` on every mixture-of-experts config of configs/ (the benchmark configs on 1 rank, the plan-only
# ones on the world size their header names): each must pass validation and print the MoE section with its
# total and active parameters.
# usage: moe_plan.sh MEGATRAIN_BIN SOURCE_DIR
set -uo pipefail
bin=${1:?megatrain binary}
src=${2:?source dir}
cd "$src" || exit 1
fail() { echo "moe_plan: $*"; exit 1; }
check() {  # config world total active (as plan prints them)
  local out
  out=$("$bin" plan --config "$1" --world-size "$2" 2>&1) || fail "$1 on $2 ranks: $out"
  grep -q "Parameters: $3 (.*) in the model, $4 (.*) active per token" <<<"$out" ||
    fail "$1: expected $3 parameters, $4 active: $(grep Parameters: <<<"$out")"
  grep -q "^Mixture of experts: " <<<"$out" || fail "$1: no MoE section"
  echo "moe_plan: $1 on $2 ranks: $3 parameters, $4 active"
}
check configs/moe-8x-top2.yaml 1 "1.15 B" "361.4 M"    # torch_moe.py: 1154 M, 361 M
check configs/moe-64x-top8.yaml 1 "1.31 B" "248.8 M"   # torch_moe.py: 1306 M, 249 M
check configs/plan/mixtral-8x7b.yaml 64 "46.70 B" "12.88 B"
check configs/plan/qwen3-30b-a3b.yaml 16 "30.53 B" "3.35 B"
check configs/plan/deepseek-v3-like.yaml 512 "674.84 B" "41.36 B"
# `megatrain config` without --world-size checks a plan-only layout at the smallest world size it fits, and says so
for c in "configs/plan/mixtral-8x7b.yaml 64" "configs/plan/qwen3-30b-a3b.yaml 16" "configs/plan/deepseek-v3-like.yaml 512"; do
  set -- $c
  err=$("$bin" config --config "$1" 2>&1 >/dev/null) || fail "megatrain config $1: $err"
  grep -q "checked for $2 ranks, the smallest world size it fits" <<<"$err" || fail "megatrain config $1: $err"
done
echo "moe_plan: ok"
