#!/usr/bin/env bash
# Commands that only print or check (config, plan, help, the version) do not start MPI: with Open MPI told to use a
# point-to-point layer that does not exist (OMPI_MCA_pml), MPI_Init fails, yet each of them succeeds and prints what
# it should. The control, `megatrain train`, which does start MPI, must fail under the same setting (else the
# setting proves nothing and the test fails).
# usage: no_mpi_commands.sh MEGATRAIN_BIN SOURCE_DIR
set -uo pipefail
bin=${1:?megatrain binary}
src=${2:?source dir}
cd "$src" || exit 1
fail() { echo "no_mpi_commands: $*"; exit 1; }
export OMPI_MCA_pml=no_such_pml
check() {  # expected-text command...
  local want=$1; shift
  local out
  out=$("$bin" "$@" 2>&1) || fail "megatrain $* failed with MPI unusable: $(tail -3 <<<"$out")"
  grep -q -- "$want" <<<"$out" || fail "megatrain $*: no '$want' in: $(head -3 <<<"$out")"
  echo "no_mpi_commands: megatrain $*: ok without MPI"
}
check "megatrain " --version
check "Usage" --help
check "Usage" train --help
check "Usage" convert import -h
check "num_layers" config --config configs/quickstart.yaml
check "" plan --config configs/quickstart.yaml --world-size 1
# `megatrain` alone: the missing subcommand is a usage error (non-zero), but not an MPI one
out=$("$bin" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -qi "subcommand" <<<"$out" || fail "megatrain alone: rc $rc: $(head -3 <<<"$out")"
echo "no_mpi_commands: megatrain (no arguments): the usage error without MPI"
# the control: a command that starts MPI fails under this setting
if timeout 120 "$bin" train --config configs/quickstart-mock.yaml --set training.train_iters=1 >/dev/null 2>&1; then
  fail "megatrain train succeeded with OMPI_MCA_pml=$OMPI_MCA_pml: the setting does not break MPI_Init here"
fi
echo "no_mpi_commands: ok"
