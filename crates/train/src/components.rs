//! The [`Stateful`] components of a checkpoint, each saving and restoring its own tensors: the
//! model's weights (`model.safetensors`, HF LLaMA names, loads in `transformers`), the
//! optimizer's states (`optimizer.safetensors`: [`HostStates::state_dict`], stored codes and
//! block scales as they are, and the adaptive reset rule's state) and the data position's
//! pending tokens and shuffle buffer (`data.safetensors`).

use crate::checkpoint::{Saves, Stateful};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use lowbit_data::DataPosition;
use lowbit_optim::states::state_dict::Array;
use lowbit_optim::{HostStates, LowbitOptimizer};
use std::collections::HashMap;

/// The model's weights (a [`candle_nn::VarMap`], set in place on load).
pub struct ModelWeights<'a>(pub &'a candle_nn::VarMap);

impl Saves for ModelWeights<'_> {
    fn file(&self) -> &'static str {
        "model.safetensors"
    }
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(self.0.data().lock().unwrap().iter().map(|(k, v)| (k.clone(), v.as_tensor().clone())).collect())
    }
}

impl Stateful for ModelWeights<'_> {
    /// Every variable must be present with its shape; another dtype is converted, with a
    /// warning (the resume is then not bit-exact).
    fn load_state_dict(&mut self, tensors: HashMap<String, Tensor>) -> Result<()> {
        let data = self.0.data().lock().unwrap();
        for (name, var) in data.iter() {
            let t = tensors.get(name).with_context(|| format!("missing tensor {name} (checkpoint of another model?)"))?;
            if t.dims() != var.dims() {
                bail!("tensor {name} has shape {:?}, the model wants {:?}", t.dims(), var.dims());
            }
            if t.dtype() != var.dtype() {
                tracing::warn!("{name} is {:?}, the model is {:?}: converted (the resume is not bit-exact)", t.dtype(), var.dtype());
            }
            var.set(&t.to_dtype(var.dtype())?.to_device(var.device())?)?;
        }
        Ok(())
    }
}

/// The optimizer's states as they are saved: a borrowed view ([`HostStates::state_dict`], the
/// running optimizer's host copy).
impl Saves for HostStates<'_> {
    fn file(&self) -> &'static str {
        "optimizer.safetensors"
    }
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        HostStates::state_dict(self)
            .into_iter()
            .map(|(k, a)| {
                let t = match a {
                    Array::U8(v) => Tensor::new(v, &Device::Cpu)?,
                    Array::F32(v) => Tensor::new(v, &Device::Cpu)?,
                    Array::I64(v) => Tensor::new(v, &Device::Cpu)?,
                    Array::F64(v) => Tensor::new(v, &Device::Cpu)?,
                };
                Ok((k, t))
            })
            .collect()
    }
}

/// The optimizer on the host, before it is handed to the device: saves as its view does,
/// restores its states ([`LowbitOptimizer::load_state_dict`]).
impl Saves for LowbitOptimizer {
    fn file(&self) -> &'static str {
        self.states().file()
    }
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        Saves::state_dict(&self.states())
    }
}

impl Stateful for LowbitOptimizer {
    fn load_state_dict(&mut self, tensors: HashMap<String, Tensor>) -> Result<()> {
        for (k, t) in &tensors {
            if !matches!(t.dtype(), DType::U8 | DType::F32 | DType::I64 | DType::F64) || t.rank() != 1 {
                bail!("{k}: {:?} of shape {:?}, expected 1-D U8 codes, F32 scales or the reset rule's I64/F64", t.dtype(), t.dims());
            }
        }
        let mut get = |k: &str| {
            let t = tensors.get(k)?;
            match t.dtype() {
                DType::U8 => t.to_vec1::<u8>().ok().map(Array::U8),
                DType::F32 => t.to_vec1::<f32>().ok().map(Array::F32),
                DType::I64 => t.to_vec1::<i64>().ok().map(Array::I64),
                DType::F64 => t.to_vec1::<f64>().ok().map(Array::F64),
                _ => None,
            }
        };
        LowbitOptimizer::load_state_dict(self, &mut get)?;
        Ok(())
    }
}

/// Names of the data position's tensors in `data.safetensors`: the carry, and the shuffle
/// buffer's ids and real-token counts (streaming mode; absent in checkpoints written before
/// shuffling existed, which read in file order).
const CARRY: &str = "carry";
const BUFFER_TOKENS: &str = "buffer_tokens";
const BUFFER_VALID: &str = "buffer_valid";

/// The pending tokens of the data position (`carry`, U32) and its shuffle buffer
/// (`buffer_tokens`, `buffer_valid`, U32), kept out of `state.json` (a JSON list of them is
/// tens of MB); checkpoints written before the file existed hold the carry in `state.json`.
impl Saves for DataPosition {
    fn file(&self) -> &'static str {
        "data.safetensors"
    }
    fn required(&self) -> bool {
        false
    }
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        let u32s = |v: &Vec<u32>| Tensor::from_vec(v.clone(), v.len(), &Device::Cpu);
        Ok(vec![
            (CARRY.into(), u32s(&self.carry)?),
            (BUFFER_TOKENS.into(), u32s(&self.buffer_tokens)?),
            (BUFFER_VALID.into(), u32s(&self.buffer_valid)?),
        ])
    }
}

impl Stateful for DataPosition {
    fn load_state_dict(&mut self, tensors: HashMap<String, Tensor>) -> Result<()> {
        let t = tensors.get(CARRY).with_context(|| format!("missing tensor {CARRY}"))?;
        self.carry = t.to_vec1::<u32>().with_context(|| CARRY.to_string())?;
        for (name, v) in [(BUFFER_TOKENS, &mut self.buffer_tokens), (BUFFER_VALID, &mut self.buffer_valid)] {
            if let Some(t) = tensors.get(name) {
                *v = t.to_vec1::<u32>().with_context(|| name.to_string())?;
            }
        }
        Ok(())
    }
}
