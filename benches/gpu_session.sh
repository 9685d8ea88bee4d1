#!/usr/bin/env bash
# The GPU side of issue 41 on a lent NVIDIA machine that has no cargo, as one short script: the
# release binaries and the GPU parity tests are built on the development machine and carried.
#
#   # on the development machine (burn compiled once with every feature; one command, so that
#   # the binaries and the test binaries share one feature set):
#   benches/gpu_pack.sh        # builds, strips and packs them into .gpu/bin.tar.xz
#   # on the GPU machine, `.gpu` and `.gl` (the Vulkan loader's .deb files, for wgpu) carried:
#   OUT=/tmp/out bash benches/gpu_session.sh bench          # parity tests, W1, W2, W3S, W3
#   OUT=/tmp/out bash benches/gpu_session.sh train [MINUTES] # the full corpus on CUDA
#
# `bench` (about 6 minutes on an H100 with a cold kernel cache; each part has its own time
#   limit, so one that runs long leaves the others' figures):
#   - the attention and block parity tests on wgpu (Vulkan) and CUDA against the PyTorch
#     fixtures, and the GPU attention autodiff tests (`gpu_attention_autodiff_*`) on both;
#   - W1 (multi-head attention) and W2 (the `base` encoder), inference, against PyTorch CUDA,
#     each timed run ending with `Backend::sync` (no copy to the host) as PyTorch's ends with
#     `torch.cuda.synchronize()`;
#   - W3S (a `small`-preset training step, 16,000-token batches) and W3 (the `cpu` preset's
#     step) on CUDA against the same model in PyTorch on the same batches in the same order
#     (`benches/compare_pytorch.py`); xfmr's run is cut off after $W3_LIMIT seconds (default
#     100) and reported from the steps it logged, with the time its first step took (kernel
#     compilation and autotuning included).
# `train`: the full corpus's translation run (docs/training.md's GPU recipe; the embedded set
#   is the whole corpus) on CUDA for MINUTES (default 4), then scored on the 500 test sentences;
#   then PyTorch trains the same model on the same batches for as long (benches/torch_translate.py).
#
# burn's GPU backends compile their kernels at run time and autotune them. `cubecl.toml`
# (written here, removed on exit) logs each compilation and keeps the compiled kernels and the
# autotune results in .gpu/cubecl-cache; the cache goes back as $OUT/cubecl-cache.tar.xz: put
# that file in .gpu/ and a later call starts from it (same GPU kind), which is how the first
# step's time with a warm cache is measured. Everything it prints is also written under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/xfmr-gpu-out}
mkdir -p "$OUT"
phase=${1:-bench}
minutes=${2:-4}
W3_LIMIT=${W3_LIMIT:-100}
# The training steps measured, in this order (`w3s w3`, or one of them when time is short).
W3_WORKLOADS=${W3_WORKLOADS:-w3s w3}
case "$phase" in
  bench | train) ;;
  *) echo "usage: benches/gpu_session.sh bench | train [MINUTES]" >&2; exit 2 ;;
esac
if [ -f .gpu/bin.tar.xz ] && [ ! -x .gpu/target/release/xfmr ]; then
  python3 -c "import tarfile; tarfile.open('.gpu/bin.tar.xz').extractall('.gpu')"
fi
export CARGO_TARGET_DIR=$PWD/.gpu/target
cache=$PWD/.gpu/cubecl-cache
if [ -f .gpu/cubecl-cache.tar.xz ]; then
  python3 -c "import tarfile; tarfile.open('.gpu/cubecl-cache.tar.xz').extractall('.gpu')"
  echo "cubecl caches from an earlier call: $(find "$cache" -type f 2>/dev/null | wc -l) files"
