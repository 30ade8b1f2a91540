#!/usr/bin/env bash
# One GPU session for issue 13: calibrate the GPU, train the accuracy cases, check numerics; results in $OUT.
#
# Usage (from the repository root, on a machine with one CUDA GPU):
#     bash benchmarks/gpu_session.sh [env] [calibrate] [accuracy] [numerics]    # no argument: all four, in order
#
# Writes (at most 8 files, one folder, as the device tool brings back):
#     $OUT/env.txt         device, driver, CUDA, torch, NCCL versions, nvidia-smi, the date
#     $OUT/calibrate.txt   the calibration tables (GEMMs, attention, memory, sustained vs burst, launch)
#     $OUT/calibrated.toml the calibrated cluster profile
#     $OUT/calibrate.json  every raw calibration measurement
#     $OUT/accuracy.txt    predicted vs measured per step and per op group, MFU, memory
#     $OUT/accuracy.json   the same as data
#     $OUT/numerics.txt    pytest of tests/executor/test_executor_cuda.py (CUDA vs CPU reference)
#     $OUT/session.log     stage timings and exit codes
# OUT defaults to out/gpu-session. Stage limits keep the whole session under 10 minutes (one device call);
# SUSTAINED_S (default 60) shortens the sustained-throughput run, ACCURACY_ARGS adds benchmark flags.
# DRY_RUN=1 rehearses on a CPU: no CUDA check, calibration skipped, the accuracy benchmark's --dry-run.
#
# Python: the machine's python3 must have torch with CUDA, numpy, pandas, matplotlib and pytest (the device
# image has them). simpy is installed from wheels in .whl/ when it is missing: fetch it here beforehand with
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl simpy==4.1.2
# and carry .whl with the call (docs/gpu_validation.md).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu-session}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
SUSTAINED_S="${SUSTAINED_S:-60}"
DRY_RUN="${DRY_RUN:-0}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOG="$OUT/session.log"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(env calibrate accuracy numerics)

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }

if ! "$PY" -c "import simpy" 2>/dev/null; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            || { log "pip install from .whl failed"; exit 2; }
        export PYTHONPATH="$PYTHONPATH:/tmp/site"
    else
        log "simpy is missing and .whl/ holds no wheel: download it as this script's header says, carry .whl"
        exit 2
    fi
fi
if [ "$DRY_RUN" != 1 ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    log "no CUDA GPU visible to $PY (torch.cuda.is_available() is False): nothing to measure"
    exit 2
fi

run_stage() {  # name, time limit in seconds, output file, command...
    local name=$1 limit=$2 out=$3
    shift 3
    local start=$SECONDS
    log "stage $name: start (limit ${limit}s) -> $out"
    timeout --kill-after=10 "$limit" "$@" >"$out" 2>&1
    local rc=$?
    log "stage $name: exit $rc after $((SECONDS - start))s"
    tail -n 40 "$out"
    return $rc
}

status=0
for stage in "${stages[@]}"; do
    case "$stage" in
        env)
            {
                echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
                "$PY" -c "from executor.devices import environment, default_device
for k, v in environment(default_device()).items(): print(f'{k}: {v}')"
                nvidia-smi || true
                "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|numpy|triton|nvidia-nccl|simpy) ' || true
            } >"$OUT/env.txt" 2>&1
            log "stage env: written"; cat "$OUT/env.txt" | head -20 ;;
        calibrate)
            if [ "$DRY_RUN" = 1 ]; then log "stage calibrate: skipped (DRY_RUN: needs CUDA)"; continue; fi
            run_stage calibrate 160 "$OUT/calibrate.txt" "$PY" -m executor.cli calibrate --device cuda \
                --sustained-s "$SUSTAINED_S" --out "$OUT/calibrated.toml" --bench-json "$OUT/calibrate.json" \
                || status=1 ;;
        accuracy)
            profile=()
            [ -f "$OUT/calibrated.toml" ] && profile=(--profile "$OUT/calibrated.toml")
            [ "$DRY_RUN" = 1 ] && profile+=(--dry-run)
            # shellcheck disable=SC2086
            run_stage accuracy 290 "$OUT/accuracy.txt" "$PY" benchmarks/gpu_accuracy.py "${profile[@]}" \
                --steps 5 --json "$OUT/accuracy.json" ${ACCURACY_ARGS:-} || status=1 ;;
        numerics)
            run_stage numerics 100 "$OUT/numerics.txt" "$PY" -m pytest -q -p no:cacheprovider \
                tests/executor/test_executor_cuda.py || status=1 ;;
        *)
            log "unknown stage $stage (env, calibrate, accuracy, numerics)"; status=2 ;;
    esac
done
log "session done, exit $status; files: $(ls "$OUT" | tr '\n' ' ')"
exit $status
