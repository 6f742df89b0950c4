#!/usr/bin/env bash
# Every command of README.md's ```bash blocks runs as written: each one (continuation lines joined)
# runs with bash in a scratch directory laid out like the repository root (build/ -> the binaries'
# folder, configs/ and scripts/ -> the sources', data/ with the fetched corpus and tokenizer, an
# empty runs/), with Open MPI's variables removed from the environment (the command must carry
# what it needs). Commands whose comment is marked are not run, and the test says so:
#   # (GPU)     needs a GPU: a `build/megatrain train` or `scripts/launch_mpirun.sh -n N -- train`
#               line is still validated with `megatrain config` (and --world-size N);
#   # (Slurm)   needs a Slurm cluster: `sbatch --nodes=K scripts/slurm_train.sbatch CONFIG ARGS`
#               is validated with `megatrain config` for K x the script's ntasks-per-node ranks;
#               test/cli/slurm_train.sh runs the script on a real one-node Slurm;
#   # (set-up)  installs and builds (scripts/quickstart.sh, scripts/run_tests.sh).
# Commands reading data/corpus or data/tokenizers need scripts/fetch_text_data.sh (run by
# scripts/run_tests.sh): without those files they are skipped (reported), unless
# MEGATRAIN_REQUIRE_TOKENIZER=1 (run_tests.sh), which makes that a failure. `generate --checkpoint
# runs/quickstart` needs the quickstart's checkpoint: the test makes one first (the quickstart's
# preprocessing, then 2 iterations of configs/quickstart.yaml).
# Also checks that the README's `megatrain plan` excerpt is the binary's output
# (scripts/update_readme_plan.sh --check).
#   usage: readme_commands.sh MEGATRAIN_BIN SOURCE_DIR
set -euo pipefail
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
src=$(cd "$2" && pwd)
bindir=$(dirname "$bin")
[[ -x $bindir/megatrain-data ]] || { echo "FAILED: $bindir/megatrain-data not built" >&2; exit 1; }

for v in $(compgen -e | grep -E '^(OMPI_|MEGATRAIN_BIN$)' || true); do unset "$v"; done

S=$(mktemp -d /tmp/mt-readme.XXXXXX)
trap 'rm -rf "$S"' EXIT
ln -s "$bindir" "$S/build"
ln -s "$src/configs" "$S/configs"
ln -s "$src/scripts" "$S/scripts"
mkdir -p "$S/data" "$S/runs"
have_text=1
for d in corpus tokenizers; do
  if [[ -d $src/data/$d ]]; then ln -s "$src/data/$d" "$S/data/$d"; else have_text=0; fi
done
[[ -s $src/data/corpus/bible_kjv.jsonl && -s $src/data/tokenizers/gpt2/encoder.json && -s $src/data/tokenizers/gpt2/vocab.bpe ]] || have_text=0

