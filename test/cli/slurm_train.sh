#!/usr/bin/env bash
# End-to-end test of scripts/slurm_train.sbatch on a real one-node Slurm cluster started here:
# munged, slurmctld and slurmd (Debian's slurm-wlm 22.05 and munge) run from a scratch directory
# with their own key, socket, ports, state and spool, as root. Then, on the CPU backend, 2 tasks
# started by the script's `srun --mpi=pmix`:
#   job 1 trains configs/ci/tiny-llama.yaml; `scancel --signal=USR1` reaches the tasks mid-run ->
#         checkpoint at iteration N, the job COMPLETED with exit code 0:0;
#   job 2 (the same sbatch line) resumes from iteration N, is stopped the same way at M > N;
#   job 3 trains 1..M without interruption: its losses must equal jobs 1 + 2's bit for bit.
# Skipped (exit 77) only when Slurm cannot be installed or started: not root, or no slurm-wlm /
# munge and apt-get cannot install them. scripts/run_tests.sh installs them.
#   usage: slurm_train.sh MEGATRAIN_BIN SOURCE_DIR
set -euo pipefail
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
src=$(cd "$2" && pwd)
export PATH=$PATH:/usr/sbin:/sbin

skip() {
  echo "SKIPPED: slurm_train: $*"
  exit 77
}
fail() {
  echo "FAILED: slurm_train: $*" >&2
  exit 1
}

[[ $(id -u) == 0 ]] || skip "needs root to start munged, slurmctld and slurmd (CI runs as root)"
tools=(munged munge slurmctld slurmd sbatch scancel scontrol sinfo srun)
have_all() {
  local t
  for t in "${tools[@]}"; do command -v "$t" >/dev/null || return 1; done
}
if ! have_all; then
  echo "slurm_train: installing slurmctld slurmd slurm-client munge"
  "$src/scripts/apt_install_missing.sh" slurmctld slurmd slurm-client munge || skip "cannot install slurm-wlm and munge"
  have_all || skip "slurm-wlm / munge installed but a tool is missing (${tools[*]})"
fi

T=$(mktemp -d /tmp/mt-slurm.XXXXXX)
chmod 711 "$T"
export SLURM_CONF=$T/slurm.conf
started=0
cleanup() {
  local rc=$?
  if ((started)); then scancel --full --quiet "--name=megatrain" 2>/dev/null || true; fi
  for p in slurmd slurmctld munged; do
    [[ -s $T/$p.pid ]] && kill "$(cat "$T/$p.pid")" 2>/dev/null || true
  done
  sleep 1
  if ((rc != 0 && rc != 77)); then
    echo "--- logs (kept in $T):"
    tail -n 30 "$T"/slurmctld.log "$T"/slurmd.log "$T"/work/slurm-*.out "$T"/work/runs/megatrain-*/train.log 2>/dev/null || true
  else
    rm -rf "$T"
  fi
}
trap cleanup EXIT

# --- munge: its own key and socket.
mkdir -p "$T/state" "$T/spool" "$T/work"
head -c 1024 /dev/urandom >"$T/munge.key"
chmod 400 "$T/munge.key"
munged --key-file="$T/munge.key" --socket="$T/munge.sock" --pid-file="$T/munged.pid" \
  --log-file="$T/munged.log" --seed-file="$T/munged.seed" --force ||
  skip "munged does not start ($(tail -n 1 "$T/munged.log" 2>/dev/null))"
munge -S "$T/munge.sock" -n | unmunge -S "$T/munge.sock" >/dev/null || skip "munge credentials do not round-trip"

# --- slurm: one node (this machine, 2 CPUs), no cgroups, no accounting, ports from the pid.
host=$(hostname -s)
port=$((20000 + ($$ % 10000) * 2))
cat >"$T/slurm.conf" <<EOF
ClusterName=megatrain-ci
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
MailProg=/bin/true
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=ci Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -f "$SLURM_CONF" || skip "slurmctld does not start ($(tail -n 1 "$T/slurmctld.log" 2>/dev/null))"
slurmd -f "$SLURM_CONF" -N "$host" || skip "slurmd does not start ($(tail -n 1 "$T/slurmd.log" 2>/dev/null))"
started=1
for ((i = 0; i < 60; i++)); do
  [[ $(sinfo -h -o %T 2>/dev/null) == idle ]] && break
  sleep 0.5
done
[[ $(sinfo -h -o %T 2>/dev/null) == idle ]] || skip "the node did not come up: $(sinfo 2>&1 | tail -n 1)"
echo "slurm_train: one-node cluster up ($host, ports $port/$((port + 1)), $T)"

# --- the jobs, submitted from a directory laid out like the repository (configs/, runs/).
cd "$T/work"
ln -s "$src/configs" configs
export MEGATRAIN_BIN=$bin OMP_NUM_THREADS=1
# The script's #SBATCH lines are for GPU nodes; this cluster has one node of 2 CPUs and no GPUs.
sb=(sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --time=10
  "$src/scripts/slurm_train.sbatch" configs/ci/tiny-llama.yaml
  --set training.train_iters=100000 --set logging.log_interval=1 --set checkpoint.save_interval=0)

