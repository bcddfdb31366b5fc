#!/usr/bin/env bash
# bench_vs_torch.sh: flowrun against eager and torch.compile'd PyTorch and JAX on the same models, data and CPU
# threads.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/bench_vs_torch.sh [options]

Times training steps (zero-grad + forward + loss + backward + optimizer step) of the bench models
(configs/bench/*.yaml; their PyTorch twins in scripts/bench/torch_models.py, their JAX twins in
scripts/bench/jax_models.py) in flowrun (`flowrun time`), eager PyTorch, torch.compile'd PyTorch and JAX
(the whole step one jax.jit-compiled function), alternating them round by round at each thread count, then
races gpt-tiny to a KJV validation loss. Prints one markdown report and writes it, with every raw
measurement, to bench-results/<date>/.

PyTorch comes from PyPI into .venv-bench (created on first use); where that fails, Debian's python3-torch
with /usr/bin/python3 (the report says which). JAX (CPU) and optax come from PyPI into .venv-bench too;
where that fails, JAX is left out with a note in the report. flowrun must be built first
(scripts/setup.sh); the environment variable FLOWRUN_BIN names another flowrun binary.

Options:
  --models LIST     Comma-separated, from mlp,cnn,resnet,gpt-tiny (default: all four).
  --threads LIST    Comma-separated thread counts (default: 2,1).
  --rounds N        Alternating rounds per model and thread count (default: 3).
  --steps N         Timed steps per run (default: 30).
  --warmup N        Untimed steps before them (default: 5; torch.compile and XLA compile here).
  --ttl-target X    Time-to-loss target, validation nats/byte (default: 2.0).
  --ttl-max-steps N Give up the race after N steps (default: 3000).
  --ttl-eval-every N Evaluate every N steps in the race (default: 50; 20 validation batches of 16).
  --no-ttl          Skip the time-to-loss race.
  --no-compile      Skip torch.compile (eager PyTorch only).
  --no-jax          Skip JAX.
  --precision P     fp32 (default) or bf16: flowrun with precision.dtype=bf16 against PyTorch under
                    torch.autocast("cpu", dtype=torch.bfloat16) and JAX with its matmuls and convolutions
                    in bf16 (parameters fp32), for the step times and the race.
  --quick           Smoke test: 1 round of 3 steps after 1 warm-up, race to loss 3.0 evaluating every 10.
  --out DIR         Results directory (default: bench-results/<date>).
  --help            Show this help and exit.
USAGE
}

die_usage() {
  echo "bench_vs_torch.sh: $*" >&2
  echo "Try 'scripts/bench_vs_torch.sh --help'." >&2
  exit 2
}

need_int() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die_usage "$1 needs a positive integer, got '$2'"; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MODELS="mlp,cnn,resnet,gpt-tiny"
THREADS="2,1"
ROUNDS=3
STEPS=30
WARMUP=5
TTL=1
TTL_TARGET=2.0
TTL_MAX_STEPS=3000
EVAL_EVERY=50
COMPILE=1
JAX=1
PRECISION=fp32
OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --help | -h) usage; exit 0 ;;
    --precision)
      [[ "${2:-}" == fp32 || "${2:-}" == bf16 ]] || die_usage "--precision is fp32 or bf16, got '${2:-}'"
      PRECISION=$2
      shift 2
      ;;
    --models | --threads | --rounds | --steps | --warmup | --ttl-target | --ttl-max-steps | --ttl-eval-every | --out)
      [[ $# -ge 2 ]] || die_usage "$1 needs a value"
      case "$1" in
        --models) MODELS="$2" ;;
        --threads) THREADS="$2" ;;
        --rounds) need_int "$1" "$2"; ROUNDS="$2" ;;
        --steps) need_int "$1" "$2"; STEPS="$2" ;;
        --warmup) [[ "$2" =~ ^[0-9]+$ ]] || die_usage "--warmup needs a non-negative integer, got '$2'"; WARMUP="$2" ;;
        --ttl-target) [[ "$2" =~ ^[0-9]*\.?[0-9]+$ && ! "$2" =~ ^0*\.?0*$ ]] ||
                        die_usage "--ttl-target needs a positive number, got '$2'"; TTL_TARGET="$2" ;;
        --ttl-max-steps) need_int "$1" "$2"; TTL_MAX_STEPS="$2" ;;
        --ttl-eval-every) need_int "$1" "$2"; EVAL_EVERY="$2" ;;
        --out) OUT="$2" ;;
      esac
      shift 2 ;;
    --no-ttl) TTL=0; shift ;;
    --no-compile) COMPILE=0; shift ;;
    --no-jax) JAX=0; shift ;;
    --quick) ROUNDS=1; STEPS=3; WARMUP=1; TTL_TARGET=3.0; EVAL_EVERY=10; shift ;;
    *) die_usage "unknown argument '$1'" ;;
  esac
done

declare -A CONFIG=([mlp]=configs/bench/mlp.yaml [cnn]=configs/bench/cnn.yaml [resnet]=configs/bench/resnet.yaml
                   [gpt-tiny]=configs/bench/gpt_tiny.yaml)
IFS=, read -r -a MODEL_LIST <<<"$MODELS"
IFS=, read -r -a THREAD_LIST <<<"$THREADS"
[[ ${#MODEL_LIST[@]} -gt 0 ]] || die_usage "--models is empty"
for m in "${MODEL_LIST[@]}"; do
  [[ -n "${CONFIG[$m]:-}" ]] || die_usage "unknown model '$m' (choose from mlp,cnn,resnet,gpt-tiny)"
done
[[ ${#THREAD_LIST[@]} -gt 0 ]] || die_usage "--threads is empty"
for t in "${THREAD_LIST[@]}"; do need_int --threads "$t"; done

FLOWRUN="${FLOWRUN_BIN:-$ROOT/build/apps/flowrun}"
[[ -x "$FLOWRUN" ]] || { echo "bench_vs_torch.sh: $FLOWRUN not found: build flowrun first (scripts/setup.sh)" >&2; exit 1; }

log() { echo "[bench $(date +%H:%M:%S)] $*" >&2; }

# ---- PyTorch: the PyPI wheel in .venv-bench, else Debian's python3-torch ----
VENV="$ROOT/.venv-bench"
TORCH_SOURCE=""
has_torch() { "$1" -c 'import torch, numpy, h5py' >/dev/null 2>&1; }
setup_torch() {
  if [[ -x "$VENV/bin/python" ]] && has_torch "$VENV/bin/python"; then
    PY="$VENV/bin/python"; TORCH_SOURCE="PyPI wheel in .venv-bench"; return
  fi
  local t0=$SECONDS
  log "creating $VENV and installing torch numpy h5py (several GB from PyPI; minutes)"
  if python3 -m venv "$VENV"; then
    if curl -sfI --max-time 10 https://download.pytorch.org/whl/cpu/ >/dev/null 2>&1; then
      "$VENV/bin/pip" install --quiet torch --index-url https://download.pytorch.org/whl/cpu &&
        "$VENV/bin/pip" install --quiet numpy h5py && TORCH_SOURCE="CPU wheel from download.pytorch.org"
    fi
    if [[ -z "$TORCH_SOURCE" ]] && "$VENV/bin/pip" install --quiet torch numpy h5py; then
      TORCH_SOURCE="PyPI wheel in .venv-bench"
    fi
  fi
  if [[ -n "$TORCH_SOURCE" ]] && has_torch "$VENV/bin/python"; then
    PY="$VENV/bin/python"; log "installed in $((SECONDS - t0)) s"; return
  fi
  if has_torch /usr/bin/python3; then
    PY=/usr/bin/python3
    TORCH_SOURCE="Debian python3-torch with /usr/bin/python3 (PyPI torch could not be installed)"
    log "PyPI torch unavailable: falling back to $TORCH_SOURCE"; return
  fi
  echo "bench_vs_torch.sh: no PyTorch: pip install into $VENV failed and /usr/bin/python3 has no torch" \
       "(apt-get install python3-torch python3-h5py libopenblas0-openmp)" >&2
  exit 1
}
setup_torch
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)')"

NOTES=()

# ---- JAX: the PyPI CPU wheel and optax in .venv-bench, whichever Python runs PyTorch ----
JPY="$VENV/bin/python"
JAX_VERSION=""
has_jax() { [[ -x "$JPY" ]] && "$JPY" -c 'import jax, optax, numpy, h5py' >/dev/null 2>&1; }
setup_jax() {
  if ! has_jax; then
    log "installing jax optax into $VENV (PyPI)"
    if [[ -x "$JPY" ]] || python3 -m venv "$VENV"; then
      "$VENV/bin/pip" install --quiet jax optax numpy h5py >&2 || log "pip install jax optax failed"
    fi
  fi
  if has_jax; then
    JAX_VERSION="$("$JPY" -c 'import jax; print(jax.__version__)')"
  else
    JAX=0
    NOTES+=("JAX could not be installed into .venv-bench (pip install jax optax): it is left out")
    log "JAX unavailable: leaving it out"
  fi
}
[[ $JAX == 1 ]] && setup_jax

# ---- data: flowrun converts its datasets into its data cache, which the PyTorch and JAX twins read too ----
export FLOWRUN_DATA="${FLOWRUN_DATA:-${XDG_CACHE_HOME:-$HOME/.cache}/flowrun}"
mkdir -p "$FLOWRUN_DATA"
for d in fashion_mnist fashion_mnist_3x32 kjv; do
  [[ -f "$FLOWRUN_DATA/$d.h5" ]] || "$FLOWRUN" data "$d" >&2
done

OUT="${OUT:-bench-results/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
RUNS="$OUT/runs.jsonl"
: >"$RUNS"
: >"$OUT/sgemm.jsonl"
: >"$OUT/fma.jsonl"
: >"$OUT/ttl.jsonl"

HAVE_TIME=1
if ! "$FLOWRUN" time --help >/dev/null 2>&1; then
  HAVE_TIME=0
  NOTES+=("this flowrun has no \`time\` verb: its columns are empty")
  log "flowrun has no 'time' verb yet: timing PyTorch only"
fi

# Appends the last line of a command's stdout (a JSON object) to runs.jsonl, tagged with the bench model name,
# the requested thread count, impl and round (flowrun's own "model" and "threads" are kept as reported_*).
record() {
  local model="$1" threads="$2" impl="$3" round="$4" log_file="$5"
  shift 5
  local line
  if OMP_NUM_THREADS=$threads "$@" >"$log_file" 2>&1 && line="$(tail -n 1 "$log_file")" &&
     jq -e 'type == "object"' >/dev/null 2>&1 <<<"$line"; then
    jq -c --arg model "$model" --argjson threads "$threads" --arg impl "$impl" --argjson round "$round" \
      '. + {reported_model: .model, reported_threads: .threads, model: $model, threads: $threads, impl: $impl,
            round: $round}' <<<"$line" >>"$RUNS"
    jq -r --arg m "$model" --arg t "$threads" --arg impl "$impl" \
      '"\($m) \($t)T \($impl): \(.median_step_ms * 100 | round / 100) ms"' <<<"$line" >&2
  else
    log "$impl failed ($*); see $log_file"
  fi
}

# ---- sgemm ceiling, at each thread count ----
# sgemm_probe T FILTER [JQ-EXTRA]: flowrun_bench's sgemm benchmarks matching FILTER at T threads, appended to
# sgemm.jsonl (JQ-EXTRA: more fields, e.g. the model and round of a per-round probe).
sgemm_probe() {
  local t=$1 filter=$2 extra=${3:-"{}"}
  [[ -x build/tests/flowrun_bench ]] || return 0
  OMP_NUM_THREADS=$t build/tests/flowrun_bench --benchmark_filter="$filter" --benchmark_format=json 2>/dev/null |
    jq -c --argjson t "$t" --argjson extra "$extra" '.benchmarks[] | {probe: (if (.name | startswith("BM_sgemm_ceiling_onednn"))
      then "oneDNN matmul (flowrun_bench)" else "OpenBLAS (flowrun_bench)" end), threads: $t, gflops: .GFLOPS} + $extra' \
    >>"$OUT/sgemm.jsonl" || log "flowrun_bench sgemm probe failed"
}
# fma_probe T: the FMA ceiling at T threads (flowrun_bench's BM_fma_peak), appended to fma.jsonl: what the
# sgemm probes reach of the machine.
fma_probe() {
  [[ -x build/tests/flowrun_bench ]] || return 0
  OMP_NUM_THREADS=$1 build/tests/flowrun_bench --benchmark_filter=fma_peak --benchmark_format=json 2>/dev/null |
    jq -c --argjson t "$1" '.benchmarks[] | {threads: $t, gflops: .GFLOPS}' >>"$OUT/fma.jsonl" ||
    log "flowrun_bench FMA probe failed"
}
for t in "${THREAD_LIST[@]}"; do
  OMP_NUM_THREADS=$t "$PY" scripts/bench/sgemm_probe.py --threads "$t" >>"$OUT/sgemm.jsonl"
  sgemm_probe "$t" sgemm
  fma_probe "$t"
done

# ---- step times: flowrun, eager, compiled, jax, alternating ----
FR_PREC=(--set "precision.dtype=$PRECISION")
TORCH_PREC=()
[[ $PRECISION == bf16 ]] && TORCH_PREC=(--bf16)
for m in "${MODEL_LIST[@]}"; do
  for t in "${THREAD_LIST[@]}"; do
    for ((r = 1; r <= ROUNDS; r++)); do
      tag="$OUT/log-$m-${t}T-r$r"
      if [[ $HAVE_TIME == 1 ]]; then
        # The sgemm rate right before this round's flowrun run: on a shared host the machine's speed drifts
        # between minutes, and each round's share of the sgemm rate compares the two under one condition.
        sgemm_probe "$t" sgemm_ceiling_onednn "{\"model\": \"$m\", \"round\": $r}"
        # A step at exactly t threads, as the peers' are: train.adapt_threads would try a few at t - 1.
        record "$m" "$t" flowrun "$r" "$tag-flowrun.txt" "$FLOWRUN" time "${CONFIG[$m]}" --steps "$STEPS" \
          --warmup "$WARMUP" --profile 0 --set "train.threads=$t" --set train.adapt_threads=false \
          "${FR_PREC[@]}" --json
      fi
      record "$m" "$t" eager "$r" "$tag-eager.txt" "$PY" scripts/bench/torch_step.py "$m" --threads "$t" \
        --steps "$STEPS" --warmup "$WARMUP" --data-dir "$FLOWRUN_DATA" "${TORCH_PREC[@]}"
      if [[ $COMPILE == 1 ]]; then
        record "$m" "$t" compiled "$r" "$tag-compiled.txt" "$PY" scripts/bench/torch_step.py "$m" --compile \
          --threads "$t" --steps "$STEPS" --warmup "$((WARMUP > 2 ? WARMUP : 2))" --data-dir "$FLOWRUN_DATA" \
          "${TORCH_PREC[@]}"
      fi
      if [[ $JAX == 1 ]]; then
        # XLA compiles the step in the first warm-up step.
        record "$m" "$t" jax "$r" "$tag-jax.txt" "$JPY" scripts/bench/jax_step.py "$m" --threads "$t" \
          --steps "$STEPS" --warmup "$((WARMUP > 1 ? WARMUP : 1))" --data-dir "$FLOWRUN_DATA" "${TORCH_PREC[@]}"
      fi
    done
  done
done

# ---- time to loss: gpt-tiny on KJV, at the first thread count ----
if [[ $TTL == 1 ]]; then
  t="${THREAD_LIST[0]}"
  log "time to loss $TTL_TARGET: flowrun"
  OMP_NUM_THREADS=$t "$PY" scripts/bench/flowrun_ttl.py --target "$TTL_TARGET" --run-dir "$OUT/ttl-flowrun" \
    --threads "$t" -- "$FLOWRUN" train configs/bench/gpt_tiny.yaml --no-progress --set "train.threads=$t" \
    --set "train.steps=$TTL_MAX_STEPS" --set "train.eval_every=$EVAL_EVERY" --set "train.log_every=$EVAL_EVERY" \
    --set "train.run_dir=$OUT/ttl-flowrun" "${FR_PREC[@]}" >>"$OUT/ttl.jsonl" || log "flowrun time-to-loss failed"
  modes=(eager)
  [[ $COMPILE == 1 ]] && modes+=(compiled)
  [[ $JAX == 1 ]] && modes+=(jax)
  for mode in "${modes[@]}"; do
    log "time to loss $TTL_TARGET: $mode"
    cmd=("$PY" scripts/bench/time_to_loss.py)
    [[ $mode == compiled ]] && cmd+=(--compile)
    [[ $mode == jax ]] && cmd=("$JPY" scripts/bench/jax_time_to_loss.py)
    OMP_NUM_THREADS=$t "${cmd[@]}" "${TORCH_PREC[@]}" --target "$TTL_TARGET" --threads "$t" \
      --eval-every "$EVAL_EVERY" --eval-batches 20 --max-steps "$TTL_MAX_STEPS" --data-dir "$FLOWRUN_DATA" \
      2>"$OUT/log-ttl-$mode.txt" | tail -n 1 | jq -c '. + {impl: .mode}' >>"$OUT/ttl.jsonl" ||
      log "$mode time-to-loss failed; see $OUT/log-ttl-$mode.txt"
  done
fi

# ---- report ----
notes_json="$(printf '%s\n' "${NOTES[@]+"${NOTES[@]}"}" | jq -R . | jq -cs 'map(select(length > 0))')"
models_json="$(printf '%s\n' "${MODEL_LIST[@]}" | jq -R . | jq -cs .)"
jq -n --arg date "$(date -u +%Y-%m-%dT%H:%MZ)" --arg cpu "$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)" \
  --arg cpus "$(nproc)" --arg flowrun "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  --arg torch "$TORCH_VERSION" --arg torch_source "$TORCH_SOURCE" --arg jax "$JAX_VERSION" --argjson steps "$STEPS" \
  --argjson warmup "$WARMUP" --argjson rounds "$ROUNDS" --argjson notes "$notes_json" \
  --argjson models "$models_json" --arg precision "$PRECISION" \
  '{precision: $precision, date: $date, cpu: $cpu, cpus: $cpus, flowrun: $flowrun, torch: $torch, torch_source: $torch_source,
    jax: $jax, steps: $steps, warmup: $warmup, rounds: $rounds, notes: $notes, models: $models}' >"$OUT/meta.json"
"$PY" scripts/bench/report.py "$OUT" | tee "$OUT/report.md"
log "raw results and logs in $OUT/"
