//! What a run needs in memory at the least, from its config alone, so that a config that
//! cannot fit is refused with the numbers before anything is allocated or written (without
//! it `data.seq_len = 1e9` or `model.vocab_size = 1e9` aborted in an allocation, a huge
//! `train.micro_batch` hung after the run folder was claimed).
//!
//! A lower bound, not a forecast: only what the run surely holds at once is counted, so that a
//! config that fits is never refused. The weights, their gradients and the two moment states
//! (SOAP: and its preconditioners with their FP32 bases);
//! the composed ops' causal mask (`max_seq_len`² FP32, built at their first forward; none with
//! the fused kernels); with `model.dtype = "bf16-mixed"` the BF16 copies of the FP32 weights
//! that each pass computes with; one micro-batch's logits in the compute dtype (`micro_batch x
//! seq_len x vocab` composed; the fused LM head holds at most [`LM_HEAD_CHUNK_ROWS`] rows of
//! them), each layer's input kept for the backward (`layers x micro_batch x seq_len x hidden`,
//! in the compute dtype, on either path), and one layer's attention scores (`micro_batch x heads x seq_len`², FP32; none with the fused
//! attention, which takes head dimensions [`FLASH_HEAD_DIMS`]). Arithmetic in f64, so that
//! absurd sizes give absurd numbers instead of overflowing.

use crate::config::{KernelChoice, RunConfig, WeightDtype};
use crate::distributed::agreement::any_rank;
use crate::distributed::collective::Collective;
use anyhow::{bail, Result};
use lowbit_model::{Kernels, LlamaConfig, FLASH_HEAD_DIMS, LM_HEAD_CHUNK_ROWS};
use lowbit_optim::StatesPlan;

/// Bytes a run needs at the least, by part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryFloor {
    /// Weights, gradients (FP32) and the m and v states (with SOAP its preconditioners and
    /// their bases); with `bf16-mixed` also the weights' BF16 copies.
    pub model_and_states: f64,
    /// One micro-batch's logits, each layer's input and one layer's attention scores.
    pub activations: f64,
    /// The causal mask of `model.max_seq_len`.
    pub mask: f64,
    /// The streaming shuffle buffer (`data.shuffle_buffer` rows of `data.seq_len + 1` ids), in
    /// host memory: 0 from [`MemoryFloor::of`], set where the run reads through it
    /// ([`MemoryFloor::with_shuffle_buffer`]).
    pub shuffle_buffer: f64,
}

impl MemoryFloor {
    /// The floor of one rank of `ranks` in a run of `cfg` with model `m` and the states of
    /// `plan` (per tensor group; with `train.zero = 1` a rank holds `1 / ranks` of the states),
    /// with the kernels the run will use (as the model's builder decides).
    pub fn of(cfg: &RunConfig, m: &LlamaConfig, plan: &StatesPlan, ranks: usize) -> Self {
        Self::of_kernels(cfg, m, plan, ranks, fused_kernels(cfg, m))
    }