state() { scontrol show job "$1" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
exit_code() { scontrol show job "$1" | grep -o ' ExitCode=[0-9:]*' | cut -d= -f2; }
last_iter() { [[ -s $1 ]] && grep -o '"iteration": [0-9]*, "consumed' "$1" | tail -n 1 | grep -o '[0-9]*' || echo 0; }
# wait_iter JOB METRICS N: until the metrics file records iteration >= N (the job must still run).
wait_iter() {
  local i
  for ((i = 0; i < 600; i++)); do
    (($(last_iter "$2") >= $3)) && return 0
    case $(state "$1") in PENDING | RUNNING | CONFIGURING) ;; *) fail "job $1 ended ($(state "$1")) before iteration $3" ;; esac
    sleep 0.2
  done
  fail "job $1 did not reach iteration $3 in 120 s"
}
# wait_end JOB SECONDS: until the job has ended.
wait_end() {
  local end=$((SECONDS + $2))
  while ((SECONDS < end)); do
    case $(state "$1") in PENDING | RUNNING | CONFIGURING | COMPLETING) sleep 0.2 ;; *) return 0 ;; esac
  done
  fail "job $1 still running after $2 s"
}
# run_until_signal METRICS MIN_ITER [--set ...]: submits, signals USR1 at MIN_ITER, checks exit 0.
run_until_signal() {
  local metrics=$1 min=$2
  shift 2
  local job
  job=$("${sb[@]}" --set logging.metrics_file="$metrics" "$@")
  wait_iter "$job" "$metrics" "$min"
  scancel --signal=USR1 "$job"
  wait_end "$job" 60
  [[ $(state "$job") == COMPLETED && $(exit_code "$job") == 0:0 ]] ||
    fail "job $job after SIGUSR1: state $(state "$job"), exit code $(exit_code "$job") (want COMPLETED 0:0)"
  echo "$job"
}

job1=$(run_until_signal runs/job1.jsonl 3)
log1=runs/megatrain-$job1/train.log
n=$(last_iter runs/job1.jsonl)
grep -q "SIGUSR1 received at iteration $n: checkpoint saved, exiting" "$log1" ||
  fail "job $job1: no 'SIGUSR1 received at iteration $n' in $log1"
[[ $(cat runs/ci-tiny-llama/latest) == iter_$(printf %07d "$n") && -f runs/ci-tiny-llama/iter_$(printf %07d "$n")/DONE ]] ||
  fail "job $job1: runs/ci-tiny-llama/latest is not the complete checkpoint of iteration $n"
grep -q 'parallel mesh: 2 ranks' "$log1" || fail "job $job1 did not run on 2 ranks"
echo "slurm_train: job $job1 stopped by SIGUSR1 at iteration $n, checkpoint saved, exit 0"

job2=$(run_until_signal runs/job2.jsonl $((n + 2)))
log2=runs/megatrain-$job2/train.log
m=$(last_iter runs/job2.jsonl)
grep -q "resumed from runs/ci-tiny-llama/iter_$(printf %07d "$n") at iteration $n" "$log2" ||
  fail "job $job2 did not resume from iteration $n ($log2)"
first2=$(grep -m 1 -o '"iteration": [0-9]*, "consumed' runs/job2.jsonl | grep -o '[0-9]*')  # -m 1, not | head: no SIGPIPE under pipefail
((first2 == n + 1)) || fail "job $job2's first iteration is $first2, want $((n + 1))"
echo "slurm_train: job $job2 resumed at iteration $((n + 1)), stopped by SIGUSR1 at $m, exit 0"

# Reference: iterations 1..m in one job (exit_interval), its own checkpoint directory.
job3=$("${sb[@]}" --set logging.metrics_file=runs/ref.jsonl --set training.exit_interval="$m" \
  --set checkpoint.dir=runs/ref)
wait_end "$job3" 300
[[ $(state "$job3") == COMPLETED && $(exit_code "$job3") == 0:0 ]] || fail "reference job $job3: $(state "$job3") $(exit_code "$job3")"
losses() { cat "$@" | grep -o '"iteration": [0-9]*, "consumed_samples": [0-9]*, "loss": [^,]*'; }
d=$(diff <(losses runs/job1.jsonl runs/job2.jsonl) <(losses runs/ref.jsonl) || true)
[[ -z $d && $(losses runs/ref.jsonl | wc -l) == "$m" ]] || fail "the interrupted jobs' losses differ from the uninterrupted run's: $(head -n 4 <<<"$d")"
echo "slurm_train: jobs $job1 + $job2 (1..$n, $((n + 1))..$m) give the uninterrupted job $job3's losses bit for bit"
echo "PASSED: slurm_train"
