//! Ablations: named departures from a table's cells, each a set of `--set` overrides over some
//! of the table's cells at one scale, with a one-line purpose (`train reproduce --ablation
//! NAME`, `--list-ablations`). An ablation's runs are its own results file
//! (`records/ablations/<name>/`), never the table's: a record made with other overrides has
//! another config fingerprint, and its report shows no paper number beside a cell whose state
//! settings it changed ([`crate::report::PaperBasis`]).

use super::paper::Table;
use super::scale::{Scale, H200S_STEPS, PU_LR};
use anyhow::{bail, Result};

/// One ablation.
#[derive(Debug, Clone, PartialEq)]
pub struct Ablation {
    /// `--ablation` value, also its records folder and report name (`fp4_period_400`).
    pub name: String,
    /// What it asks, in one line.
    pub purpose: String,
    /// The table whose cells (config files, cell names) it runs, at `scale`.
    pub table: Table,
    pub scale: Scale,
    /// Its cells, as `--cells` names them (`fp4_sr_reset`).
    pub cells: Vec<String>,
    /// `--set` overrides of every run, after the scale's.
    pub overrides: Vec<String>,
    /// Seeds it runs unless `--seeds` / `--seed-list` say otherwise (`--seed-list` syntax).
    pub seeds: &'static str,
}

/// The reset periods of the Fig. 4 sweeps (SR + resets of m and v every K steps); each
/// format's own paper period is the main table's cell.
pub const FP4_PERIODS: [u64; 7] = [50, 100, 200, 400, 600, 1000, 2000];
pub const FP8_PERIODS: [u64; 6] = [50, 100, 200, 600, 1000, 2000];

/// The other points of the `paper-updates` scale's FP32-state lr sweep (beside its own
/// [`PU_LR`]), as `optim.lr` takes them.
pub const PU_SWEEP: [&str; 3] = ["1.5e-3", "3e-3", "1.2e-2"];

/// Tokens per step of the batch ablations, as sequences of 256 (the scale's 128 x 256 keeps
/// its tokens per run: steps = 2400 x 128 / B).
pub const BATCHES: [usize; 4] = [32, 64, 256, 512];

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn h200s(name: &str, purpose: &str, table: Table, cells: &[&str], overrides: &[&str]) -> Ablation {
    Ablation {
        name: name.into(),
        purpose: purpose.into(),
        table,
        scale: Scale::H200Shuffled,
        cells: strings(cells),
        overrides: strings(overrides),
        seeds: "0-1",
    }
}

/// Table 4's cells, as the model-scale ablations run them.
const TABLE4: [&str; 7] = ["fp32_plain", "bf16_plain", "bf16_sr_reset", "fp8_plain", "fp8_sr_reset", "fp4_plain", "fp4_sr_reset"];

/// The FP4 variants of the paper's FP4 states that its text leaves open (block size, scale
/// kind, v's zero): `(name, purpose, overrides)`. Each runs FP4 plain and FP4 SR + resets;
/// `same_card` runs the paper's own FP4 with FP32 states beside them on the same card.
const FP4_VARIANTS: [(&str, &str, &[&str]); 5] = [
    ("fp4_variant_block32", "FP4 with 32-element scale blocks (MXFP4's block size)", &["optim.states.block_size=32"]),
    ("fp4_variant_block64", "FP4 with 64-element scale blocks", &["optim.states.block_size=64"]),
    ("fp4_variant_pow2", "FP4 with power-of-two scales (the smallest that fits) in 128-blocks", &["optim.states.scale=\"pow2\""]),
    (
        "fp4_variant_mx",
        "FP4 as MXFP4 stores it: power-of-two scales per 32-element block",
        &["optim.states.scale=\"pow2\"", "optim.states.block_size=32"],
    ),
    ("fp4_variant_v_zero_keep", "FP4 whose v may round to zero (zero kept on v's grid)", &["optim.states.v_zero=\"keep\""]),
];

/// Every ablation, in the order `--list-ablations` prints them.
pub fn ablations() -> Vec<Ablation> {
    [
        state_settings(),
        period_sweeps(),
        single_state_resets(),
        model_scale(),
        batches(),
        fp4_variants(),
        lr_sweep(),
        dither(),
        muon(),
        fp32_model_mixed(),
    ]
    .concat()
}