fi
xfmr=$CARGO_TARGET_DIR/release/xfmr
# burn reads cubecl.toml from the working directory up; it is removed again on exit.
trap 'rm -f cubecl.toml' EXIT
rm -f /tmp/cubecl-compile.log /tmp/cubecl-autotune.log
cat > cubecl.toml <<TOML
[compilation]
cache = { file = "$cache" }
[compilation.logger]
level = "basic"
file = "/tmp/cubecl-compile.log"
[autotune]
cache = { file = "$cache" }
[autotune.logger]
level = "minimal"
file = "/tmp/cubecl-autotune.log"
TOML
compiled() {
  local kernels tuned
  kernels=$(grep -c 'Compiling' /tmp/cubecl-compile.log 2>/dev/null)
  tuned=$(grep -c 'Fastest' /tmp/cubecl-autotune.log 2>/dev/null)
  echo "kernels compiled so far: ${kernels:-0}, autotune results: ${tuned:-0}"
}

if ! ldconfig -p | grep -q libvulkan.so.1 && ls .gl/*.deb >/dev/null 2>&1; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
  nproc
} 2>&1 | tee "$OUT/machine-$phase.txt"

if [ "$phase" = bench ]; then
  export PYTHONUNBUFFERED=1
  echo "== parity tests on wgpu and CUDA"
  export XFMR_FIXTURES_DIR=$PWD/fixtures
  {
    timeout 60 .gpu/tests/attention --test-threads 1 parity_wgpu parity_cuda \
      cached_decoding_equals_full_causal_pass_on_wgpu cached_decoding_equals_full_causal_pass_on_cuda \
      gpu_attention_autodiff
    echo "attention tests exited $?"
    timeout 45 .gpu/tests/blocks --test-threads 1 transformer_parity_wgpu transformer_parity_cuda
    echo "blocks tests exited $?"
    compiled
  } 2>&1 | tee "$OUT/parity.txt"
  echo "== W1, W2"
  timeout 120 python3 benches/compare_pytorch.py --prebuilt --device cuda --workloads w1 w2 \
    --backends cuda --rounds 1 --iters 30 2>&1 | tee "$OUT/bench-w1-w2.txt"
  compiled | tee -a "$OUT/bench-w1-w2.txt"
  for w in $W3_WORKLOADS; do
    echo "== ${w^^}"
    timeout $((W3_LIMIT + 60)) python3 benches/compare_pytorch.py --prebuilt --device cuda \
      --workloads "$w" --backends cuda --rounds 1 --iters 20 --skip 10 \
      --xfmr-timeout "$W3_LIMIT" 2>&1 | tee "$OUT/bench-$w.txt"
    compiled | tee -a "$OUT/bench-$w.txt"
  done
else
  echo "== full corpus on cuda, $minutes minutes"
  limit=$(awk -v m="$minutes" 'BEGIN { printf "%d", 60 * m + 150 }')
  start=$(date +%s)
  timeout "$limit" "$xfmr" train --backend cuda --data crates/xfmr-cli/data/es-en --out /tmp/long-cuda \
    --preset small --vocab-size 8000 --warmup 800 --max-tokens 16000 --eval-every 200 \
    --checkpoint-every 100 --minutes "$minutes" --test-sentences 500 > "$OUT/train-cuda.log" 2>&1
  echo "train (cuda) exited $? after $(( $(date +%s) - start )) s"
  compiled
  tail -40 "$OUT/train-cuda.log"
  for f in metrics.jsonl results.json; do cp "/tmp/long-cuda/$f" "$OUT/cuda-$f" 2>/dev/null; done
  # PyTorch training the same model on the same batches in the same order for as long, with
  # its greedy test BLEU every 500 steps (time to quality; compare with xfmr's greedy BLEU).
  echo "== PyTorch on the same run, $minutes minutes"
  timeout "$limit" python3 benches/torch_translate.py --run /tmp/long-cuda \
    --data crates/xfmr-cli/data/es-en --device cuda --minutes "$minutes" --bleu-every 500 \
    > "$OUT/torch-train.log" 2>&1
  echo "torch_translate.py exited $?"
  grep -E 'test_bleu|final' "$OUT/torch-train.log"
fi
cp /tmp/cubecl-compile.log "$OUT/cubecl-compile-$phase.log" 2>/dev/null
cp /tmp/cubecl-autotune.log "$OUT/cubecl-autotune-$phase.log" 2>/dev/null
if [ -d "$cache" ]; then
  tar -C .gpu -cJf "$OUT/cubecl-cache.tar.xz" cubecl-cache && ls -l "$OUT/cubecl-cache.tar.xz"
fi
true
