//! The model's passes, composed or fused by [`Kernels`](crate::kernels::Kernels): logits ([`Llama::forward`]), the
//! loss ([`Llama::loss`]) and the training pass ([`Llama::training_pass`], whose backward gives
//! each weight's gradient or adds it to a [`GradSum`]). The composed ones are candle ops
//! under autograd (each layer's modules in order, `loss.backward()`); the fused ones run the
//! ops of `crate::fused` as llm.c writes a model (`explicit`, below): each op's forward, then
//! each op's backward in reverse order.
//!
//! Mixed precision ([`Llama::with_compute_dtype`]): each pass runs on
//! [`Llama::for_compute`]'s copy of the model in the compute dtype; the gradients are handed to
//! the master weights (by candle's backward of the cast on the composed path, by the explicit
//! backward's `Sink` on the fused one).

use crate::grad_sum::GradSum;
#[cfg(feature = "cuda")]
use crate::kernels::Kernels;
use crate::llama::{Block, Llama};
use crate::mlp::linear;
use crate::rope::Rope;
use candle_core::backprop::GradStore;
use candle_core::{Module, Result, Tensor};
use std::borrow::Cow;

impl Llama {
    /// Final hidden states after `model.norm`: `input` `[B, T]` u32 token ids (T ≤
    /// `max_seq_len`) → `[B, T, H]` in the compute dtype ([`Llama::compute_dtype`]).
    pub fn forward_hidden(&self, input: &Tensor) -> Result<Tensor> {
        if let Cow::Owned(m) = self.for_compute()? {
            return m.forward_hidden(input);
        }
        self.check_seq_len(input.dim(1)?)?;
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            return explicit::hidden(self, input);
        }
        self.composed_hidden(input)
    }

    /// Next-token logits: `input` `[B, T]` u32 token ids → `[B, T, V]` in the compute dtype
    /// ([`Llama::compute_dtype`]: the weights' unless mixed). Position `t` only sees tokens
    /// `0..=t`.
    pub fn forward(&self, input: &Tensor) -> Result<Tensor> {
        if let Cow::Owned(m) = self.for_compute()? {
            return m.forward(input);
        }
        let hidden = self.forward_hidden(input)?;
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            return crate::fused::linear::forward(&hidden, &self.lm_head);
        }
        linear(&hidden, &self.lm_head)
    }

    /// Mean next-token loss over the positions where `mask` is nonzero, as
    /// [`masked_cross_entropy`](crate::loss::masked_cross_entropy) of [`Llama::forward`]: `input`,
    /// `target` `[B, T]` u32, `mask` `[B, T]` (1 = counts) → F32 scalar. With
    /// [`crate::kernels::Kernels::Composed`] differentiable under candle's
    /// autograd; with [`crate::kernels::Kernels::Fused`] the LM head and the loss
    /// run in chunks of rows (`crate::fused::lm_head::loss`: the `[B, T, V]` logits are never
    /// held) and no graph is kept (validation; train with [`Llama::training_pass`]).
    pub fn loss(&self, input: &Tensor, target: &Tensor, mask: &Tensor) -> Result<Tensor> {
        if let Cow::Owned(m) = self.for_compute()? {
            return m.loss(input, target, mask);
        }
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            self.check_seq_len(input.dim(1)?)?;
            return explicit::loss(self, input, target, mask);
        }
        crate::loss::masked_cross_entropy(&self.forward(input)?, target, mask)
    }

    /// The forward pass for training on `scale` times [`Llama::loss`]; its
    /// [`TrainingPass::backward`] gives the gradient of every weight. With
    /// [`crate::kernels::Kernels::Fused`] the backward is explicit (`explicit`:
    /// each op's backward function in reverse order, each gradient written once); with
    /// [`crate::kernels::Kernels::Composed`] it is candle's `loss.backward()`. Mixed precision
    /// ([`Llama::with_compute_dtype`]): the pass runs on a copy of the weights in the compute
    /// dtype, and the gradients are those of the master weights, in their dtype.
    ///
    /// `input_ids`: the values of `input` on the host (row-major, `B * T`), when the caller
    /// has them (a trainer copied them to the device): the fused backward groups the
    /// positions by id from them, where it would otherwise read `input` back from the device
    /// (a wait at the start of every pass); the composed path does not need them. They must
    /// equal `input`'s values: other ids give the embedding wrong gradients. Errors: a
    /// length other than `B * T`.
    pub fn training_pass(
        &self,
        input: &Tensor,
        target: &Tensor,
        mask: &Tensor,
        input_ids: Option<&[u32]>,
        scale: f64,
    ) -> Result<TrainingPass<'_>> {
        if let Some(ids) = input_ids {
            if ids.len() != input.elem_count() {
                candle_core::bail!("training_pass: {} host input ids for an input of shape {:?}", ids.len(), input.shape());
            }
        }
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            self.check_seq_len(input.dim(1)?)?;
            return Ok(TrainingPass(Pass::Explicit(explicit::Forward::run(self, input, target, mask, input_ids, scale)?)));
        }
        let loss = self.loss(input, target, mask)?.affine(scale, 0.0)?;
        Ok(TrainingPass(Pass::Autograd(loss, self)))
    }
}

