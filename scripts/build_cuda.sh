#!/usr/bin/env bash
# Build the CUDA binaries on a machine without a GPU and pack them for the GPU machine
# (`train` with the `nccl` feature: data parallelism on several GPUs).
#   scripts/build_cuda.sh            -> dist/train.gz, dist/cuda_parity.gz, dist/fused_parity.gz
#                                       (stripped, gzipped)
# First time: `cargo fetch` and ../shared/cuda/setup_cuda_home.sh .cuda (CUDA 13.0 from pip
# wheels; see ../shared/cuda/README.md). Builds into target-cuda/ so the CPU build in
# target/ is not invalidated. On the GPU machine: gunzip, chmod +x, run; set CUDA_CACHE_PATH
# to keep candle's JIT-compiled PTX between runs (lowbit's own kernels ship as SASS).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -x .cuda/bin/nvcc ] || ../shared/cuda/setup_cuda_home.sh .cuda
export CUDA_HOME=$root/.cuda PATH=$root/.cuda/bin:$PATH NVCC=$root/.cuda/bin/nvcc
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90} CARGO_TARGET_DIR=$root/target-cuda
# libnccl.so stub for the linker (the `nccl` feature; no NCCL here): every NCCL symbol cudarc can
# reference, with SONAME libnccl.so.2, so the binary loads the GPU machine's real NCCL there.
if [ ! -e .cuda/lib64/stubs/libnccl.so ]; then
  nccl_sys=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src/nccl/sys/mod.rs | tail -1)
  grep -oP '^\s+(pub )?fn \K(nccl|pnccl)\w+(?=\()' "$nccl_sys" | sort -u \
    | awk '{print "void " $1 "(void) {}"}' > .cuda/lib64/stubs/libnccl_stub.c
  gcc -shared -fPIC -Wl,-soname,libnccl.so.2 -o .cuda/lib64/stubs/libnccl.so .cuda/lib64/stubs/libnccl_stub.c
fi
cargo build --release --features cuda,nccl -p lowbit-train
parity=$(cargo test --release --features cuda -p lowbit-optim --test cuda_parity --no-run 2>&1 \
  | grep -o 'target-cuda/release/deps/cuda_parity-[0-9a-f]*' | head -1)
fused=$(cargo test --release --features cuda -p lowbit-model --test fused_parity --no-run 2>&1 \
  | grep -o 'target-cuda/release/deps/fused_parity-[0-9a-f]*' | head -1)
mkdir -p dist
for pair in "target-cuda/release/train:train" "$parity:cuda_parity" "$fused:fused_parity"; do
  src=${pair%%:*}; name=${pair##*:}
  strip -o "dist/$name" "$src"
  gzip -f "dist/$name"
done
ls -la dist
