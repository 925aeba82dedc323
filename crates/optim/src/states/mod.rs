//! What an optimizer stores, and how: the state formats ([`mod@format`]: bit layouts, rounding,
//! block scales), one state's codes and scales ([`quant`]), the counter RNG of stochastic
//! rounding ([`rng`]), the `[optim.states]` settings ([`config`]) and which tensor gets which
//! ([`plan`]), the moments of a whole model ([`moments`]) and SOAP's preconditioners
//! ([`precond`]), their resets ([`reset`]), the stall counters of their write-backs
//! ([`stalls`]) and the closed-form stall prediction ([`theory`]), and the states as named
//! arrays for checkpoints ([`state_dict`]). Nothing here steps: the update rules are
//! [`crate::rules`]'.

pub mod config;
pub mod format;
pub mod moments;
pub mod plan;
pub mod precond;
pub mod quant;
pub mod reset;
pub mod rng;
pub mod stalls;
pub mod state_dict;
pub mod theory;