impl Llama {
    /// The composed ops' final hidden states (after `model.norm`) of `input` `[B, T]` u32:
    /// `[B, T, H]`, under candle's autograd.
    pub(crate) fn composed_hidden(&self, input: &Tensor) -> Result<Tensor> {
        let (b, t) = input.dims2()?;
        let mask = self.causal_mask(t)?;
        let mut x = self.embed_tokens.index_select(&input.flatten_all()?, 0)?.reshape((b, t, self.cfg.hidden_size))?;
        for layer in &self.layers {
            x = layer.forward(&x, &self.rope, &mask)?;
        }
        self.norm.forward(&x)
    }
}

impl Block {
    /// One layer's composed forward: `x + attn(norm(x))`, then `h + mlp(norm(h))`.
    fn forward(&self, x: &Tensor, rope: &Rope, mask: &Tensor) -> Result<Tensor> {
        let attn = self.self_attn.forward(&self.input_layernorm.forward(x)?, rope, mask)?;
        let h = (x + attn)?;
        &h + self.mlp.forward(&self.post_attention_layernorm.forward(&h)?)?
    }
}

/// A forward pass for training ([`Llama::training_pass`]).
pub struct TrainingPass<'a>(Pass<'a>);

enum Pass<'a> {
    Autograd(Tensor, &'a Llama),
    #[cfg(feature = "cuda")]
    Explicit(explicit::Forward<'a>),
}

impl TrainingPass<'_> {
    /// `scale` times the mean loss: F32 scalar (tracked by autograd only on the autograd path).
    pub fn loss(&self) -> &Tensor {
        match &self.0 {
            Pass::Autograd(loss, _) => loss,
            #[cfg(feature = "cuda")]
            Pass::Explicit(f) => &f.loss,
        }
    }

    /// The gradient of [`TrainingPass::loss`] for every weight, keyed by the weight tensors
    /// as `Tensor::backward` keys them, in the weights' dtype (with mixed precision: keyed by
    /// the master weights, in their dtype, e.g. FP32 gradients of BF16 products).
    pub fn backward(self) -> Result<GradStore> {
        match self.0 {
            Pass::Autograd(loss, _) => loss.backward(),
            #[cfg(feature = "cuda")]
            Pass::Explicit(f) => Ok(f.backward(None)?.expect("a store of its own")),
        }
    }

    /// Adds the gradient of [`TrainingPass::loss`] for every weight to its FP32 sum in `sum`
    /// (a weight without one gets one): gradient accumulation over the micro-batches of a
    /// step. On the composed path each weight's gradient is widened and added; on the fused
    /// path the matrix products of the weights' gradients accumulate into the sums in place
    /// (FP32 products, without rounding each pass's gradient to the weights' dtype first), the
    /// other gradients are widened and added. With mixed precision the sums are keyed by the
    /// master weights.
    pub fn accumulate(self, sum: &mut GradSum) -> Result<()> {
        match self.0 {
            Pass::Autograd(loss, model) => {
                let grads = loss.backward()?;
                for w in model.weights() {
                    if let Some(g) = grads.get(w) {
                        sum.add(w, g)?;
                    }
                }
            }
            #[cfg(feature = "cuda")]
            Pass::Explicit(f) => {
                f.backward(Some(sum))?;
            }
        }
        Ok(())
    }
}