/// One change of the paper's state settings each: SOAP's FP8 cells, FP8 plain, Table 6's
/// v-only policy.
fn state_settings() -> Vec<Ablation> {
    use Table::*;
    vec![
        h200s(
            "soap_fp8_sr",
            "Table 7's FP8 SOAP cells with stochastic rounding of m, v, L and R (the table's cells round to nearest)",
            Soap,
            &["soap_fp8_plain", "soap_fp8_reset"],
            &["optim.states.m_rounding=\"stochastic\"", "optim.states.v_rounding=\"stochastic\""],
        ),
        h200s(
            "soap_fp8_block128",
            "Table 7's FP8 SOAP cells with 128-element scale blocks for m, v, L and R",
            Soap,
            &["soap_fp8_plain", "soap_fp8_reset"],
            &["optim.states.block_size=128"],
        ),
        h200s(
            "soap_fp8_precond_fp32",
            "Table 7's FP8 SOAP cells with L and R in FP32",
            Soap,
            &["soap_fp8_plain", "soap_fp8_reset"],
            &["optim.soap.precond_format=\"fp32\""],
        ),
        h200s(
            "soap_fp8_sr_precond_fp32",
            "Table 7's FP8 SOAP cells as the paper likely ran its rescue: stochastic rounding of m and v, L and R in FP32",
            Soap,
            &["soap_fp8_plain", "soap_fp8_reset"],
            &["optim.states.m_rounding=\"stochastic\"", "optim.states.v_rounding=\"stochastic\"", "optim.soap.precond_format=\"fp32\""],
        ),
        h200s(
            "soap_fp8_sr_block128",
            "Table 7's FP8 SOAP cells with stochastic rounding of m, v, L and R in 128-element scale blocks",
            Soap,
            &["soap_fp8_plain", "soap_fp8_reset"],
            &["optim.states.m_rounding=\"stochastic\"", "optim.states.v_rounding=\"stochastic\"", "optim.states.block_size=128"],
        ),
        h200s(
            "embed_head_fp32",
            "FP8 plain with the embedding's and the head's states in FP32",
            Table::Bf16Model,
            &["fp8_plain"],
            &[
                "optim.states.groups.embed.m_format=\"fp32\"",
                "optim.states.groups.embed.v_format=\"fp32\"",
                "optim.states.groups.head.m_format=\"fp32\"",
                "optim.states.groups.head.v_format=\"fp32\"",
            ],
        ),
        h200s(
            "v_zero_exclude",
            "FP8 plain with a zero-free v (v never rounds to 0 in a non-zero tensor): how much of FP8 plain's cost is v = 0",
            Table::Bf16Model,
            &["fp8_plain"],
            &["optim.states.v_zero=\"exclude\""],
        ),
        h200s(
            "v_only_keep",
            "FP8 SR + v-only resets keeping the stored v of the elements idle at the reset",
            ResetPolicies,
            &["fp8_sr_reset_v"],
            &["optim.states.v_reset_idle=\"keep\""],
        ),
        h200s(
            "v_only_continue",
            "FP8 SR + v-only resets with the bias-correction counter kept counting",
            ResetPolicies,
            &["fp8_sr_reset_v"],
            &["optim.states.bias_correction=\"continue\""],
        ),
    ]
}

/// Fig. 4's sweeps of the reset period of SR + resets, and FP32 states with resets.
fn period_sweeps() -> Vec<Ablation> {
    let mut v = vec![];
    for (fmt, periods) in [("fp4", &FP4_PERIODS[..]), ("fp8", &FP8_PERIODS[..])] {
        for &k in periods {
            let o = [format!("optim.states.m_reset_every={k}"), format!("optim.states.v_reset_every={k}")];
            v.push(Ablation {
                overrides: o.to_vec(),
                ..h200s(
                    &format!("{fmt}_period_{k}"),
                    &format!("{} SR + resets of m and v every {k} steps (Fig. 4)", fmt.to_uppercase()),
                    Table::Bf16Model,
                    &[&format!("{fmt}_sr_reset")],
                    &[],
                )
            });
        }
    }
    for k in [0u64, 200] {
        v.push(Ablation {
            overrides: vec![format!("optim.states.m_reset_every={k}"), format!("optim.states.v_reset_every={k}")],
            ..h200s(
                &format!("fp32_period_{k}"),
                &format!("FP32 states with m and v reset every {k} steps (0: never, the table's FP32 cell on this card)"),
                Table::Bf16Model,
                &["fp32_plain"],
                &[],
            )
        });
    }
    v
}

