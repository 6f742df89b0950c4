#!/usr/bin/env bash
# Starts megatrain under mpirun, one process per GPU.
#   scripts/launch_mpirun.sh -n 4 -- train --config configs/llama-1b.yaml [--set key=value ...]
#   scripts/launch_mpirun.sh -n 16 --hostfile hosts --per-node 8 -- train --config configs/llama-7b.yaml
# Options (before --):
#   -n N             ranks in all (= GPUs)
#   --per-node K     ranks per node (default: N on one node); several nodes need --hostfile or -H
#   --hostfile FILE, -H HOSTS   passed to mpirun
#   --mpi ARG        one more mpirun argument (repeatable), e.g. --mpi --report-bindings
#   --no-bind        do not pin each rank's threads to the cores next to its GPU
#   --dry-run        print the mpirun command, start nothing
# Each rank takes GPU (local rank mod visible GPUs): megatrain reads OMPI_COMM_WORLD_LOCAL_RANK
# (SLURM_LOCALID under srun). This script pins the rank's threads to the CPUs local to that GPU
# (the PCI device's local_cpulist, through taskset; skipped when unknown or not allowed), sets
# OMP_NUM_THREADS to cores / ranks per node unless set, keeps NVLink multicast off
# (NCCL_NVLS_ENABLE=0) unless set, and exports NCCL_*, MT_*, MEGATRAIN_*, CUDA_*, OMP_*, UCX_*,
# OPENBLAS_*, PATH and LD_LIBRARY_PATH to every rank (-x), also on other nodes. As root it allows
# Open MPI to run as root. On one node (no --hostfile / -H) it lets the ranks outnumber the cores
# (--oversubscribe: the CPU backend, tests) and, when there is no ssh, starts them without it
# (OMPI_MCA_plm=isolated unless set). The binary: $MEGATRAIN_BIN, else build/megatrain, else megatrain on PATH.
# Stopping: Ctrl-C or SIGTERM to a bare mpirun makes Open MPI pass SIGTERM to the ranks and kill them 1 s later
# (odls_base_sigkill_timeout), before a checkpoint is written. Here mpirun runs in a process group of its own (the
# terminal's Ctrl-C reaches this script only) and the first Ctrl-C / SIGTERM / SIGUSR1 to this script goes on as
# SIGUSR1 to this node's ranks (else to mpirun): every rank finishes the iteration, saves a checkpoint (checkpoint.dir)
# and exits 0, and so does this script. A second Ctrl-C / SIGTERM aborts the job (SIGTERM to mpirun). Should this
# script die without a word (SIGKILL), a watcher it leaves stops the job the same way.
set -euo pipefail

self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
repo="$(cd "$(dirname "$self")/.." && pwd)"