/// The fused model's passes, as llm.c writes them: the forward runs each op's forward
/// function and, for training, keeps what each op's backward needs; the backward calls the
/// ops' backward functions in reverse order. No candle autograd graph: each gradient is
/// written once, and no separate add runs. The residual stream's adds run inside the norms
/// that follow them (forward: `x + delta` with the norm; backward: the residual gradient
/// with the norm's input gradient), and the q, k and v projections' output gradients are
/// written side by side into one buffer, so that their backward runs as one projection of
/// the stacked `[3d, d]` weight (one product for the normed input's gradient, one for the
/// three weights'). The reference is the composed model ([`Llama`](crate::llama::Llama)
/// with [`Kernels::Composed`](crate::kernels::Kernels::Composed); tested against it in
/// `fused_parity`).
#[cfg(feature = "cuda")]
mod explicit {
    use crate::fused::{alloc, attention, cuda_device, embedding, linear, lm_head, mlp, norm, rope, wrap, Columns, WeightGrad};
    use crate::grad_sum::GradSum;
    use crate::llama::Llama;
    use candle_core::backprop::GradStore;
    use candle_core::{Result, Tensor, TensorId};
    use std::borrow::Cow;
    use std::collections::HashMap;

    /// What one layer's backward needs from its forward: the layer's input, the normed input,
    /// q and k after RoPE (`[B, heads, T, d]`), the v projection, the attention output and its
    /// rows' log-sum-exp (the FlashAttention-2 kernels), the residual stream after attention, its
    /// norm, the packed gate/up weight and product, and the SwiGLU output.
    struct Saved {
        x: Tensor,
        h1: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn: Tensor,
        lse: Option<Tensor>,
        mid: Tensor,
        h2: Tensor,
        packed: Tensor,
        gate_up: Tensor,
        act: Tensor,
    }

    /// The residual stream after the last layer: `x` plus `delta` (the last MLP's output, not yet
    /// added: the final norm adds it), and with `keep` every layer's [`Saved`].
    fn layers(model: &Llama, ids: &Tensor, (b, t): (usize, usize), keep: bool) -> Result<(Tensor, Tensor, Vec<Saved>)> {
        let cfg = &model.cfg;
        let (cos, sin, scale) = (model.rope.cos(), model.rope.sin(), 1.0 / (cfg.head_dim() as f64).sqrt());
        let mut x = embedding::forward(&model.embed_tokens, ids)?.reshape((b, t, cfg.hidden_size))?;
        let mut delta: Option<Tensor> = None;
        let mut saved = Vec::with_capacity(if keep { model.layers.len() } else { 0 });
        for layer in &model.layers {
            let (a, m, n1, n2) = (&layer.self_attn, &layer.mlp, &layer.input_layernorm, &layer.post_attention_layernorm);
            let (x_in, h1) = norm::forward(&x, delta.as_ref(), &n1.weight, n1.eps)?;
            let q = rope::forward(&linear::forward(&h1, &a.q)?, cos, sin, cfg.num_heads)?;
            let k = rope::forward(&linear::forward(&h1, &a.k)?, cos, sin, cfg.num_heads)?;
            let v = linear::forward(&h1, &a.v)?;
            let (attn, lse) = attention::forward(&q, &k, &v, scale)?;
            let (mid, h2) = norm::forward(&x_in, Some(&linear::forward(&attn, &a.o)?), &n2.weight, n2.eps)?;
            let packed = mlp::pack(&m.gate, &m.up)?;
            let (act, gate_up) = mlp::forward(&h2, &packed, cfg.intermediate_size)?;
            delta = Some(linear::forward(&act, &m.down)?);
            x = mid.clone();
            if keep {
                saved.push(Saved { x: x_in, h1, q, k, v, attn, lse, mid, h2, packed, gate_up, act });
            }
        }
        let delta = delta.ok_or_else(|| candle_core::Error::Msg("the model has no layers".into()))?;
        Ok((x, delta, saved))
    }

