//! Parameter groups (for per-group optimizer settings and statistics).

use std::fmt;

/// Which part of the network a tensor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParamGroup {
    /// `model.embed_tokens.weight`.
    Embedding,
    /// `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`.
    Attention,
    /// `model.layers.{i}.mlp.{gate,up,down}_proj.weight`.
    Mlp,
    /// Every RMSNorm gain (`input_layernorm`, `post_attention_layernorm`, `model.norm`).
    Norm,
    /// `lm_head.weight`.
    Head,
}

impl ParamGroup {
    /// All groups, in network order.
    pub const ALL: [ParamGroup; 5] = [ParamGroup::Embedding, ParamGroup::Attention, ParamGroup::Mlp, ParamGroup::Norm, ParamGroup::Head];

    /// Short name: `"embed"`, `"attn"`, `"mlp"`, `"norm"`, `"head"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ParamGroup::Embedding => "embed",
            ParamGroup::Attention => "attn",
            ParamGroup::Mlp => "mlp",
            ParamGroup::Norm => "norm",
            ParamGroup::Head => "head",
        }
    }
}

impl fmt::Display for ParamGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Group of an HF LLaMA tensor name, or `None` if the name is not one this crate produces.
pub fn try_param_group(name: &str) -> Option<ParamGroup> {
    if name.contains("embed_tokens") {
        Some(ParamGroup::Embedding)
    } else if name.contains("lm_head") {
        Some(ParamGroup::Head)
    } else if name.contains("self_attn") {
        Some(ParamGroup::Attention)
    } else if name.contains(".mlp.") {
        Some(ParamGroup::Mlp)
    } else if name.contains("norm") {
        Some(ParamGroup::Norm)
    } else {
        None
    }
}