    /// [`MemoryFloor::of`] with the kernels named: `fused` for the fused CUDA kernels (chunked
    /// logits, no mask, no scores for the head dimensions the fused attention takes), else the
    /// composed ops.
    pub fn of_kernels(cfg: &RunConfig, m: &LlamaConfig, plan: &StatesPlan, ranks: usize, fused: bool) -> Self {
        let f = |x: usize| x as f64;
        let (h, i, v, layers) = (f(m.hidden_size), f(m.intermediate_size), f(m.vocab_size), f(m.num_layers));
        let kv = m.num_kv_heads * m.head_dim();
        // (group, elements, tensors): embedding and untied head, per layer q/o (h x h), k/v
        // (h x kv), gate/up/down, 2 norms, and the final norm
        let (hs, is) = (m.hidden_size, m.intermediate_size);
        // (with the matrix's sides, for SOAP's preconditioners)
        let tensors = [
            ("embed", m.vocab_size * hs, 1.0, [m.vocab_size, hs]),
            ("head", m.vocab_size * hs, 1.0, [m.vocab_size, hs]),
            ("attn", hs * hs, 2.0 * layers, [hs, hs]),
            ("attn", hs * kv, 2.0 * layers, [hs, kv]),
            ("mlp", hs * is, 3.0 * layers, [hs, is]),
            ("norm", hs, 2.0 * layers + 1.0, [0, 0]),
        ];
        // SOAP (`optim.kind = "soap"`): L and R in m's format (or `optim.soap.precond_format`),
        // and their FP32 bases, for each side of a matrix no longer than `optim.soap.max_precond_dim`
        let soap = cfg.optim.kind == lowbit_optim::OptimizerKind::Soap;
        let muon = cfg.optim.kind == lowbit_optim::OptimizerKind::Muon;
        let precond = |bits: u32, sides: [usize; 2]| -> f64 {
            let kept = sides.iter().filter(|&&n| soap && n > 0 && n <= cfg.optim.soap.max_precond_dim);
            kept.map(|&n| f(n) * f(n) * (f64::from(bits) / 8.0 + 4.0)).sum()
        };
        let params = 2.0 * v * h + layers * (2.0 * h * h + 2.0 * h * f(kv) + 3.0 * h * i + 2.0 * h) + h;
        // the weights' bytes, and the activations' (the compute dtype); a mixed-precision
        // pass also holds the weights' BF16 copies (`lowbit_model::Llama::with_compute_dtype`)
        let (weight_bytes, act_bytes, copy_bytes) = match cfg.model.dtype {
            WeightDtype::F32 => (4.0, 4.0, 0.0),
            WeightDtype::Bf16 => (2.0, 2.0, 0.0),
            WeightDtype::Bf16Mixed => (4.0, 2.0, 2.0),
        };
        let shards = if cfg.train.zero == 1 { ranks.max(1) as f64 } else { 1.0 };
        let state_bytes: f64 = tensors
            .iter()
            .map(|&(group, len, count, sides)| {
                let s = plan.for_tensor(group, len);
                let precond_bits = cfg.optim.soap.precond_format.unwrap_or(s.m_format).bits();
                // Muon's matrices: m alone, and an FP32 update buffer
                let muon = muon && matches!(group, "attn" | "mlp");
                let v_bits = if muon { 32 } else { s.v_format.bits() };
                count * (f(len) * f64::from(s.m_format.bits() + v_bits) / 8.0 + precond(precond_bits, sides))
            })
            .sum::<f64>()
            / shards;
        let tokens = f(cfg.train.micro_batch) * f(cfg.data.seq_len);
        let seq = f(cfg.data.seq_len);
        let logit_rows = if fused { tokens.min(f(LM_HEAD_CHUNK_ROWS)) } else { tokens };
        let flash = fused && FLASH_HEAD_DIMS.contains(&m.head_dim());
        let scores = if flash { 0.0 } else { f(cfg.train.micro_batch) * f(m.num_heads) * seq * seq * 4.0 };
        MemoryFloor {
            model_and_states: params * (weight_bytes + 4.0 + copy_bytes) + state_bytes,
            activations: (logit_rows * v + layers * tokens * h) * act_bytes + scores,
            mask: if fused { 0.0 } else { f(m.max_seq_len) * f(m.max_seq_len) * 4.0 },
            shuffle_buffer: 0.0,
        }
    }

    /// This floor with the shuffle buffer of `cfg` counted: `data.shuffle_buffer` rows of
    /// [`lowbit_data::shuffle_buffer_row_bytes`] (for a run that streams through it,
    /// [`lowbit_data::reads_through_shuffle_buffer`]).
    pub fn with_shuffle_buffer(self, cfg: &RunConfig) -> Self {
        let rows = cfg.data.shuffle_buffer as f64;
        MemoryFloor { shuffle_buffer: rows * lowbit_data::shuffle_buffer_row_bytes(cfg.data.seq_len), ..self }
    }

