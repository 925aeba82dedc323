#!/usr/bin/env bash
# Build the CUDA binaries on a machine without a GPU and pack them for the GPU machine
# (`train` with the `nccl` feature: data parallelism on several GPUs).
#   scripts/build_cuda.sh            -> dist/gpu.tar.xz: `train` and the GPU test binaries
#                                       cuda_parity, fused_parity, nccl_one_rank (stripped)
# First time: `cargo fetch` and ../shared/cuda/setup_cuda_home.sh .cuda (CUDA 13.0 from pip
# wheels; see ../shared/cuda/README.md). Builds into target-cuda/ so the CPU build in
# target/ is not invalidated. On the GPU machine (carry dist/gpu.tar.xz):
#   mkdir -p /tmp/g && python3 -c "import tarfile; tarfile.open('dist/gpu.tar.xz').extractall('/tmp/g')"
# (or `tar xJf dist/gpu.tar.xz -C /tmp/g` where xz is installed), then run /tmp/g/train,
# /tmp/g/cuda_parity, ...; set CUDA_CACHE_PATH to keep candle's JIT-compiled PTX between runs
# (lowbit's own kernels ship as SASS).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -x .cuda/bin/nvcc ] || ../shared/cuda/setup_cuda_home.sh .cuda
export CUDA_HOME=$root/.cuda PATH=$root/.cuda/bin:$PATH NVCC=$root/.cuda/bin/nvcc
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90} CARGO_TARGET_DIR=$root/target-cuda
# Link stubs for the libraries no wheel here ships, each exporting every symbol cudarc can
# reference with the real library's SONAME, so the binary loads the GPU machine's library there:
# libnccl.so.2 (the `nccl` feature) and cuSOLVER 12 with its cuSPARSE 12 (CUDA 13.0; SOAP's
# eigenbasis refresh on the GPU, lowbit-optim's `cuda` feature).
stub() { # stub LIB SONAME CUDARC_MODULE SYMBOL_PREFIXES
  [ -e ".cuda/lib64/stubs/$1.so" ] && return
  local sys
  sys=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src/"$3"/sys/mod.rs | tail -1)
  grep -oP "^\s+(pub )?(unsafe )?fn \K($4)\w+(?=\()" "$sys" | sort -u \
    | awk '{print "void " $1 "(void) {}"}' > ".cuda/lib64/stubs/$1_stub.c"
  gcc -shared -fPIC -Wl,-soname,"$2" -o ".cuda/lib64/stubs/$1.so" ".cuda/lib64/stubs/$1_stub.c"
}
stub libnccl libnccl.so.2 nccl 'nccl|pnccl'
stub libcusolver libcusolver.so.12 cusolver 'cusolver'
stub libcusparse libcusparse.so.12 cusparse 'cusparse'
# One cargo invocation, one feature set (cuda + nccl for every crate): a second feature set
# would build candle's CUDA kernels again (~15 min here). The test binaries' paths are read
# from cargo's JSON messages.
features=lowbit-optim/cuda,lowbit-model/cuda,lowbit-train/nccl,lowbit-cli/nccl
tests=(cuda_parity fused_parity nccl_one_rank)
cargo build --release -p lowbit-cli --features "$features"
cargo test --release -p lowbit-optim -p lowbit-model -p lowbit-train -p lowbit-cli --features "$features" \
  "${tests[@]/#/--test=}" --no-run --message-format=json > target-cuda/tests.json
pairs=("target-cuda/release/train:train")
for t in "${tests[@]}"; do
  exe=$(python3 -c 'import json, sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[2] and m.get("executable"):
        print(m["executable"])' target-cuda/tests.json "$t" | tail -1)
  [ -n "$exe" ] || { echo "build_cuda.sh: no test binary $t" >&2; exit 1; }
  pairs+=("$exe:$t")
done
# One xz archive with a dictionary large enough to span the binaries: each carries candle's
# ~32 MB of CUDA code, stored once (4 binaries: ~220 MB stripped, ~31 + 24 + 13 + 11 MB gzipped
# one by one, ~23 MB together), so they travel beside the corpus inside the 64 MiB carry limit.
rm -rf dist && mkdir -p dist/bin
for pair in "${pairs[@]}"; do
  strip -o "dist/bin/${pair##*:}" "${pair%%:*}"
done
tar cf - -C dist/bin . | xz -T0 --lzma2=preset=9,dict=256MiB > dist/gpu.tar.xz
rm -rf dist/bin
ls -la dist
