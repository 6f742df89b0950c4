#!/usr/bin/env bash
# `megatrain config` and `plan` on a GPU build do not load cuBLAS / cuBLASLt (cuda/cublas_lazy.cpp opens them at their
# first call; loading them costs ~0.4 s of static initializers): the dynamic loader's log (LD_DEBUG=files) of both
# commands names no libcublas. Exit 77 (skipped, with a message) on a CPU-only build, which has no cuBLAS at all.
# usage: lazy_cublas.sh MEGATRAIN_BIN SOURCE_DIR
set -uo pipefail
bin=${1:?megatrain binary}
src=${2:?source dir}
cd "$src" || exit 1
fail() { echo "lazy_cublas: $*"; exit 1; }
syms=$(nm "$bin" 2>/dev/null)
if ! grep -qE " cublasLtMatmul(@|$)" <<<"$syms"; then  # defined (lazy) or undefined (linked): a GPU build
  echo "lazy_cublas: skipped: $bin is a CPU-only build (no cuBLAS calls)"
  exit 77
fi
grep -q libcublas <<<"$(ldd "$bin")" && fail "$bin links cuBLAS at start-up: $(ldd "$bin" | grep libcublas)"
for cmd in "config --config configs/moe-8x-top2.yaml" "plan --config configs/moe-8x-top2.yaml --world-size 1"; do
  log=$(LD_DEBUG=files "$bin" $cmd 2>&1 >/dev/null) || fail "megatrain $cmd failed: $(tail -3 <<<"$log")"
  grep -q "file=libyaml-cpp" <<<"$log" || fail "megatrain $cmd: no loader log (LD_DEBUG=files ignored?)"
  if grep -q "file=libcublas" <<<"$log"; then fail "megatrain $cmd loaded $(grep -o 'file=libcublas[^ ]*' <<<"$log" | sort -u)"; fi
  echo "lazy_cublas: megatrain $cmd: cuBLAS not loaded"
done
echo "lazy_cublas: ok"
