//! Compiles `kernels/model/*.cu` (the model's fused ops) with nvcc, only with the `cuda`
//! feature (see `kernels/nvcc.rs`). FMA contraction stays on: these kernels are tested
//! against the composed candle ops within a tolerance, not bit for bit.

include!("../../kernels/nvcc.rs");

fn main() {
    compile_fatbins("../../kernels/model", &[]);
}
