//! The update rules on a CUDA device: the kernels' ABI, the argument structs and constants that
//! the Rust side and `kernels/optim/*.cu` must agree on ([`abi`], checked against the kernel
//! files by a CPU test), and, with the `cuda` feature, the launchers: AdamW's fused step
//! (`adamw::CudaAdamW`), SOAP's write-backs and direction (`soap::CudaSoap`) with its eigenbasis
//! refresh (`refresh`), Muon's (`muon::CudaMuon`: the fused step's momentum-only mode, then
//! candle's products), and the gradients' global norm (`grad_norm`).

pub mod abi;
#[cfg(feature = "cuda")]
pub mod adamw;
#[cfg(feature = "cuda")]
pub mod grad_norm;
#[cfg(feature = "cuda")]
pub mod muon;
#[cfg(feature = "cuda")]
pub mod refresh;
#[cfg(feature = "cuda")]
pub mod soap;
