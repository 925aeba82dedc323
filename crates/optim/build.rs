//! Compiles `kernels/optim/*.cu` (the optimizer's kernels) with nvcc, only with the `cuda` feature
//! (see `kernels/nvcc.rs`). `-fmad=false`: no FMA contraction, so the kernels' FP32
//! arithmetic is the CPU reference's.

include!("../../kernels/nvcc.rs");

fn main() {
    compile_fatbins("../../kernels/optim", &["-fmad=false"]);
}
