#!/usr/bin/env bash
# The GPU checks of issue 12, as one script for a lent GPU machine (see README "On a GPU"):
# the CUDA tests (compiled Triton rejection kernel against the torch reference, CUDA-graph
# replay against eager passes, the engine's greedy and sampled output on CUDA), then the
# graphs-vs-eager bench and `specctl bench --device cuda`. Each step has its own time limit
# and its own log; a failing step is reported and the next one still runs.
#
#   bash bench/gpu_checks.sh OUT_DIR
#   GPU_CHECKS_SKIP="vocab-demo vocab-demo-widening" bash bench/gpu_checks.sh OUT_DIR   # fewer steps
#
# On an H200 (stop 33): tests 106 s. On an H200 (stop 25): tests 68 s, graphs bench 35 s, wide bench 38 s, narrow bench 122 s,
# about 5 minutes with the machine's start. On an H100 (stop 27, graphs captured ahead at
# engine start): 88, 50, 55 and 155 s, 6.5 minutes held; the limits below leave room.
#
# Needs a python3 with torch (CUDA build), triton, transformers, pytest, pytest-timeout and
# scipy; the project itself runs from this checkout (PYTHONPATH), nothing is installed.
set -u
out=${1:?usage: gpu_checks.sh OUT_DIR}
wide_s=150
narrow_s=200
vocab_s=90
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=160
py=${PYTHON:-python3}
status=0
skip=" ${GPU_CHECKS_SKIP:-} "

step() {  # step NAME SECONDS COMMAND...: runs it with a time limit, logs to OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  if [[ $skip == *" $name "* ]]; then echo "== $name: skipped (GPU_CHECKS_SKIP)"; return; fi
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - start)) s (limit $limit s)"
  tail -n 25 "$out/$name.log"
  [ $rc -eq 0 ] || status=1
}

{
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$py" -c 'import sys, torch, triton, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__,
      "transformers", transformers.__version__, "cuda", torch.version.cuda,
      "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
  nproc
} >"$out/env.log" 2>&1
cat "$out/env.log"

# -o addopts=: one process (the suite's own options ask for pytest-xdist workers)
step cuda-tests 180 "$py" -m pytest -q -rfE -p no:cacheprovider -o addopts= --timeout 120 \
  tests/sampling/test_rejection_kernel_cuda.py tests/sampling/test_gumbel_cuda.py \
  tests/sampling/test_rejection_cases.py -k "cuda or static_pass" \
  tests/model/test_static_pass.py tests/engine/test_cuda_engine.py \
  tests/engine/test_sampling_lossless.py tests/sampling/test_wide_list.py

step graphs-bench 90 "$py" -m bench.graphs_bench --device cuda --concurrency 1,4,16 \
  --repeats 3 --json "$out/graphs.json"

# wide: with transformers beside it (vLLM's peer is its CPU build); narrow: the x30 target is
# ~170 layers, whose eager transformers runs alone would take minutes, so specctl only
step specctl-bench-wide "$wide_s" "$py" -m specctl.cli bench --device cuda --shape wide \
  --repeats 2 --concurrency 1,4,16 --out /tmp/specctl-bench-wide
cp /tmp/specctl-bench-wide/bench.json "$out/bench-wide.json" 2>/dev/null
# sampling at a real vocabulary (V = 151,936, draft = target) and the demo pair's proposal widths
# at T = 1 (top-32, widening to 2,048, the full distribution)
step vocab-bench "$vocab_s" "$py" -m bench.vocab_bench --device cuda --temperatures 0,0.7,1.0 \
  --sparse-top-k 32,0
# the same with the torch paths instead of the Triton kernels (the Gumbel race, the rejection)
SPECCTL_TRITON=0 step vocab-bench-torch "$vocab_s" "$py" -m bench.vocab_bench --device cuda \
  --temperatures 0,0.7,1.0 --sparse-top-k 32,0
step vocab-demo "$vocab_s" "$py" -m bench.vocab_bench --device cuda --pair demo \
  --temperatures 1.0 --sparse-top-k 32,4096 --rounds 60
step vocab-demo-widening "$vocab_s" "$py" -m bench.vocab_bench --device cuda --pair demo \
  --temperatures 1.0 --sparse-top-k 32 --max-listed 2048 --rounds 60
step specctl-bench-narrow "$narrow_s" "$py" -m specctl.cli bench --device cuda --shape narrow \
  --repeats 1 --concurrency 1,4,16 --no-peers --out /tmp/specctl-bench-narrow
cp /tmp/specctl-bench-narrow/bench.json "$out/bench-narrow.json" 2>/dev/null
exit $status
