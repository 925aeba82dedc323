//! The fused model's training pass with an explicit backward, as llm.c writes it: the
//! forward runs the fused ops without candle's autograd graph and keeps what each op's
//! backward needs; the backward calls the ops' own backward passes in reverse order.
//!
//! Why: candle's `Tensor::backward` zero-fills a gradient buffer and adds into it for every
//! edge of the graph (about 17 per layer here: `badd` kernels were 23% of the kernel time of
//! a BF16 step, 30 ms of an FP32 one). Here each gradient is written once, and no separate
//! add runs: the residual stream's adds run inside the norms that follow them (forward:
//! `x + delta` with the norm; backward: the residual gradient with the norm's input
//! gradient), and the normed input's three gradients from the q, k and v projections are
//! summed by cuBLAS into one output. Same ops, same kernels, same order of every reduction as
//! the autograd path; the sums of gradient contributions differ in order only (tested
//! against it in `fused_parity`).

use super::attention::Attention;
use super::embedding::Embedding;
use super::linear::Linear;
use super::mlp::GateUp;
use super::norm::RmsNorm;
use super::rope::Rope;
use crate::llama::Llama;
use candle_core::backprop::GradStore;
use candle_core::{CustomOp2, CustomOp3, Result, Tensor};
use std::sync::Mutex;

/// What one layer's backward needs from its forward.
struct Saved {
    /// The layer's input, the normed input, the q and k projections before RoPE, q and k
    /// after it (`[B, heads, T, d]`), the v projection, the attention output and its rows'
    /// log-sum-exp (the tensor-core attention), the residual stream after attention, its
    /// norm, the gate/up op (it keeps its product) and its output.
    x: Tensor,
    h1: Tensor,
    q_proj: Tensor,
    k_proj: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn: Tensor,
    lse: Option<Tensor>,
    mid: Tensor,
    h2: Tensor,
    gate_up: GateUp,
    act: Tensor,
}

fn some(g: Option<Tensor>, what: &str) -> Result<Tensor> {
    g.ok_or_else(|| candle_core::Error::Msg(format!("explicit backward: no gradient for {what}")))
}

/// A training forward pass whose [`Forward::backward`] gives the weights' gradients.
pub(crate) struct Forward<'a> {
    model: &'a Llama,
    /// `scale` times the mean loss (F32 scalar).
    pub(crate) loss: Tensor,
    ids: Tensor,
    saved: Vec<Saved>,
    /// The last layer's output `[B, T, H]` and the gradient of the final norm's output.
    x: Tensor,
    d_hidden: Tensor,
    d_head: Tensor,
}

impl<'a> Forward<'a> {
    /// The forward pass of `model` (fused kernels, as many key/value heads as query heads)
    /// on `input`/`target`/`mask` (`[B, T]`) for `scale` times the mean loss. The LM head's
    /// gradients are computed here (see [`super::lm_head_cross_entropy`]).
    pub(crate) fn run(model: &'a Llama, input: &Tensor, target: &Tensor, mask: &Tensor, scale: f64) -> Result<Self> {
        let cfg = &model.cfg;
        let (b, t) = input.dims2()?;
        let h = cfg.hidden_size;
        let (cos, sin) = (model.rope.cos(), model.rope.sin());
        let (rope, attention) = ops(model);
        let ids = input.flatten_all()?.contiguous()?;
        // The residual stream: `x` plus `delta`, the last block's output not yet added: each
        // add runs inside the norm that follows it ([`RmsNorm::add_forward`]).
        let mut x = model.embed_tokens.apply_op2_no_bwd(&ids, &Embedding)?.reshape((b, t, h))?;
        let mut delta: Option<Tensor> = None;
        let mut saved = Vec::with_capacity(model.layers.len());
        for layer in &model.layers {
            let (a, m) = (&layer.self_attn, &layer.mlp);
            let (x_in, h1) = add_norm(&layer.input_layernorm, &x, delta.as_ref())?;
            let (q_proj, k_proj, v) = (h1.apply_op2_no_bwd(&a.q, &Linear)?, h1.apply_op2_no_bwd(&a.k, &Linear)?, h1.apply_op2_no_bwd(&a.v, &Linear)?);
            let (q, k) = (q_proj.apply_op3_no_bwd(cos, sin, &rope)?, k_proj.apply_op3_no_bwd(cos, sin, &rope)?);
            let (attn, lse) = attention.forward(&q, &k, &v)?;
            let (mid, h2) = add_norm(&layer.post_attention_layernorm, &x_in, Some(&attn.apply_op2_no_bwd(&a.o, &Linear)?))?;
            let gate_up = GateUp { saved: Mutex::new(None) };
            let act = h2.apply_op3_no_bwd(&m.gate, &m.up, &gate_up)?;
            delta = Some(act.apply_op2_no_bwd(&m.down, &Linear)?);
            x = mid.clone();
            saved.push(Saved { x: x_in, h1, q_proj, k_proj, q, k, v, attn, lse, mid, h2, gate_up, act });
        }
        let (x, hidden) = add_norm(&model.norm, &x, delta.as_ref())?;
        let (target, weight) = crate::loss::flat_weights(target, mask, b * t)?;
        let (loss, d_hidden, d_head) = super::lm_head::loss_and_grads(&hidden.reshape((b * t, h))?, &model.lm_head, &target, &weight, scale)?;
        Ok(Forward { model, loss, ids, saved, x, d_hidden: d_hidden.reshape((b, t, h))?, d_head })
    }

