#!/usr/bin/env bash
# The last device calls of the torch 2.15 sequence (docs/install.md, "torch 2.15 on the device machine").
#   PHASE=215 (the call that carries the last part): gathers it, unpacks torch 2.15, says whether it imports
#             against the image's NCCL 2.28.9 (it did not: docs/install.md), then runs the GPU suite and the
#             1-rank overhead benchmark (frnccl against plain nccl2) on the carried NCCL 2.30.7, while
#             BUDGET (seconds) allows.
#   PHASE=211 (the next call, same warm machine): the suite and the same benchmark on the image's torch
#             2.11, the baseline.
#   PHASE=all (default): both in one call, where its limit allows.
#   BENCH=0 skips the benchmark (a rerun of the suite after a fix).
# A 2.15 failure never stops the 2.11 run. Logs go to $OUT; results to $OUT/res-PHASE.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
PHASE=${PHASE:-all}
T=/tmp/t215; R=/tmp/res; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
BUDGET=${BUDGET:-500}; t0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
pack() { tar -czf $OUT/res-$PHASE.tgz -C $R . 2>/dev/null; }
clean() { rm -rf build; find python -name '_C*.so' -delete; }
bench() {  # $1: tag; the rest: the environment's prefix
  local tag=$1; shift
  if [ "${BENCH:-1}" != 0 ] && [ $(left) -gt 60 ]; then
    env "$@" timeout $(( $(left) - 5 )) python3 scripts/bench_overhead.py --mode gpu --world 1 \
      --json $R/bench$tag.json 2>&1 | tee $OUT/bench$tag.log
    echo "== bench$tag rc ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s" | tee -a $OUT/bench$tag.log
  fi
}
if [ $PHASE = 215 ] || [ $PHASE = all ]; then
  ok215=0
  { bash scripts/torch_parts.sh gather .parts && bash scripts/torch_parts.sh install $T && touch /tmp/ok215; } 2>&1 | tee $OUT/install.log
  [ -f /tmp/ok215 ] && ok215=1
  echo "== install: ok215=$ok215 after $(( $(date +%s) - t0 )) s" | tee -a $OUT/install.log
  if [ $ok215 = 1 ]; then
    # torch 2.15 does not import against the image's NCCL 2.28.9 (libtorch_cuda binds ncclCommResume at
    # load: docs/install.md); said here in one line each run, then everything runs on the carried 2.30.7.
    bash scripts/torch_parts.sh nccl $T image
    PYTHONPATH=$T python3 -c 'import torch' 2>&1 | tail -1 | sed 's/^/== import torch with the image NCCL: /' | tee -a $OUT/install.log
    bash scripts/torch_parts.sh nccl $T carried
    clean
    PYTHONPATH=$T FRNCCL_SKIP_BENCH=1 timeout $(( $(left) - 180 )) bash scripts/gpu_check.sh $R/t215 2>&1 | tee $OUT/t215.log
    echo "== t215 rc ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s" | tee -a $OUT/t215.log; pack
    bench 215 PYTHONPATH=$T
    clean
  fi
fi
if [ $PHASE = 211 ] || [ $PHASE = all ]; then
  clean
  FRNCCL_SKIP_BENCH=1 timeout $(( $(left) - 120 )) bash scripts/gpu_check.sh $R/t211 2>&1 | tee $OUT/t211.log
  echo "== t211 rc ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s" | tee -a $OUT/t211.log; pack
  bench 211 PYTHONUNBUFFERED=1
fi
pack; echo "== all done at $(( $(date +%s) - t0 )) s"