/// FP4 on this card, per tensor, and resets of one state only (with their controls).
fn single_state_resets() -> Vec<Ablation> {
    vec![
        h200s(
            "fp4_same_card",
            "the table's FP4 SR and FP4 SR + resets cells again, on this command's card (a same-card baseline)",
            Table::Bf16Model,
            &["fp4_sr", "fp4_sr_reset"],
            &[],
        ),
        h200s(
            "fp4_per_tensor",
            "FP4 SR with and without resets, one scale per tensor (A.10)",
            Table::Bf16Model,
            &["fp4_sr", "fp4_sr_reset"],
            &["optim.states.block_size=0"],
        ),
        h200s(
            "fp4_m_only",
            "FP4 SR with m reset every 200 steps, v never",
            Table::Bf16Model,
            &["fp4_sr_reset"],
            &["optim.states.v_reset_every=0"],
        ),
        h200s(
            "fp4_v_only",
            "FP4 SR with v reset every 200 steps, m never",
            Table::Bf16Model,
            &["fp4_sr_reset"],
            &["optim.states.m_reset_every=0"],
        ),
        h200s(
            "fp4_m_only_continue",
            "fp4_m_only with the bias-correction counter kept counting over resets",
            Table::Bf16Model,
            &["fp4_sr_reset"],
            &["optim.states.v_reset_every=0", "optim.states.bias_correction=\"continue\""],
        ),
        h200s(
            "fp32_m_only",
            "FP32 states with m reset every 200 steps, v never: fp4_m_only's control without quantization",
            Table::Bf16Model,
            &["fp32_plain"],
            &["optim.states.m_reset_every=200"],
        ),
    ]
}

/// Table 4: the model-scale cells at LLaMA-60M and 100M.
fn model_scale() -> Vec<Ablation> {
    let mut v = vec![];
    for (name, size) in [("model_60m", "60m"), ("model_100m", "100m")] {
        let preset = format!("model.preset=\"llama{size}\"");
        v.push(h200s(
            name,
            &format!("Table 4: the model-scale cells at LLaMA-{} and the paper's lr for it (1e-3)", size.to_uppercase()),
            Table::Bf16Model,
            &TABLE4,
            &[&preset, "optim.lr=1e-3"],
        ));
    }
    v
}

/// Steps against tokens per step at the scale's tokens.
fn batches() -> Vec<Ablation> {
    let mut v = vec![];
    for b in BATCHES {
        let micro = b.min(128);
        let steps = H200S_STEPS as usize * 128 / b;
        let o = [
            format!("train.micro_batch={micro}"),
            format!("train.grad_accum={}", b / micro),
            format!("train.max_steps={steps}"),
            format!("optim.warmup_steps={}", steps / 10),
        ];
        v.push(Ablation {
            overrides: o.to_vec(),
            ..h200s(
                &format!("batch_{b}"),
                &format!("steps against tokens per step: {b} x 256 tokens per step for the scale's tokens ({steps} steps)"),
                Table::Bf16Model,
                &["fp32_plain", "fp8_plain", "fp8_sr_reset"],
                &[],
            )
        });
    }
    v
}

/// The same-card baseline and the FP4 variants the paper's text leaves open.
fn fp4_variants() -> Vec<Ablation> {
    let mut v = vec![h200s(
        "same_card",
        "the table's FP32, FP8 plain, FP4 plain and FP4 SR + resets cells again on this command's card: the same-card \
         baseline of the ablations run beside it (v_zero_exclude, the FP4 variants, the stall probe on its card)",
        Table::Bf16Model,
        &["fp32_plain", "fp8_plain", "fp4_plain", "fp4_sr_reset"],
        &[],
    )];
    for (name, purpose, o) in FP4_VARIANTS {
        v.push(h200s(name, purpose, Table::Bf16Model, &["fp4_plain", "fp4_sr_reset"], o));
    }
    v
}