    /// The final hidden states (after `model.norm`) of `input` `[B, T]` u32: `[B, T, H]` in the
    /// weights' dtype.
    pub(crate) fn hidden(model: &Llama, input: &Tensor) -> Result<Tensor> {
        let (b, t) = input.dims2()?;
        let (x, delta, _) = layers(model, &input.flatten_all()?.contiguous()?, (b, t), false)?;
        Ok(norm::forward(&x, Some(&delta), &model.norm.weight, model.norm.eps)?.1)
    }

    /// The mean next-token loss over the positions where `mask` is nonzero (F32 scalar), the
    /// LM head and the loss in chunks of rows ([`lm_head::loss`]); no gradient work.
    pub(crate) fn loss(model: &Llama, input: &Tensor, target: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let hidden = hidden(model, input)?;
        let (b, t, h) = hidden.dims3()?;
        let (target, weight) = crate::loss::flat_weights(target, mask, b * t)?;
        lm_head::loss(&hidden.reshape((b * t, h))?, &model.lm_head, &target, &weight)
    }

    /// A training forward pass whose [`Forward::backward`] gives the weights' gradients.
    pub(crate) struct Forward<'a> {
        /// The model the pass runs: `master` itself, or its copy in the compute dtype
        /// ([`Llama::for_compute`]).
        model: Cow<'a, Llama>,
        /// The model whose weights the gradients are of.
        master: &'a Llama,
        /// `scale` times the mean loss (F32 scalar).
        pub(crate) loss: Tensor,
        ids: embedding::Grouping,
        saved: Vec<Saved>,
        /// The final norm's input `[B, T, H]`, the gradient of its output, the LM head's gradient
        /// (F32: rounded to the weight's dtype or added to a sum by the backward).
        x: Tensor,
        d_hidden: Tensor,
        d_head: Tensor,
    }

    impl<'a> Forward<'a> {
        /// The forward pass of `model` on `input`/`target`/`mask` (`[B, T]`) for `scale` times
        /// the mean loss; `input_ids`: `input`'s values on the host, if the caller has them
        /// (else read back here). The LM head's gradients are computed here
        /// ([`lm_head::loss_and_grads`]). With mixed precision the pass runs on `master`'s copy
        /// in the compute dtype.
        pub(crate) fn run(
            master: &'a Llama,
            input: &Tensor,
            target: &Tensor,
            mask: &Tensor,
            input_ids: Option<&[u32]>,
            scale: f64,
        ) -> Result<Self> {
            let compute = master.for_compute()?;
            let model = &*compute;
            let (b, t) = input.dims2()?;
            let h = model.cfg.hidden_size;
            let ids = input.flatten_all()?.contiguous()?;
            // the ids on the host (read back now, while the device is idle or about to be, unless
            // the caller has them), grouped on a second core while this one launches the layers
            // (at LLaMA-20M the device runs them faster than one core can do both): the
            // backward then waits for no read
            let read;
            let host_ids = match input_ids {
                Some(h) => h,
                None => {
                    read = ids.to_vec1::<u32>()?;
                    &read[..]
                }
            };
            let vocab = model.cfg.vocab_size;
            let (layers_out, grouped) = std::thread::scope(|s| {
                let grouping = s.spawn(|| embedding::HostGrouping::new(host_ids, vocab));
                // (a panic there is this thread's, with its message)
                (layers(model, &ids, (b, t), true), grouping.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            });
            let (x, delta, saved) = layers_out?;
            let ids = grouped?.upload(input.device())?;
            let (x, hidden) = norm::forward(&x, Some(&delta), &model.norm.weight, model.norm.eps)?;
            let (target, weight) = crate::loss::flat_weights(target, mask, b * t)?;
            let (loss, d_hidden, d_head) = lm_head::loss_and_grads(&hidden.reshape((b * t, h))?, &model.lm_head, &target, &weight, scale)?;
            let d_hidden = d_hidden.reshape((b, t, h))?;
            Ok(Forward { model: compute, master, loss, ids, saved, x, d_hidden, d_head })
        }

        /// The gradient of the loss for every weight, keyed by the weight tensors as
        /// `Tensor::backward` keys them, in the weights' dtype (`sum: None`: returned); or, with
        /// `sum: Some(sums)`, each gradient added to that weight's FP32 sum (a weight without one
        /// gets one; `None` returned): the matrix products accumulate into the sums in place
        /// ([`WeightGrad::Sum`]); the norms', the embedding's and the LM head's gradients are
        /// added out of place.
        pub(crate) fn backward(self, sum: Option<&mut GradSum>) -> Result<Option<GradStore>> {
            let model = &*self.model;
            let (cos, sin, scale) = (model.rope.cos(), model.rope.sin(), 1.0 / (model.cfg.head_dim() as f64).sqrt());
            // mixed precision: each weight the ops see is the copy of a master weight
            let master = match &self.model {
                Cow::Borrowed(_) => HashMap::new(),
                Cow::Owned(m) => m.weights().into_iter().zip(self.master.weights()).map(|(c, w)| (c.id(), w.clone())).collect(),
            };
            let mut out = Sink {
                to: match sum {
                    Some(s) => To::Sum(s),
                    None => To::Own(GradStore::default()),
                },
                master,
            };
            out.add(&model.lm_head, self.d_head)?;
            let (mut dx, dw) = norm::backward(&self.x, &model.norm.weight, &self.d_hidden, None, model.norm.eps)?;
            out.add(&model.norm.weight, dw)?;
            for (layer, s) in model.layers.iter().zip(self.saved).rev() {
                let (a, m, n1, n2) = (&layer.self_attn, &layer.mlp, &layer.input_layernorm, &layer.post_attention_layernorm);
                // the weights whose gradients come from products, in the order the backward makes them
                let products_of = [&m.down, &m.gate, &m.up, &a.o, &a.q, &a.k, &a.v];
                let prev: Vec<Option<Tensor>> = products_of.iter().map(|w| out.sum_of(w)).collect();
                let to: Vec<WeightGrad> = prev.iter().map(|p| out.target(p)).collect();
                // x_out = mid + down(act); mid = x + o(attn)
                let (d_act, dw_down) = linear::backward(&s.act, &m.down, &dx, to[0])?;
                let (d_h2, dw_gate, dw_up) =
                    mlp::backward(&s.h2, &s.packed, model.cfg.intermediate_size, &s.gate_up, &d_act, [to[1], to[2]])?;
                let (d_mid, dw_norm2) = norm::backward(&s.mid, &n2.weight, &d_h2, Some(&dx), n2.eps)?;
                let (d_attn, dw_o) = linear::backward(&s.attn, &a.o, &d_mid, to[3])?;
                // the q, k, v projections' output gradients side by side: [B, T, 3 · heads · d]
                let (b, t, hd) = s.v.dims3()?;
                let qkv = wrap(alloc(&cuda_device(&s.v)?, s.v.dtype(), 3 * b * t * hd)?.0, (b, t, 3 * hd));
                let slot = |i: usize| Some(Columns { buf: &qkv, first: i * hd });
                let (dq, dk, _) = attention::backward(&s.q, &s.k, &s.v, &s.attn, s.lse.as_ref(), &d_attn, scale, slot(2))?;
                rope::backward(&dq, cos, sin, slot(0))?;
                rope::backward(&dk, cos, sin, slot(1))?;
                let (d_h1, dw_qkv) = linear::backward_stacked(&s.h1, &[&a.q, &a.k, &a.v], &qkv, &to[4..7])?;
                let (d_x, dw_norm1) = norm::backward(&s.x, &n1.weight, &d_h1, Some(&d_mid), n1.eps)?;
                dx = d_x;
                let products = [dw_down, dw_gate, dw_up, dw_o].into_iter().chain(dw_qkv);
                for (w, g) in products_of.into_iter().zip(products) {
                    out.put(w, g)?;
                }
                out.add(&n2.weight, dw_norm2)?;
                out.add(&n1.weight, dw_norm1)?;
            }
            let d_embed = embedding::backward(&model.embed_tokens, &self.ids, &dx.flatten_to(1)?)?;
            out.add(&model.embed_tokens, d_embed)?;
            Ok(match out.to {
                To::Own(g) => Some(g),
                To::Sum(_) => None,
            })
        }
    }

    /// Where [`Forward::backward`] puts the weights' gradients: a store of its own (the weights'
    /// dtype), or FP32 sums over passes in the caller's store; keyed by the master weights.
    struct Sink<'s> {
        to: To<'s>,
        /// With mixed precision, the master weight of each compute copy (by the copy's id);
        /// empty when the pass runs on the master weights themselves.
        master: HashMap<TensorId, Tensor>,
    }

    enum To<'s> {
        Own(GradStore),
        Sum(&'s mut GradSum),
    }

    impl Sink<'_> {
        /// The weight whose gradient `w`'s is: its master, or `w` itself.
        fn key(&self, w: &Tensor) -> Tensor {
            self.master.get(&w.id()).unwrap_or(w).clone()
        }

        /// The running sum of `w`'s gradient (`Sum` only).
        fn sum_of(&self, w: &Tensor) -> Option<Tensor> {
            match &self.to {
                To::Sum(s) => s.get(&self.key(w)).cloned(),
                To::Own(_) => None,
            }
        }

        /// How an op writes a gradient whose running sum is `prev` ([`Sink::sum_of`]).
        fn target<'a>(&self, prev: &'a Option<Tensor>) -> WeightGrad<'a> {
            match self.to {
                To::Own(_) => WeightGrad::New,
                To::Sum(_) => WeightGrad::Sum(prev.as_ref()),
            }
        }

        /// Stores what an op returned for `w` under [`Sink::target`]: its gradient (in the
        /// master weight's dtype) or new sum.
        fn put(&mut self, w: &Tensor, g: Tensor) -> Result<()> {
            let w = self.key(w);
            match &mut self.to {
                To::Own(s) => {
                    s.insert(&w, g.to_dtype(w.dtype())?);
                }
                To::Sum(s) => s.set(&w, g),
            }
            Ok(())
        }

        /// Stores `w`'s gradient `g` (the weight's dtype, or F32) from an op that writes no sums:
        /// in the (master) weight's dtype, or widened to FP32 and added to the running sum.
        fn add(&mut self, w: &Tensor, g: Tensor) -> Result<()> {
            let w = self.key(w);
            match &mut self.to {
                To::Own(s) => {
                    s.insert(&w, g.to_dtype(w.dtype())?);
                }
                To::Sum(s) => s.add(&w, &g)?,
            }
            Ok(())
        }
    }
}
