//! SOAP's preconditioner states ([`SoapStates`]: one [`Precond`] per tensor): the EMAs L and R
//! of G Gᵀ and Gᵀ G, stored in a low-precision format as the moments are, and their FP32
//! eigenbases. The update that steps them is [`crate::rules::soap`]'s; their random streams
//! are [`precond_key`]'s.

use crate::states::format::StateFormat;
use crate::states::moments::{Moments, TensorState};
use crate::states::quant::QuantState;
use crate::states::rng::{stream_key, StateKind};

/// How SOAP's preconditioners are stored (from `[optim.soap]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrecondStorage {
    /// The largest side that gets a preconditioner (`optim.soap.max_precond_dim`).
    pub max_dim: usize,
    /// L and R's format (`optim.soap.precond_format`); `None`: each tensor's m format.
    pub format: Option<StateFormat>,
}

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
    /// for each side no longer than `storage.max_dim`, in `storage.format` (m's format, block
    /// size and scale kind by default; another format takes m's block size and its own default
    /// scale kind); any other shape none.
    pub fn new(t: &TensorState, dims: &[usize], storage: PrecondStorage) -> Precond {
        let (rows, cols) = match dims {
            [r, c] => (*r, *c),
            _ => (1, t.info.len),
        };
        let matrix = dims.len() == 2;
        let format = storage.format.unwrap_or(t.spec.m_format);
        let scale = if format == t.spec.m_format { t.spec.m_scale } else { format.default_scale() };
        let side = |n: usize| {
            (matrix && n <= storage.max_dim).then(|| QuantState::zeros(format, n * n, t.spec.block_size, true).with_scale_kind(scale))
        };
        Precond { rows, cols, l: side(rows), r: side(cols), q_l: vec![], q_r: vec![] }
    }

    /// Bytes of L and R (codes + scales) and of the FP32 bases.
    pub fn bytes(&self) -> usize {
        let side = |s: &Option<QuantState>, n: usize| s.as_ref().map_or(0, |s| s.bytes() + 4 * n * n);
        side(&self.l, self.rows) + side(&self.r, self.cols)
    }
}

/// SOAP's states beside the moments: one [`Precond`] per tensor, in tensor order.
#[derive(Debug, Clone, PartialEq)]
pub struct SoapStates {
    pub tensors: Vec<Precond>,
}

impl SoapStates {
    /// Fresh states for the tensors of `moments`, of shapes `dims` (tensor order).
    ///
    /// # Panics
    /// When `dims` and the tensors of `moments` differ in count or sizes.
    pub fn new(moments: &Moments, dims: &[Vec<usize>], storage: PrecondStorage) -> SoapStates {
        assert_eq!(dims.len(), moments.tensors.len(), "one shape per tensor");
        let tensors = moments
            .tensors
            .iter()
            .zip(dims)
            .map(|(t, d)| {
                assert_eq!(d.iter().product::<usize>(), t.info.len, "{}: shape {d:?}", t.info.name);
                Precond::new(t, d, storage)
            })
            .collect();
        SoapStates { tensors }
    }

    /// Bytes of every tensor's preconditioners and bases ([`Precond::bytes`]).
    pub fn bytes(&self) -> usize {
        self.tensors.iter().map(Precond::bytes).sum()
    }

    /// How L and R are stored, as the start banner and a checkpoint's `state.json` word it:
    /// the format with its scales (`"fp8e4m3 (amax scale per tensor)"`, `"bf16"`); `None` when
    /// no tensor has a preconditioner. The first preconditioned tensor's: with
    /// `optim.soap.precond_format` every tensor's; without it each tensor's follows its m.
    pub fn precond_storage(&self) -> Option<String> {
        let s = self.tensors.iter().find_map(|p| p.l.as_ref().or(p.r.as_ref()))?;
        let scales = crate::states::config::scale_words(s.format, s.scale_kind, s.block);
        Some(if scales.is_empty() { s.format.name().to_string() } else { format!("{} ({})", s.format.name(), &scales[2..]) })
    }
}

/// The random stream of update `update`'s write-back of preconditioner `side` (0: L, 1: R) of
/// tensor `tensor`: [`stream_key`] of a tensor id past any model's (2^32 + 2 tensor + side),
/// kind m, so it meets no moment's stream.
pub fn precond_key(seed: u64, update: u64, tensor: usize, side: usize) -> u64 {
    stream_key(seed, update, (1 << 32) + 2 * tensor as u64 + side as u64, StateKind::M)
}
