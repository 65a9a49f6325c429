#!/usr/bin/env bash
# Builds frnccl against this machine's CUDA torch and runs the GPU checks:
# the GPU test suite (test/gpu), the overhead benchmark (separate jobs, and jobs taking turns), and the
# wrapper's cost per op.
#   bash scripts/gpu_check.sh [RESULTS_DIR]     (default: ./gpu-results)
# Writes logs and results into RESULTS_DIR. With one GPU, the tests that need two ranks skip, and so do
# the benchmarks that compare NCCL jobs (overhead, turns).
# FRNCCL_SKIP_TESTS=1 / FRNCCL_SKIP_BENCH=1 leave out one half; BENCHES picks benchmarks (default
# "overhead turns wrapper"); BENCH_ARGS passes options to bench_overhead.py.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=$(mkdir -p "${1:-gpu-results}" && cd "${1:-gpu-results}" && pwd)
PY=${PYTHON:-python3}
BENCHES=" ${BENCHES:-overhead turns wrapper} "
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}   # never use NVLink multicast
status=0

{
  date -u
  nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not available"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
} > "$RESULTS/environment.txt" 2>&1
cat "$RESULTS/environment.txt"

GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
if [ "$GPUS" -lt 2 ]; then
  for two_gpu_bench in overhead turns; do
    if [[ "$BENCHES" == *" $two_gpu_bench "* ]]; then
      echo "== skipping the $two_gpu_bench benchmark: it needs 2 GPUs, this machine has $GPUS"
      BENCHES=${BENCHES// $two_gpu_bench / }
    fi
  done
fi

echo "== building frnccl (log: $RESULTS/build.log)"
start=$(date +%s)
if ! MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PY" -m pip install --no-build-isolation --no-deps --no-index -e . > "$RESULTS/build.log" 2>&1; then
  echo "build FAILED"; tail -40 "$RESULTS/build.log"; exit 1
fi
echo "built in $(( $(date +%s) - start )) s; $("$PY" -c 'import torch, fr_backend._native as n; print("CUDA markers:", n.native().cuda_built(), "settling by torch'"'"'s watchdog:", n.native().torch_watchdog_settling_built())')"

if [ "${FRNCCL_SKIP_TESTS:-0}" != 1 ]; then
  echo "== GPU test suite"
  "$PY" -m pytest test/gpu -v -rA -p no:cacheprovider --junitxml="$RESULTS/gpu-tests.xml" 2>&1 | tee "$RESULTS/gpu-tests.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [[ "$BENCHES" == *" overhead "* ]] && [ "${FRNCCL_SKIP_BENCH:-0}" != 1 ]; then
  echo "== overhead benchmark"
  "$PY" scripts/bench_overhead.py --mode gpu ${BENCH_ARGS:-} 2>&1 | tee "$RESULTS/bench_overhead.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ "$BENCHES" == *" turns "* ]] && [ "${FRNCCL_SKIP_BENCH:-0}" != 1 ]; then
  echo "== turns benchmark: every configuration of the goals in its own processes, one run"
  "$PY" scripts/bench_overhead.py --mode gpu --turns --rounds 40 --json "$RESULTS/bench_turns.json" 2>&1 \
    | tee "$RESULTS/bench_turns.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ "$BENCHES" == *" wrapper "* ]] && [ "${FRNCCL_SKIP_BENCH:-0}" != 1 ]; then
  for device in cuda cpu; do
    echo "== wrapper cost per op, $device tensors (FakeProcessGroup inside)"
    "$PY" scripts/bench_wrapper.py --device "$device" --configs default,stacks=none,buf=0 \
      --json "$RESULTS/bench_wrapper_$device.json" 2>&1 | tee "$RESULTS/bench_wrapper_$device.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi
echo "== done (status $status); results in $RESULTS"
exit $status