# The commands, one per line (continuations joined), in README order.
mapfile -t cmds < <(awk '
  /^```bash$/ { inb = 1; next }
  /^```/ { inb = 0; next }
  inb {
    line = $0
    if (cont != "") { sub(/^[ \t]+/, "", line); line = cont " " line }
    if (line ~ /\\$/) { sub(/[ \t]*\\$/, "", line); cont = line; next }
    cont = ""
    if (line ~ /^[ \t]*$/ || line ~ /^[ \t]*#/) next
    print line
  }' "$src/README.md")
((${#cmds[@]} >= 10)) || { echo "FAILED: found only ${#cmds[@]} commands in README.md's bash blocks" >&2; exit 1; }

failed=0 ran=0 skipped=0
fail() {
  echo "FAILED: $*" >&2
  failed=$((failed + 1))
}
# run_in_root CMD: runs CMD with bash in the scratch root; returns its status, shows its tail.
run_in_root() {
  local out=$S/out.txt t0=$SECONDS rc=0
  (cd "$S" && timeout 300 bash -c "$1") >"$out" 2>&1 || rc=$?
  if ((rc != 0)); then
    tail -n 15 "$out" >&2
  fi
  echo "    ($((SECONDS - t0)) s, exit $rc)"
  return $rc
}
# A build without the CUDA backend refuses training.device=cuda in `megatrain config`: a (GPU) line that sets it is
# then validated with training.device=auto in its place (everything else as written), and the line says so.
cuda_build=1
(cd "$S" && build/megatrain config --config "$src/configs/ci/tiny-llama.yaml" --set training.device=cuda) >/dev/null 2>&1 ||
  cuda_build=0
gpu_config_args() { ((cuda_build)) && echo "$1" || echo "${1//--set training.device=cuda/--set training.device=auto}"; }
gpu_note() {
  ((cuda_build)) || [[ $1 != *"training.device=cuda"* ]] ||
    echo " (this build has no CUDA backend: checked with training.device=auto)"
}
quickstart_ckpt() {
  [[ -f $S/runs/quickstart/latest ]] && return 0
  echo "  preparing runs/quickstart (the quickstart's preprocessing, 2 iterations of configs/quickstart.yaml)"
  run_in_root "build/megatrain-data preprocess --input data/corpus/bible_kjv.jsonl --json-keys text \
    --tokenizer gpt2-bpe --vocab-file data/tokenizers/gpt2/encoder.json --merge-file data/tokenizers/gpt2/vocab.bpe \
    --append-eod --output-prefix data/quickstart/bible && build/megatrain train --config configs/quickstart.yaml \
    --set training.train_iters=2 --set optimizer.warmup_iters=1 --set training.eval_iters=1"
}

for cmd in "${cmds[@]}"; do
  mark=$(grep -o '# ([A-Za-z-]*' <<<"$cmd" | head -n 1 | cut -c4- || true)
  body=${cmd%%#*}
  body=${body%"${body##*[![:space:]]}"}
  case $mark in
    GPU)
      skipped=$((skipped + 1))
      if [[ $body =~ ^build/megatrain\ train\ (.*)$ ]]; then
        echo "SKIPPED (GPU), validated with megatrain config$(gpu_note "$body"): $body"
        run_in_root "build/megatrain config $(gpu_config_args "${BASH_REMATCH[1]}") >/dev/null" ||
          fail "$body: its config is refused"
      elif [[ $body =~ ^scripts/launch_mpirun.sh\ -n\ ([0-9]+)\ --\ train\ (.*)$ ]]; then
        echo "SKIPPED (GPU), validated with megatrain config --world-size ${BASH_REMATCH[1]}$(gpu_note "$body"): $body"
        run_in_root "build/megatrain config $(gpu_config_args "${BASH_REMATCH[2]}") --world-size ${BASH_REMATCH[1]} >/dev/null" ||
          fail "$body: its config is refused"
      else
        echo "SKIPPED (GPU): $body"
      fi
      continue
      ;;
    Slurm)
      skipped=$((skipped + 1))
      if [[ $body =~ ^sbatch\ --nodes=([0-9]+)\ scripts/slurm_train.sbatch\ (.*)$ ]]; then
        per_node=$(grep -o '^#SBATCH --ntasks-per-node=[0-9]*' "$src/scripts/slurm_train.sbatch" | grep -o '[0-9]*$')
        world=$((BASH_REMATCH[1] * per_node))
        echo "SKIPPED (Slurm cluster), validated with megatrain config --world-size $world: $body"
        run_in_root "build/megatrain config --config ${BASH_REMATCH[2]} --world-size $world >/dev/null" ||
          fail "$body: its config is refused"
      else
        echo "SKIPPED (Slurm cluster): $body"
      fi
      continue
      ;;
    set-up)
      skipped=$((skipped + 1))
      echo "SKIPPED (set-up: installs and builds): $body"
      continue
      ;;
  esac
  # (data/mycorpus* is what the README's preprocess command makes from data/corpus)
  if [[ $body == *data/corpus/* || $body == *data/tokenizers/* || $body == *data/mycorpus* ||
        $body == *runs/quickstart[/\ ]* ]] && ((!have_text)); then
    if [[ ${MEGATRAIN_REQUIRE_TOKENIZER:-0} == 1 ]]; then
      fail "$body: needs data/corpus and data/tokenizers (scripts/fetch_text_data.sh)"
    else
      skipped=$((skipped + 1))
      echo "SKIPPED (no data/corpus or data/tokenizers: run scripts/fetch_text_data.sh): $body"
    fi
    continue
  fi
  if [[ $body == *runs/quickstart[/\ ]* ]]; then
    quickstart_ckpt || { fail "could not make runs/quickstart for: $body"; continue; }
  fi
  echo "RUN: $body"
  ran=$((ran + 1))
  run_in_root "$cmd" || fail "$body"
done

echo "plan excerpt:"
"$src/scripts/update_readme_plan.sh" --check "$bin" || fail "README.md's plan excerpt is not the binary's output"

echo "readme_commands: $ran run, $skipped skipped, $failed failed"
((failed == 0)) || exit 1
echo "PASSED: readme_commands"
