//! The values that the optimizer's CUDA kernels (`kernels/optim/`) and their Rust launchers
//! (`adamw.rs`, `soap.rs`, `grad_norm.rs` beside this file, behind the `cuda` feature) must
//! agree on, in one place. Each
//! names the kernel file that holds its twin; the tests below read those files (no nvcc
//! needed, so CPU CI runs them) and fail when one side changes alone. The argument structs' sizes are asserted on
//! both sides: `static_assert` in the kernel file, `const` assertions in the launcher, both
//! with the sizes here.
//!
//! Not here: the int8 bucket table's `OCTAVES` / `SUB_BITS`, which belong to the format
//! ([`crate::states::format::int8`]); the tests hold `INT8_OCTAVES` / `INT8_SUB_BITS` of `int8.cuh`
//! against them all the same.

use crate::states::format::{scale::ScaleKind, Rounding, StateFormat};

/// Tensors per step launch (`MAX_TENSORS`, `args.cuh`): the launch parameters, 30.1 KiB, stay
/// under the 32 KiB that CUDA 12.1+ allows on sm_70+.
pub const MAX_TENSORS: usize = 240;
/// Bytes of `struct StepArgs` (`args.cuh`), the launch-wide arguments.
pub const STEP_ARGS_BYTES: usize = 128;
/// `StepArgs::momentum_only` (`MOMENTUM_*`, `args.cuh`): AdamW's step, or Muon's momentum
/// with the Nesterov update or the plain one ([`momentum_id`]).
pub const MOMENTUM_NONE: u32 = 0;
pub const MOMENTUM_NESTEROV: u32 = 1;
pub const MOMENTUM_PLAIN: u32 = 2;
/// Bytes of `struct TensorArgs` (`args.cuh`), one tensor's arguments.
pub const TENSOR_ARGS_BYTES: usize = 128;
/// u64 step counters per tensor slot (`COUNTERS`, `counters.cuh`): updated / stalled /
/// unchanged of m, v and BF16 weights, the zero gradients, the updates with v = 0.
pub const COUNTERS: usize = 11;
/// Threads per block of the step, amax and scale kernels (`STEP_THREADS`, `adamw.cu`, their
/// `__launch_bounds__`): 8 warps.
pub const STEP_THREADS: u32 = 256;
/// Elements per round of a warp (`ROUND_ELEMENTS`, `adamw.cu`): 32 lanes x 4 elements.
pub const ROUND_ELEMENTS: usize = 128;
/// Rounds per segment for unscaled states (`SEGMENT_ROUNDS_UNSCALED`, `adamw.cu`).
pub const SEGMENT_ROUNDS_UNSCALED: usize = 2;
/// Rounds per segment for scaled states in 128-blocks or per tensor (`SEGMENT_ROUNDS_SCALED`).
pub const SEGMENT_ROUNDS_SCALED: usize = 1;

/// Tensors per launch of the gradient-norm kernels (`NORM_TENSORS`, `grad_norm.cu`).
pub const NORM_TENSORS: usize = 256;
/// Elements per block of the gradient-norm kernels (`NORM_CHUNK`).
pub const NORM_CHUNK: usize = 65536;
/// Threads per block of the gradient-norm kernels (`NORM_THREADS`).
pub const NORM_THREADS: u32 = 256;
/// Bytes of `struct NormArgs` (`grad_norm.cu`): addresses, lengths, chunk offsets, count.
pub const NORM_ARGS_BYTES: usize = 8 * (3 * NORM_TENSORS + 2);

/// Threads per block of the SOAP kernels (`SOAP_THREADS`, `soap.cu`, their `__launch_bounds__`).
pub const SOAP_THREADS: u32 = 256;
/// Bytes of `struct EmaArgs` (`SOAP_EMA_ARGS_BYTES`, `soap.cu`): a state's EMA write-back.
pub const SOAP_EMA_ARGS_BYTES: usize = 88;
/// Bytes of `struct WeightsArgs` (`SOAP_WEIGHTS_ARGS_BYTES`, `soap.cu`): the weights' update.
pub const SOAP_WEIGHTS_ARGS_BYTES: usize = 56;
/// Bytes of `struct DirectionArgs` (`SOAP_DIRECTION_ARGS_BYTES`, `soap.cu`): the update
/// direction in the rotated basis.
pub const SOAP_DIRECTION_ARGS_BYTES: usize = 64;