/// Dithered write-back (beyond the paper; `m_rounding` / `v_rounding = "dither"`, BReD): the
/// paper's FP8 and FP4 cells, round-to-nearest and resets, with m and v dithered instead: set
/// beside the main table's nearest and SR cells (and `same_card`).
fn dither() -> Vec<Ablation> {
    vec![h200s(
        "dither",
        "FP8 and FP4 states with m and v dithered on write-back (one draw per scale block: per tensor for the paper's FP8, \
         per 128-block for FP4; subtracted on every read), without and with the paper's resets, beside the main table's \
         nearest and SR cells",
        Table::Bf16Model,
        &["fp8_plain", "fp8_reset", "fp4_plain", "fp4_reset"],
        &["optim.states.m_rounding=\"dither\"", "optim.states.v_rounding=\"dither\""],
    )]
}

/// Muon (beyond the paper; `optim.kind = "muon"`: Muon for the attention and MLP matrices, its
/// momentum alone in m's format, AdamW for the rest): FP32, BF16, FP8 and FP4 momentum with
/// stochastic rounding, and BF16, FP8, FP4 with dither, at the table's lr (Moonlight's update
/// scale makes AdamW's serve both); beside the main table's AdamW cells (and `same_card`).
fn muon() -> Vec<Ablation> {
    let kind = "optim.kind=\"muon\"";
    vec![
        h200s(
            "muon",
            "Muon with FP32 momentum and with BF16, FP8, FP4 momentum under stochastic rounding (the other tensors' AdamW \
             states in the cell's formats), beside AdamW's cells",
            Table::Bf16Model,
            &["fp32_plain", "bf16_sr", "fp8_sr", "fp4_sr"],
            &[kind],
        ),
        h200s(
            "muon_dither",
            "Muon with BF16, FP8, FP4 momentum dithered on write-back (the other tensors' AdamW m and v dithered too), \
             beside `muon`'s SR cells",
            Table::Bf16Model,
            &["bf16_plain", "fp8_plain", "fp4_plain"],
            &[kind, "optim.states.m_rounding=\"dither\"", "optim.states.v_rounding=\"dither\""],
        ),
    ]
}

/// Table 2 with mixed precision (`model.dtype = "bf16-mixed"`: FP32 master weights and
/// update, BF16 products and activations, as torch.autocast): its plain and SR + resets cells
/// at each state precision, to say whether the FP32-model table's numbers move when it runs
/// at near-BF16 speed.
fn fp32_model_mixed() -> Vec<Ablation> {
    vec![h200s(
        "fp32_model_mixed",
        "Table 2's plain and SR + resets cells with FP32 master weights and BF16 products and activations (bf16-mixed) \
         instead of the FP32 model",
        Table::Fp32Model,
        &TABLE4,
        &["model.dtype=\"bf16-mixed\""],
    )]
}

/// The `paper-updates` scale's FP32-state lr sweep.
fn lr_sweep() -> Vec<Ablation> {
    PU_SWEEP
        .iter()
        .map(|lr| Ablation {
            scale: Scale::PaperUpdates,
            seeds: "0",
            overrides: vec![format!("optim.lr={lr}")],
            ..h200s(
                &format!("paper_updates_lr_{lr}"),
                &format!("the paper-updates scale's lr sweep: FP32 states at peak lr {lr} (the scale's own {PU_LR} is the table's cell)"),
                Table::Bf16Model,
                &["fp32_plain"],
                &[],
            )
        })
        .collect()
}

/// The ablation named `name`.
///
/// # Errors
/// An unknown name, with the list of known ones.
pub fn ablation(name: &str) -> Result<Ablation> {
    let all = ablations();
    match all.iter().find(|a| a.name == name) {
        Some(a) => Ok(a.clone()),
        None => bail!(
            "--ablation {name:?}: no such ablation; `train reproduce --list-ablations` lists them: {}",
            all.iter().map(|a| a.name.as_str()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The `--list-ablations` text: one line per ablation, name, table, cells and purpose.
pub fn list() -> String {
    let all = ablations();
    let width = all.iter().map(|a| a.name.len()).max().unwrap_or(0);
    all.iter()
        .map(|a| {
            format!(
                "{:width$}  {} {} [{}] seeds {}: {}\n",
                a.name,
                a.table.as_str(),
                a.scale.as_str(),
                a.cells.join(","),
                a.seeds,
                a.purpose
            )
        })
        .collect()
}