# Internal: run on each rank by mpirun as `launch_mpirun.sh --rank-exec BIN ARGS...`.
rank_exec() {
  local bin=$1
  shift
  local lr=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-0}}
  if [[ ${MT_LAUNCH_BIND:-1} == 1 ]] && command -v taskset >/dev/null && command -v nvidia-smi >/dev/null; then
    local -a gpus=()
    if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
      IFS=, read -ra gpus <<<"$CUDA_VISIBLE_DEVICES"
    else
      mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true)
    fi
    if ((${#gpus[@]} > 0)); then
      local dev=${gpus[lr % ${#gpus[@]}]} bus cpus=""
      bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "${dev// /}" 2>/dev/null | head -1 || true)
      bus=${bus,,}
      bus=${bus// /}
      ((${#bus} >= 12)) && bus=${bus: -12}  # 00000000:19:00.0 -> 0000:19:00.0 (the sysfs name)
      [[ -n $bus && -r /sys/bus/pci/devices/$bus/local_cpulist ]] && cpus=$(</sys/bus/pci/devices/"$bus"/local_cpulist)
      if [[ -n $cpus ]] && taskset -c "$cpus" true 2>/dev/null; then
        exec taskset -c "$cpus" "$bin" "$@"
      fi
    fi
  fi
  exec "$bin" "$@"
}
if [[ ${1:-} == --rank-exec ]]; then
  shift
  rank_exec "$@"
fi

usage() { sed -n '2,26p' "$self" | sed 's/^# \{0,1\}//'; }
die() {
  echo "launch_mpirun.sh: $*" >&2
  exit 2
}

np="" per_node="" dry=0
hosts=() extra=()
while (($#)); do
  case $1 in
    -n | -np) np=${2:?-n needs a number}; shift 2 ;;
    --per-node) per_node=${2:?--per-node needs a number}; shift 2 ;;
    --hostfile) hosts+=(--hostfile "${2:?--hostfile needs a file}"); shift 2 ;;
    -H | --host) hosts+=(--host "${2:?-H needs hosts}"); shift 2 ;;
    --mpi) extra+=("${2:?--mpi needs an argument}"); shift 2 ;;
    --no-bind) export MT_LAUNCH_BIND=0; shift ;;
    --dry-run) dry=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (megatrain's own arguments go after --); see --help" ;;
  esac
done
[[ $np =~ ^[1-9][0-9]*$ ]] || die "-n N (the number of ranks, one per GPU) is required"
(($#)) || die "nothing to run: give megatrain's arguments after --, e.g. -- train --config X.yaml"
[[ -z $per_node || $per_node =~ ^[1-9][0-9]*$ ]] || die "--per-node must be a positive number, not '$per_node'"

bin=${MEGATRAIN_BIN:-}
if [[ -z $bin ]]; then
  if [[ -x $repo/build/megatrain ]]; then
    bin=$repo/build/megatrain
  else
    bin=$(command -v megatrain || true)
  fi
fi
[[ -n $bin && -x $bin ]] || die "megatrain binary not found (looked at \$MEGATRAIN_BIN, $repo/build/megatrain, PATH): build it first"
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export MT_LAUNCHED_BY=launch_mpirun.sh  # the ranks know a stop reaches them as SIGUSR1: no start-up warning about it
if [[ $(id -u) == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
fi
ranks_here=${per_node:-$np}
((ranks_here <= np)) || ranks_here=$np
cores=$(nproc 2>/dev/null || echo 1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cores / ranks_here > 0 ? cores / ranks_here : 1))}

# --stdin none: mpirun runs in a background process group (below), with no terminal input to pass on
cmd=(mpirun -np "$np" --bind-to none --stdin none "${hosts[@]}")
if ((${#hosts[@]} == 0)); then
  ((np > cores)) && cmd+=(--oversubscribe)
  command -v ssh >/dev/null || command -v rsh >/dev/null || export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated}
fi
[[ -n $per_node ]] && cmd+=(--map-by "ppr:$per_node:node")
while read -r v; do cmd+=(-x "$v"); done < <(compgen -e | grep -E '^(NCCL_|MT_|MEGATRAIN_|CUDA_|OMP_|UCX_|OPENBLAS_)' || true)
cmd+=(-x PATH)
[[ -n ${LD_LIBRARY_PATH:-} ]] && cmd+=(-x LD_LIBRARY_PATH)
cmd+=("${extra[@]}" "$self" --rank-exec "$bin" "$@")

echo "+ ${cmd[*]}" >&2
((dry)) && exit 0
set -m  # job control: mpirun gets a process group of its own, out of reach of the terminal's Ctrl-C
"${cmd[@]}" &
job=$!
set +m
# A stop goes as SIGUSR1 to this node's ranks (mpirun's children running the binary; megatrain stops every rank after
# the iteration in which any one of them got a stop signal), or to mpirun when none runs here (the ranks on other
# nodes): it forwards SIGUSR1 where it forwards signals (Debian 12's Open MPI 4.1.4 does; Ubuntu 24.04's 4.1.6 did
# not on our GPU machine).
bin_real=$(readlink -f "$bin")
stop_job() {
  local c sent=0
  for c in $(cat /proc/"$job"/task/*/children 2>/dev/null); do  # a rank still starting (not yet megatrain): skipped
    [[ $(readlink /proc/"$c"/exe 2>/dev/null) == "$bin_real" ]] && kill -USR1 "$c" 2>/dev/null && sent=1
  done
  ((sent)) || kill -USR1 "$job" 2>/dev/null || true
}
stops=0
on_stop() {
  if ((stops++ == 0)); then
    echo "launch_mpirun.sh: $1: stopping after the current iteration (each rank saves a checkpoint when" \
      "checkpoint.dir is set); Ctrl-C or SIGTERM again aborts the job" >&2
    stop_job
  elif [[ $1 != SIGUSR1 ]]; then
    echo "launch_mpirun.sh: $1 again: aborting the job" >&2
    kill -TERM "$job" 2>/dev/null || true
  fi
}
trap 'on_stop SIGINT' INT
trap 'on_stop SIGTERM' TERM
trap 'on_stop SIGUSR1' USR1
# Should this script die without a word (SIGKILL), a watcher stops the job the same way (with a checkpoint).
(
  trap '' INT TERM USR1
  while kill -0 $$ 2>/dev/null && kill -0 "$job" 2>/dev/null; do sleep 1; done
  kill -0 "$job" 2>/dev/null && echo "launch_mpirun.sh: the launcher is gone: stopping the job" >&2 && stop_job
) &
# A trapped signal ends `wait` early; once mpirun has ended, `wait` gives its exit status.
set +e
while kill -0 "$job" 2>/dev/null; do wait "$job"; done
wait "$job"