/// Elements per segment of one step launch (the kernels' `rounds<MF, VF>() * 128`, or one
/// scale block of another length): `scaled` = either state is scaled, `block_size` its scale
/// block (0 = per tensor).
pub fn segment_len(scaled: bool, block_size: usize) -> usize {
    match (scaled, block_size) {
        (false, _) => SEGMENT_ROUNDS_UNSCALED * ROUND_ELEMENTS,
        (true, 0) | (true, ROUND_ELEMENTS) => SEGMENT_ROUNDS_SCALED * ROUND_ELEMENTS,
        (true, b) => b,
    }
}

/// A tensor's `StepArgs::momentum_only` ([`MOMENTUM_NONE`] for AdamW's tensors).
pub fn momentum_id(m: Option<crate::states::moments::Momentum>) -> u32 {
    match m {
        None => MOMENTUM_NONE,
        Some(m) if m.nesterov => MOMENTUM_NESTEROV,
        Some(_) => MOMENTUM_PLAIN,
    }
}

/// A rounding mode's launch argument (`ROUND_NEAREST` / `ROUND_STOCHASTIC` / `ROUND_DITHER`,
/// `common.cuh`).
pub fn round_id(r: Rounding) -> i32 {
    match r {
        Rounding::Nearest => 0,
        Rounding::Stochastic => 1,
        Rounding::Dither => 2,
    }
}

/// A scale kind's launch argument (`SCALE_POW2` / `SCALE_AMAX`, `scale.cuh`).
pub fn scale_id(k: ScaleKind) -> u32 {
    match k {
        ScaleKind::Pow2 => 0,
        ScaleKind::Amax => 1,
    }
}

