//! The update rules, each a module with its CPU reference maths and its CPU [`Optimizer`]:
//! AdamW ([`adamw`]: [`adamw::LowbitAdamW`]), SOAP ([`soap`]: [`soap::LowbitSoap`]) and Muon
//! ([`muon`]: [`muon::LowbitMuon`]), which one a run takes ([`kind`]). What they
//! share: the [`Optimizer`] trait ([`optimizer`]), one update's plan ([`step_plan`]) and the
//! gradient scale of global-norm clipping ([`clip`]). A new rule is one more module here that
//! steps [`crate::states`]' states from the plan, and one more variant of
//! [`crate::select::LowbitOptimizer`].

pub mod adamw;
pub mod clip;
pub mod kind;
pub mod muon;
pub mod optimizer;
pub mod soap;
pub mod step_plan;

pub use optimizer::Optimizer;