    /// The gradient of the loss for every weight, keyed by the weight tensors as
    /// `Tensor::backward` keys them. Every op's backward ignores its output argument
    /// (`_res`); the output's gradient stands in for it.
    pub(crate) fn backward(self) -> Result<GradStore> {
        let model = self.model;
        let (cos, sin) = (model.rope.cos(), model.rope.sin());
        let (rope, attention) = ops(model);
        let mut grads = GradStore::default();
        grads.insert(&model.lm_head, self.d_head);
        let (mut dx, dw) = norm(&model.norm).backward(&self.x, &model.norm.weight, &self.d_hidden, None)?;
        grads.insert(&model.norm.weight, dw);
        for (layer, s) in model.layers.iter().zip(self.saved).rev() {
            let (a, m) = (&layer.self_attn, &layer.mlp);
            // x_out = mid + down(act); mid = x + o(attn)
            let (d_act, dw_down) = Linear.bwd(&s.act, &m.down, &dx, &dx)?;
            let d_act = some(d_act, "the MLP activation")?;
            let (d_h2, dw_gate, dw_up) = s.gate_up.bwd(&s.h2, &m.gate, &m.up, &d_act, &d_act)?;
            let d_h2 = some(d_h2, "the MLP input")?;
            let (d_mid, dw_norm2) = norm(&layer.post_attention_layernorm).backward(&s.mid, &layer.post_attention_layernorm.weight, &d_h2, Some(&dx))?;
            let (d_attn, dw_o) = Linear.bwd(&s.attn, &a.o, &d_mid, &d_mid)?;
            let d_attn = some(d_attn, "the attention output")?;
            let (dq, dk, dv) = attention.backward(&s.q, &s.k, &s.v, &s.attn, s.lse.as_ref(), &d_attn)?;
            let dq_proj = some(rope.bwd(&s.q_proj, cos, sin, &dq, &dq)?.0, "the q projection")?;
            let dk_proj = some(rope.bwd(&s.k_proj, cos, sin, &dk, &dk)?.0, "the k projection")?;
            let (d_h1, dw_qkv) = Linear::backward_shared_input(&s.h1, &[&a.q, &a.k, &a.v], &[&dq_proj, &dk_proj, &dv])?;
            let [dw_q, dw_k, dw_v]: [Tensor; 3] = dw_qkv.try_into().map_err(|_| candle_core::Error::Msg("three projections".into()))?;
            let (d_x, dw_norm1) = norm(&layer.input_layernorm).backward(&s.x, &layer.input_layernorm.weight, &d_h1, Some(&d_mid))?;
            dx = d_x;
            for (w, g) in [
                (&m.down, dw_down),
                (&m.gate, dw_gate),
                (&m.up, dw_up),
                (&layer.post_attention_layernorm.weight, Some(dw_norm2)),
                (&a.o, dw_o),
                (&a.q, Some(dw_q)),
                (&a.k, Some(dw_k)),
                (&a.v, Some(dw_v)),
                (&layer.input_layernorm.weight, Some(dw_norm1)),
            ] {
                grads.insert(w, some(g, "a weight")?);
            }
        }
        let dx = dx.flatten_to(1)?;
        let (d_embed, _) = Embedding.bwd(&model.embed_tokens, &self.ids, &dx, &dx)?;
        grads.insert(&model.embed_tokens, some(d_embed, "model.embed_tokens")?);
        Ok(grads)
    }
}

/// The RoPE and attention ops of `model`'s layers.
fn ops(model: &Llama) -> (Rope, Attention) {
    let cfg = &model.cfg;
    (Rope { heads: cfg.num_heads }, Attention { scale: (1.0 / (cfg.head_dim() as f64).sqrt()) as f32 })
}

/// `norm(x + delta)` (the add fused into the norm) and the sum, or `norm(x)` and `x`.
fn add_norm(n: &crate::norm::RmsNorm, x: &Tensor, delta: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
    match delta {
        Some(d) => norm(n).add_forward(x, d, &n.weight),
        None => Ok((x.clone(), x.apply_op2_no_bwd(&n.weight, &norm(n))?)),
    }
}

/// The fused op of a model norm.
fn norm(n: &crate::norm::RmsNorm) -> RmsNorm {
    RmsNorm { eps: n.eps as f32 }
}
