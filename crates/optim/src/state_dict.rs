//! The optimizer's states as named arrays (PyTorch's `state_dict`): what a checkpoint stores,
//! each state's stored codes and block scales as they are, never dequantized. The trainer's
//! checkpoint writes them to a file without knowing what they hold.

use crate::error::OptimError;
use crate::optimizer::LowbitAdamW;

/// One stored array of [`LowbitAdamW::state_dict`].
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// Stored codes, `[bytes]` (packed: FP4 two per byte; FP32/BF16 states their words'
    /// little-endian bytes).
    U8(Vec<u8>),
    /// Block scales, `[blocks]` (one per tensor with `block_size = 0`).
    F32(Vec<f32>),
}

impl LowbitAdamW {
    /// Every state's arrays by name, in tensor order: `<param>.m.codes`, `<param>.v.codes` (U8)
    /// and, for scaled formats, `<param>.m.scales`, `<param>.v.scales` (F32).
    pub fn state_dict(&self) -> Vec<(String, Array)> {
        let mut out = Vec::new();
        for t in &self.tensors {
            for (kind, s) in [("m", &t.m), ("v", &t.v)] {
                out.push((format!("{}.{kind}.codes", t.info.name), Array::U8(s.code_bytes())));
                if !s.scales.is_empty() {
                    out.push((format!("{}.{kind}.scales", t.info.name), Array::F32(s.scales.clone())));
                }
            }
        }
        out
    }

    /// Restore every state from `get` (an array of [`Self::state_dict`] by name).
    ///
    /// # Errors
    /// A missing array, one of the other kind, or one whose length does not fit the state
    /// (another model, format or block size), naming it.
    pub fn load_state_dict(&mut self, get: &mut dyn FnMut(&str) -> Option<Array>) -> Result<(), OptimError> {
        let missing = |key: &str| OptimError::State(format!("missing {key}"));
        for t in &mut self.tensors {
            for (kind, s) in [("m", &mut t.m), ("v", &mut t.v)] {
                let key = format!("{}.{kind}.codes", t.info.name);
                match get(&key).ok_or_else(|| missing(&key))? {
                    Array::U8(codes) => s.set_code_bytes(&codes).map_err(|e| OptimError::State(format!("{key}: {e}")))?,
                    Array::F32(_) => return Err(OptimError::State(format!("{key}: F32, expected U8 codes"))),
                }
                if !s.scales.is_empty() {
                    let key = format!("{}.{kind}.scales", t.info.name);
                    let Array::F32(scales) = get(&key).ok_or_else(|| missing(&key))? else {
                        return Err(OptimError::State(format!("{key}: U8, expected F32 scales")));
                    };
                    if scales.len() != s.scales.len() {
                        return Err(OptimError::State(format!("{key} has {} scales, expected {}", scales.len(), s.scales.len())));
                    }
                    s.scales = scales;
                }
            }
        }
        Ok(())
    }
}