    /// The shuffle buffer's part alone (what a GPU run holds of this floor in host memory).
    pub fn host_part(&self) -> Self {
        MemoryFloor { model_and_states: 0.0, activations: 0.0, mask: 0.0, shuffle_buffer: self.shuffle_buffer }
    }

    /// The parts held on the device (all but the shuffle buffer).
    pub fn device_part(&self) -> Self {
        MemoryFloor { shuffle_buffer: 0.0, ..*self }
    }

    /// All parts.
    pub fn total(&self) -> f64 {
        self.model_and_states + self.activations + self.mask + self.shuffle_buffer
    }

    /// Refuses a floor above `available` bytes of `place` (e.g. "this host's available
    /// memory", [`crate::device::available_memory`]), naming the largest part and the settings
    /// that size it.
    ///
    /// # Errors
    /// The floor does not fit: the message gives both in GiB.
    pub fn check(&self, available: u64, place: &str) -> Result<()> {
        if self.total() <= available as f64 {
            return Ok(());
        }
        let gib = |b: f64| b / f64::from(1u32 << 30);
        let parts = [
            (self.model_and_states, "the weights, gradients and states", "model.preset or model.hidden_size / num_layers / vocab_size"),
            (
                self.activations,
                "one micro-batch's activations (logits, layer inputs, attention scores)",
                "train.micro_batch (with train.grad_accum to keep the batch) or data.seq_len",
            ),
            (self.mask, "the causal mask", "data.seq_len or model.max_seq_len"),
            (self.shuffle_buffer, "the streaming shuffle buffer", "data.shuffle_buffer"),
        ];
        let (bytes, what, keys) = parts.iter().copied().fold(parts[0], |a, b| if b.0 > a.0 { b } else { a });
        bail!(
            "this config needs at least {:.1} GiB, {place} is {:.1} GiB: {what} alone take {:.1} GiB; lower {keys}",
            gib(self.total()),
            gib(available as f64),
            gib(bytes)
        )
    }

    /// [`MemoryFloor::check`] on every rank of `comm` against its own device's `available`
    /// memory ([`crate::device::available_memory`]; `None`: not checked), and every rank takes
    /// the same way: a rank whose device fits fails too when another's does not.
    ///
    /// # Errors
    /// This rank's device cannot hold the floor (the message names the sizes), or another's.
    pub fn check_every_rank(&self, available: Option<(u64, &str)>, comm: &dyn Collective) -> Result<()> {
        let refused = available.and_then(|(bytes, place)| self.check(bytes, place).err());
        let any_refused = any_rank(comm, refused.is_some())?;
        match refused {
            Some(e) => Err(e),
            None if any_refused => bail!("another rank's device cannot hold this config (its error names the sizes)"),
            None => Ok(()),
        }
    }
}

/// Whether a run of `cfg` with model `m` runs the fused kernels (as the model's builder
/// decides: `crate::model::build_model`), which build no causal mask: the CUDA build on a GPU,
/// with `model.kernels` "fused", or "auto" and a model the fused kernels take.
fn fused_kernels(cfg: &RunConfig, m: &LlamaConfig) -> bool {
    cfg!(feature = "cuda") && cfg.train.device == "cuda" && cfg.model.kernels != KernelChoice::Composed && Kernels::fits(m).is_ok()
}

/// This host's available memory (`MemAvailable` of /proc/meminfo), bytes, no more than this
/// process's address-space limit leaves it ([`address_space_left`]: `ulimit -v`, under which
/// an allocation past the limit aborts the process); `None` where /proc/meminfo cannot be read.
pub fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(address_space_left().map_or(kib * 1024, |left| left.min(kib * 1024)))
}