/// A format's name in the kernels' names (`adamw_<w>_<m>_<v>...`): its config name, `e8m` for
/// every e8mK (K is a launch argument).
pub fn kernel_format(format: StateFormat) -> &'static str {
    match format {
        StateFormat::E8m(_) => "e8m",
        f => f.name(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::format::int8;

    include!("../../../../kernels/header_values.rs");

    const ARGS: &str = include_str!("../../../../kernels/optim/args.cuh");
    const ADAMW: &str = include_str!("../../../../kernels/optim/adamw.cu");
    const COMMON: &str = include_str!("../../../../kernels/optim/common.cuh");
    const COUNTERS_CUH: &str = include_str!("../../../../kernels/optim/counters.cuh");
    const GRAD_NORM: &str = include_str!("../../../../kernels/optim/grad_norm.cu");
    const INT8: &str = include_str!("../../../../kernels/optim/int8.cuh");
    const SCALE: &str = include_str!("../../../../kernels/optim/scale.cuh");
    const SOAP: &str = include_str!("../../../../kernels/optim/soap.cu");

    #[test]
    fn launch_constants_match_the_kernel_files() {
        let n = |v: usize| v as i64;
        for (src, name, value) in [
            (ARGS, "MAX_TENSORS", n(MAX_TENSORS)),
            (ARGS, "STEP_ARGS_BYTES", n(STEP_ARGS_BYTES)),
            (ARGS, "TENSOR_ARGS_BYTES", n(TENSOR_ARGS_BYTES)),
            (ARGS, "MOMENTUM_NONE", i64::from(MOMENTUM_NONE)),
            (ARGS, "MOMENTUM_NESTEROV", i64::from(MOMENTUM_NESTEROV)),
            (ARGS, "MOMENTUM_PLAIN", i64::from(MOMENTUM_PLAIN)),
            (COUNTERS_CUH, "COUNTERS", n(COUNTERS)),
            (ADAMW, "STEP_THREADS", i64::from(STEP_THREADS)),
            (ADAMW, "ROUND_ELEMENTS", n(ROUND_ELEMENTS)),
            (ADAMW, "SEGMENT_ROUNDS_UNSCALED", n(SEGMENT_ROUNDS_UNSCALED)),
            (ADAMW, "SEGMENT_ROUNDS_SCALED", n(SEGMENT_ROUNDS_SCALED)),
            (GRAD_NORM, "NORM_TENSORS", n(NORM_TENSORS)),
            (GRAD_NORM, "NORM_CHUNK", n(NORM_CHUNK)),
            (GRAD_NORM, "NORM_THREADS", i64::from(NORM_THREADS)),
            (GRAD_NORM, "NORM_ARGS_BYTES", n(NORM_ARGS_BYTES)),
            (SOAP, "SOAP_THREADS", i64::from(SOAP_THREADS)),
            (SOAP, "SOAP_EMA_ARGS_BYTES", n(SOAP_EMA_ARGS_BYTES)),
            (SOAP, "SOAP_WEIGHTS_ARGS_BYTES", n(SOAP_WEIGHTS_ARGS_BYTES)),
            (SOAP, "SOAP_DIRECTION_ARGS_BYTES", n(SOAP_DIRECTION_ARGS_BYTES)),
            (INT8, "INT8_OCTAVES", i64::from(int8::OCTAVES)),
            (INT8, "INT8_SUB_BITS", i64::from(int8::SUB_BITS)),
        ] {
            assert_eq!(header_value(src, name), value, "{name}");
        }
        // a round is one 4-element quad per lane of a warp
        assert_eq!(ROUND_ELEMENTS, 32 * 4);
        assert_eq!(segment_len(false, 0), 256);
        assert_eq!(segment_len(true, 128), 128);
        assert_eq!(segment_len(true, 0), 128);
        assert_eq!(segment_len(true, 64), 64);
    }

    #[test]
    fn launch_ids_match_the_kernel_enums() {
        for (r, name) in
            [(Rounding::Nearest, "ROUND_NEAREST"), (Rounding::Stochastic, "ROUND_STOCHASTIC"), (Rounding::Dither, "ROUND_DITHER")]
        {
            assert_eq!(header_value(COMMON, name), i64::from(round_id(r)), "{name}");
        }
        for (k, name) in [(ScaleKind::Pow2, "SCALE_POW2"), (ScaleKind::Amax, "SCALE_AMAX")] {
            assert_eq!(header_value(SCALE, name), i64::from(scale_id(k)), "{name}");
        }
    }

    /// `FMT_*` of `common.cuh` numbers the kernel formats in the order of [`StateFormat::ALL`]
    /// (all e8mK one id), as its comment says.
    #[test]
    fn kernel_format_ids_follow_the_rust_order() {
        let mut names: Vec<&str> = StateFormat::ALL.iter().map(|&f| kernel_format(f)).collect();
        names.dedup();
        let fmt = |name: &str| match name {
            "fp32" => "FMT_F32",
            "bf16" => "FMT_BF16",
            "fp8e4m3" => "FMT_E4M3",
            "fp8e5m2" => "FMT_E5M2",
            "fp4e2m1" => "FMT_E2M1",
            "fp4ue2m2" => "FMT_UE2M2",
            "int8" => "FMT_INT8",
            "e8m" => "FMT_E8M",
            other => panic!("no kernel format id for {other}"),
        };
        for (id, name) in names.iter().enumerate() {
            assert_eq!(header_value(COMMON, fmt(name)), id as i64, "{name}");
            // and the step kernels of that format exist by that name
            assert!(
                ADAMW.contains(&format!("({name}, {}", fmt(name))) || ADAMW.contains(&format!(" {name}, {}", fmt(name))),
                "adamw.cu instantiates no {name} kernels"
            );
        }
    }

    #[test]
    fn header_value_reads_defines_and_enums() {
        let src = "#define A 12  // note\nenum { B = 0, C = 7 };\n#define D (A << 2)\n";
        assert_eq!(header_value(src, "A"), 12);
        assert_eq!(header_value(src, "C"), 7);
        assert!(std::panic::catch_unwind(|| header_value(src, "D")).is_err());
        assert!(std::panic::catch_unwind(|| header_value(src, "E")).is_err());
    }
}
