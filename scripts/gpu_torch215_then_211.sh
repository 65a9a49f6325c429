#!/usr/bin/env bash
# The last device call of the torch 2.15 sequence (docs/install.md, "torch 2.15 on the device machine"): gathers the last
# part, unpacks torch 2.15, runs the GPU suite on it (image NCCL 2.28.9), the inner-NCCL test file with
# the carried NCCL 2.30.7, then the suite on the image's torch 2.11, and the 1-rank overhead benchmark
# while BUDGET (seconds, default 500) allows. A 2.15 failure never stops the 2.11 run. Logs go to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
T=/tmp/t215; R=/tmp/res; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
BUDGET=${BUDGET:-500}; t0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
pack() { tar -czf $OUT/res.tgz -C $R . 2>/dev/null; }
clean() { rm -rf build; find python -name '_C*.so' -delete; }
ok215=0
{ bash scripts/torch_parts.sh gather .parts && bash scripts/torch_parts.sh install $T && touch /tmp/ok215; } 2>&1 | tee $OUT/install.log
[ -f /tmp/ok215 ] && ok215=1
echo "== install: ok215=$ok215 after $(( $(date +%s) - t0 )) s" | tee -a $OUT/install.log
if [ $ok215 = 1 ]; then
  bash scripts/torch_parts.sh nccl $T image
  clean
  PYTHONPATH=$T FRNCCL_SKIP_BENCH=1 timeout $(( $(left) - 170 )) bash scripts/gpu_check.sh $R/t215 2>&1 | tee $OUT/t215.log
  echo "== t215 rc ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s" | tee -a $OUT/t215.log; pack
  if [ $(left) -gt 230 ]; then
    bash scripts/torch_parts.sh nccl $T carried 2>&1 | tee $OUT/t215c.log
    PYTHONPATH=$T timeout 60 python3 -m pytest test/gpu/test_gpu_inner_nccl.py -v -rA -p no:cacheprovider 2>&1 | tee -a $OUT/t215c.log
    echo "== t215c rc ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s" | tee -a $OUT/t215c.log
    bash scripts/torch_parts.sh nccl $T image
  fi
fi
clean
FRNCCL_SKIP_BENCH=1 timeout $(( $(left) - 10 )) bash scripts/gpu_check.sh $R/t211 2>&1 | tee $OUT/t211.log
echo "== t211 rc ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s" | tee -a $OUT/t211.log; pack
if [ $(left) -gt 60 ]; then
  timeout $(( $(left) - 5 )) python3 scripts/bench_overhead.py --mode gpu --world 1 2>&1 | tee $OUT/bench211.log
  echo "== bench211 rc ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s" | tee -a $OUT/bench211.log
fi
pack; echo "== all done at $(( $(date +%s) - t0 )) s"