/// Bytes this process may still map under its address-space limit (`Max address space` of
/// /proc/self/limits, less `VmSize` of /proc/self/status); `None` without a limit or where
/// they cannot be read.
pub fn address_space_left() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max address space"))?;
    // "Max address space  <soft> <hard> bytes": the soft limit is the one enforced
    let soft: u64 = line.trim_start_matches("Max address space").split_whitespace().next()?.parse().ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let size_kib: u64 = status.lines().find(|l| l.starts_with("VmSize:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(soft.saturating_sub(size_kib * 1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> (RunConfig, LlamaConfig, StatesPlan) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tiny_cpu.toml");
        let cfg = RunConfig::load(&path, &[]).unwrap();
        let m = cfg.model_config(32100).unwrap();
        let plan = StatesPlan::resolve(&cfg.optim.states, cfg.optim.beta2).unwrap();
        (cfg, m, plan)
    }

    /// SOAP adds its preconditioners at m's width and their FP32 bases: with tiny's FP8 states
    /// 1 + 4 bytes per entry of each L and R (hidden 128, intermediate 352, 2 layers; the
    /// embedding's and the head's 32,100 rows are not preconditioned, their 128 columns are).
    #[test]
    fn soap_adds_its_preconditioners() {
        let (mut cfg, m, plan) = tiny();
        let adamw = MemoryFloor::of(&cfg, &m, &plan, 1).model_and_states;
        cfg.optim.kind = lowbit_optim::OptimizerKind::Soap;
        let soap = MemoryFloor::of(&cfg, &m, &plan, 1).model_and_states;
        // embed + head: one 128^2 side each; q/o/k/v (8 per model): two 128^2 sides; gate/up/down (6): 128^2 + 352^2
        assert_eq!(soap - adamw, 5.0 * (24.0 * 128.0 * 128.0 + 6.0 * 352.0 * 352.0));
    }

    /// Per-group states count at their own width: FP32 embedding and head states beside FP8
    /// ones add (8 - 2) bytes for each of their parameters.
    #[test]
    fn group_states_count_at_their_width() {
        let (mut cfg, m, plan) = tiny();
        let base = MemoryFloor::of(&cfg, &m, &plan, 1).model_and_states;
        let fp32 = lowbit_optim::GroupStates { m_format: Some("fp32".into()), v_format: Some("fp32".into()), ..Default::default() };
        cfg.optim.states.groups = [("embed".to_string(), fp32.clone()), ("head".to_string(), fp32)].into();
        let plan = StatesPlan::resolve(&cfg.optim.states, cfg.optim.beta2).unwrap();
        let grouped = MemoryFloor::of(&cfg, &m, &plan, 1).model_and_states;
        assert_eq!(plan.base.m_format.bits() + plan.base.v_format.bits(), 16, "tiny_cpu's states are fp8");
        assert_eq!(grouped - base, 2.0 * (m.vocab_size * m.hidden_size) as f64 * 6.0);
    }

    /// With the fused kernels a micro-batch's logits are one chunk of rows, and the flash
    /// attention holds no scores where it takes the head dimension: 128 x 256 tokens of the tiny
    /// model count 4096 rows of logits (an eighth of the composed ops' logits) and no mask; its
    /// scores count at head dimension 32 and not at 64; each layer's input counts on both paths.
    #[test]
    fn fused_kernels_count_one_chunk_of_logits() {
        let (mut cfg, mut m, plan) = tiny();
        (cfg.train.micro_batch, cfg.data.seq_len) = (128, 256);
        let weight_bytes = 4.0; // tiny_cpu's model is FP32
        let inputs = (m.num_layers * 128 * 256 * m.hidden_size) as f64 * weight_bytes;
        let logits = |rows: f64| rows * m.vocab_size as f64 * weight_bytes + inputs;
        let scores = |heads: usize| 128.0 * heads as f64 * 256.0 * 256.0 * 4.0;
        assert_eq!(m.head_dim(), 32);
        let fused = MemoryFloor::of_kernels(&cfg, &m, &plan, 1, true);
        let composed = MemoryFloor::of_kernels(&cfg, &m, &plan, 1, false);
        assert_eq!(fused.activations, logits(4096.0) + scores(m.num_heads));
        assert_eq!(composed.activations, logits(128.0 * 256.0) + scores(m.num_heads));
        assert_eq!((fused.mask, fused.model_and_states), (0.0, composed.model_and_states));
        assert!(composed.mask > 0.0);
        (m.num_heads, m.num_kv_heads) = (m.hidden_size / 64, m.hidden_size / 64);
        assert_eq!(MemoryFloor::of_kernels(&cfg, &m, &plan, 1, true).activations, logits(4096.0));
    }

    /// `bf16-mixed` holds FP32 weights and gradients as `f32`, plus the weights' BF16 copies
    /// (2 bytes per parameter), and its activations in BF16 (half of `f32`'s); `bf16` holds 2
    /// bytes of weights per parameter.
    #[test]
    fn bf16_mixed_counts_fp32_weights_their_bf16_copies_and_bf16_activations() {
        let (mut cfg, m, plan) = tiny();
        let f32_floor = MemoryFloor::of(&cfg, &m, &plan, 1);
        cfg.model.dtype = WeightDtype::Bf16Mixed;
        let mixed = MemoryFloor::of(&cfg, &m, &plan, 1);
        cfg.model.dtype = WeightDtype::Bf16;
        let bf16 = MemoryFloor::of(&cfg, &m, &plan, 1);
        let n = m.num_parameters() as f64;
        assert_eq!(mixed.model_and_states - f32_floor.model_and_states, 2.0 * n);
        assert_eq!(f32_floor.model_and_states - bf16.model_and_states, 2.0 * n);
        let scores = (cfg.train.micro_batch * m.num_heads * cfg.data.seq_len * cfg.data.seq_len * 4) as f64;
        assert_eq!(mixed.activations - scores, (f32_floor.activations - scores) / 2.0);
        assert_eq!(mixed.activations, bf16.activations);
    }

    /// The shipped CPU config fits in 1 GiB; the sizes of the issue do not fit anywhere, and
    /// the error names the part and the keys.
    #[test]
    fn absurd_sizes_are_refused_with_the_part_and_the_keys() {
        let (mut cfg, m, spec) = tiny();
        let floor = MemoryFloor::of(&cfg, &m, &spec, 1);
        floor.check(1 << 30, "1 GiB").unwrap();
        // the weights of the tiny model: 8.6M parameters, FP32 weights + FP32 gradients + fp8 states
        assert!((floor.model_and_states / m.num_parameters() as f64 - 10.0).abs() < 0.5, "{floor:?}");
        cfg.train.micro_batch = 100_000_000;
        let e = MemoryFloor::of(&cfg, &m, &spec, 1).check(64 << 30, "this host's available memory").unwrap_err().to_string();
        assert!(e.contains("is 64.0 GiB: one micro-batch's activations (logits, layer inputs, attention scores) alone take"), "{e}");
        assert!(e.ends_with("lower train.micro_batch (with train.grad_accum to keep the batch) or data.seq_len"), "{e}");
        let (cfg, mut m, spec) = tiny();
        m.max_seq_len = 1_000_000_000;
        let e = MemoryFloor::of(&cfg, &m, &spec, 1).check(64 << 30, "x").unwrap_err().to_string();
        assert!(e.contains("the causal mask alone take"), "{e}");
        let (mut cfg, base, _) = tiny();
        cfg.data.shuffle_buffer = 20_000_000;
        let floor = MemoryFloor::of(&cfg, &base, &spec, 1).with_shuffle_buffer(&cfg);
        assert_eq!(floor.shuffle_buffer, 20e6 * ((cfg.data.seq_len + 1) as f64 * 4.0 + 32.0));
        assert_eq!((floor.device_part().total(), floor.host_part().total()), (floor.total() - floor.shuffle_buffer, floor.shuffle_buffer));
        let e = floor.check(8 << 30, "x").unwrap_err().to_string();
        assert!(e.contains("the streaming shuffle buffer alone take") && e.ends_with("lower data.shuffle_buffer"), "{e}");
        m.max_seq_len = 128;
        m.hidden_size = 4_000_000;
        let e = MemoryFloor::of(&cfg, &m, &spec, 1).check(64 << 30, "x").unwrap_err().to_string();
        assert!(e.contains("the weights, gradients and states alone take"), "{e}");
    }
}
