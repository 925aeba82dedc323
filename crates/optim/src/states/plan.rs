//! Which states each tensor gets: `[optim.states]` for most, a group's
//! `[optim.states.groups.<group>]` settings over it for that group's tensors, FP32 m and v for
//! tensors under `optim.states.min_quantized_numel` (the per-parameter choices torchao and
//! bitsandbytes offer: small tensors, and chosen ones, in 32-bit states).

use crate::error::OptimError;
use crate::states::config::{StatesConfig, StatesSpec};
use crate::states::format::StateFormat;
use std::collections::BTreeMap;

/// `[optim.states]` resolved for every tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct StatesPlan {
    /// `[optim.states]` itself (its reset rule, `reset_s0` and weight rounding are every
    /// tensor's).
    pub base: StatesSpec,
    /// Each configured group's settings, merged over `base`.
    pub groups: BTreeMap<String, StatesSpec>,
    /// Tensors with fewer elements keep FP32 m and v (0 = none).
    pub min_quantized_numel: usize,
}

impl From<StatesSpec> for StatesPlan {
    /// One spec for every tensor.
    fn from(base: StatesSpec) -> Self {
        StatesPlan { base, groups: BTreeMap::new(), min_quantized_numel: 0 }
    }
}

impl StatesPlan {
    /// Resolve `[optim.states]` and each of its groups (errors name the group's key, e.g.
    /// `optim.states.groups.embed.v_format`).
    ///
    /// # Errors
    /// Any key [`StatesConfig::resolve`] refuses, in the base or in a group.
    pub fn resolve(cfg: &StatesConfig, beta2: f64) -> Result<Self, OptimError> {
        let base = cfg.resolve(beta2)?;
        let groups = cfg
            .groups
            .iter()
            .map(|(name, g)| Ok((name.clone(), g.over(cfg).resolve_at(beta2, &format!("optim.states.groups.{name}"))?)))
            .collect::<Result<_, OptimError>>()?;
        Ok(StatesPlan { base, groups, min_quantized_numel: cfg.min_quantized_numel })
    }

    /// Check that every configured group is one of the model's tensor groups `model_groups`
    /// (a typo would otherwise leave the states as they were, silently).
    ///
    /// # Errors
    /// [`OptimError::Config`] naming the group and the model's groups.
    pub fn check_groups<'a>(&self, model_groups: impl IntoIterator<Item = &'a str>) -> Result<(), OptimError> {
        let known: std::collections::BTreeSet<&str> = model_groups.into_iter().collect();
        match self.groups.keys().find(|g| !known.contains(g.as_str())) {
            None => Ok(()),
            Some(g) => Err(OptimError::Config(format!(
                "optim.states.groups.{g}: the model has no tensor group \"{g}\" (its groups: {})",
                known.into_iter().collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// The states of a tensor of group `group` and `len` elements: its group's, or the base;
    /// with FP32 m and v when it has fewer than `min_quantized_numel` elements.
    pub fn for_tensor(&self, group: &str, len: usize) -> StatesSpec {
        let spec = *self.groups.get(group).unwrap_or(&self.base);
        match len < self.min_quantized_numel {
            true => StatesSpec { m_format: StateFormat::Fp32, v_format: StateFormat::Fp32, ..spec },
            false => spec,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::format::scale::ScaleKind;

    fn plan(text: &str) -> Result<StatesPlan, String> {
        let c: StatesConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        StatesPlan::resolve(&c, 0.999).map_err(|e| e.to_string())
    }

    #[test]
    fn groups_override_the_base_key_by_key() {
        let p = plan(
            "m_format = \"fp8\"\nv_format = \"fp8\"\nblock_size = 0\nscale = \"amax\"\nv_reset_every = 300\n\
             [groups.embed]\nm_format = \"fp32\"\nv_format = \"fp32\"\n[groups.head]\nv_rounding = \"stochastic\"\nblock_size = 128",
        )
        .unwrap();
        let embed = p.for_tensor("embed", 1000);
        assert_eq!((embed.m_format, embed.v_format, embed.v_reset_every), (StateFormat::Fp32, StateFormat::Fp32, 300));
        let head = p.for_tensor("head", 1000);
        assert_eq!((head.m_format, head.block_size, head.v_scale), (StateFormat::Fp8E4M3, 128, ScaleKind::Amax));
        assert_eq!(head.v_rounding, crate::Rounding::Stochastic);
        assert_eq!(p.for_tensor("mlp", 1000), p.base);
    }

    #[test]
    fn small_tensors_keep_fp32_states() {
        let p = plan("m_format = \"fp8\"\nv_format = \"fp4\"\nmin_quantized_numel = 4096").unwrap();
        let small = p.for_tensor("norm", 4095);
        assert_eq!((small.m_format, small.v_format), (StateFormat::Fp32, StateFormat::Fp32));
        assert_eq!(p.for_tensor("norm", 4096), p.base);
    }

    #[test]
    fn bad_group_settings_name_the_group_key() {
        let e = plan("[groups.embed]\nv_format = \"fp7\"").unwrap_err();
        assert!(e.starts_with("optim.states.groups.embed.v_format:"), "{e}");
        let e = plan("[groups.embed]\nreset_s0 = 0.5").unwrap_err();
        assert!(e.contains("unknown field `reset_s0`"), "{e}");
        let e = plan("reset = \"adaptive\"\n[groups.head]\nv_reset_every = 100").unwrap_err();
        assert!(e.contains("optim.states.groups.head.v_reset_every") && e.contains("must be 0"), "{e}");
        let p = plan("[groups.embedding]\nm_format = \"fp32\"").unwrap();
        let e = p.check_groups(["embed", "mlp", "mlp"]).unwrap_err().to_string();
        assert!(e.contains("optim.states.groups.embedding") && e.contains("embed, mlp"), "{e}");
        assert!(plan("[groups.embed]\nm_format = \"fp32\"").unwrap().check_groups(["embed"]).is_ok());
    }

    #[test]
    fn unset_groups_leave_the_resolved_toml_as_before() {
        let text = toml::to_string(&StatesConfig::default()).unwrap();
        assert!(!text.contains("groups") && !text.contains("min_quantized_numel"), "{text}");
        let mut c = StatesConfig::default();
        c.groups.insert("embed".into(), crate::states::config::GroupStates { m_format: Some("fp32".into()), ..Default::default() });
        let text = toml::to_string(&c).unwrap();
        assert!(text.contains("[groups.embed]\nm_format = \"fp32\""), "{text}");
    }
}
