//! SOAP with low-precision states (Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo
//! using Adam", arXiv:2409.11321, Alg. 3; Topollai & Choromanska, arXiv:2603.16731, Table 7 and
//! section 6.3): Adam run in the eigenbasis of Shampoo's two preconditioners, every state —
//! Adam's m and v and the preconditioner EMAs L and R — stored in `[optim.states]`'s formats
//! and counted by the same stall counters.
//!
//! Per matrix W (`rows x cols`) and update, with G = grad * grad_scale and the bases Q_L, Q_R
//! (a side longer than `optim.soap.max_precond_dim`, and both sides of a vector, keep no
//! preconditioner: its Q is the identity):
//! ```text
//! G' = Q_Lᵀ G Q_R                                   (G in the eigenbasis)
//! m  = b1 m + (1 - b1) G                            (original basis, as SOAP keeps it)
//! v  = b2 v + (1 - b2) G'²                          (rotated basis)
//! N' = (Q_Lᵀ m Q_R) * (1 / (1 - b1^t)) / (sqrt(v * (1 / (1 - b2^t))) + eps)
//! W  = W (1 - lr wd) - lr Q_L N' Q_Rᵀ
//! L  = bs L + (1 - bs) G Gᵀ ;  R = bs R + (1 - bs) Gᵀ G      (bs = optim.soap.shampoo_beta)
//! every `precondition_frequency` updates: Q <- QR(L Q) with Q's columns sorted by their
//! eigenvalue estimate, v's rows (columns) moved with them ([`basis::refresh`]).
//! ```
//! m, v, L and R are written back rounded as AdamW's states are ([`store::ema_write`]); each
//! update uses the unrounded FP32 values, and a refresh uses this update's unrounded L and R.
//! The first update of a matrix with a preconditioner only fills L and R and takes their full
//! eigendecomposition ([`basis::eigenbasis`]): its weights, m and v stay (the reference skips
//! it so that no gradient is projected on a basis built from itself). Its bias correction counts
//! that update (t is the update number since the last reset, as AdamW's), so the second update's
//! step is ~0.74 of the reference's, a gap that fades within the warmup.
//! Resets: m with `m_reset_every`, v and the two preconditioners with `v_reset_every` (the
//! paper's section 6.3 zeroes L and R with the moments); the bases stay. L and R need no bias
//! correction: eigenvectors and the QR power step do not depend on their scale.
//! L and R take m's format, block size, scale kind and rounding (they are signed), or the format
//! `optim.soap.precond_format` names; their random streams are [`precond_key`]'s.

pub mod basis;
pub mod config;
pub mod host;
pub mod step;
pub mod store;

use crate::optimizer::{LowbitAdamW, TensorState};
use crate::rng::{stream_key, StateKind};
use crate::state::QuantState;
pub use config::{OptimizerKind, SoapConfig};

/// SOAP's own states of one parameter tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Precond {
    /// The matrix's shape (a vector: 1 x len).
    pub rows: usize,
    pub cols: usize,
    /// L = EMA of G Gᵀ (`rows x rows`, row-major), `None` for a side without a preconditioner.
    pub l: Option<QuantState>,
    /// R = EMA of Gᵀ G (`cols x cols`).
    pub r: Option<QuantState>,
    /// The eigenbases Q_L, Q_R (FP32, row-major, one eigenvector per column): empty until the
    /// first update, and for a side without a preconditioner.
    pub q_l: Vec<f32>,
    pub q_r: Vec<f32>,
}

impl Precond {
    /// Fresh states of a tensor of shape `dims` whose moments are `t`'s: a matrix gets L and R
    /// for each side no longer than `config.max_precond_dim`, in `config.precond_format` (m's
    /// format, block size and scale kind by default; another format takes m's block size and
    /// its own default scale kind); any other shape none.
    pub fn new(t: &TensorState, dims: &[usize], config: &SoapConfig) -> Precond {
        let (rows, cols) = match dims {
            [r, c] => (*r, *c),
            _ => (1, t.info.len),
        };
        let matrix = dims.len() == 2;
        let format = config.precond_format.unwrap_or(t.spec.m_format);
        let scale = if format == t.spec.m_format { t.spec.m_scale } else { format.default_scale() };
        let side = |n: usize| {
            (matrix && n <= config.max_precond_dim)
                .then(|| QuantState::zeros(format, n * n, t.spec.block_size, true).with_scale_kind(scale))
        };
        Precond { rows, cols, l: side(rows), r: side(cols), q_l: vec![], q_r: vec![] }
    }

    /// Bytes of L and R (codes + scales) and of the FP32 bases.
    pub fn bytes(&self) -> usize {
        let side = |s: &Option<QuantState>, n: usize| s.as_ref().map_or(0, |s| s.bytes() + 4 * n * n);
        side(&self.l, self.rows) + side(&self.r, self.cols)
    }
}

/// SOAP's states beside AdamW's moments ([`LowbitAdamW::soap`]): one [`Precond`] per tensor,
/// in tensor order.
#[derive(Debug, Clone, PartialEq)]
pub struct SoapStates {
    pub config: SoapConfig,
    pub tensors: Vec<Precond>,
}

impl SoapStates {
    /// Fresh states for `opt`'s tensors of shapes `dims` (tensor order).
    ///
    /// # Panics
    /// When `dims` and `opt`'s tensors differ in count or sizes.
    pub fn new(config: SoapConfig, opt: &LowbitAdamW, dims: &[Vec<usize>]) -> SoapStates {
        assert_eq!(dims.len(), opt.tensors.len(), "one shape per tensor");
        let tensors = opt
            .tensors
            .iter()
            .zip(dims)
            .map(|(t, d)| {
                assert_eq!(d.iter().product::<usize>(), t.info.len, "{}: shape {d:?}", t.info.name);
                Precond::new(t, d, &config)
            })
            .collect();
        SoapStates { config, tensors }
    }

    /// How L and R are stored, as the start banner and a checkpoint's `state.json` word it:
    /// the format with its scales (`"fp8e4m3 (amax scale per tensor)"`, `"bf16"`); `None` when
    /// no tensor has a preconditioner. The first preconditioned tensor's: with
    /// `optim.soap.precond_format` every tensor's; without it each tensor's follows its m.
    pub fn precond_storage(&self) -> Option<String> {
        let s = self.tensors.iter().find_map(|p| p.l.as_ref().or(p.r.as_ref()))?;
        let scales = crate::config::scale_words(s.format, s.scale_kind, s.block);
        Some(if scales.is_empty() { s.format.name().to_string() } else { format!("{} ({})", s.format.name(), &scales[2..]) })
    }
}

/// The random stream of update `update`'s write-back of preconditioner `side` (0: L, 1: R) of
/// tensor `tensor`: [`stream_key`] of a tensor id past any model's (2^32 + 2 tensor + side),
/// kind m, so it meets no moment's stream.
pub fn precond_key(seed: u64, update: u64, tensor: usize, side: usize) -> u64 {
    stream_key(seed, update, (1 << 32) + 2 * tensor as u64 + side as u64, StateKind::M)
}
