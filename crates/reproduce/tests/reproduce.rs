//! Tests of `train reproduce`: every config resolves, the grids match the config files, the
//! scale overrides, and the pure statistics / ordering checks / rendering on hand-made numbers.

use lowbit_optim::{OptimizerKind, ResetRule, Rounding, ScaleKind, SoapConfig, StateFormat, VZero};
use lowbit_reproduce::*;
use lowbit_train::config::{RunConfig, WeightDtype};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn configs() -> PathBuf {
    repo().join("configs")
}

fn toml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            toml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "toml") {
            out.push(p);
        }
    }
}

#[test]
fn every_config_file_resolves() {
    let mut files = vec![];
    toml_files(&configs(), &mut files);
    assert!(files.len() > 1 + 13 + 14, "found only {} config files", files.len());
    for f in &files {
        RunConfig::load(f, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", f.display()));
    }
}

#[test]
fn required_cell_has_the_paper_setting() {
    let c = RunConfig::load(&configs().join("llama100m_fp8_sr_reset.toml"), &[]).unwrap();
    assert_eq!(c.model.preset.as_deref(), Some("llama100m"));
    assert_eq!(c.model.dtype, WeightDtype::Bf16);
    assert_eq!(c.data.seq_len, 256);
    assert!(c.data.train.iter().all(|p| p.starts_with("data/local/c4/")));
    assert!(c.data.validation.iter().all(|p| p.starts_with("data/local/c4/")));
    assert!(c.data.tokenizer.contains("t5"));
    assert_eq!(c.train.micro_batch * c.train.grad_accum, 512);
    assert_eq!((c.optim.beta1, c.optim.beta2, c.optim.eps), (0.9, 0.999, 1e-6));
    assert_eq!(c.optim.min_lr_ratio, 0.1);
    assert!(c.optim.warmup_steps > 0 && c.optim.warmup_steps < c.train.max_steps);
    let s = &c.optim.states;
    assert_eq!((s.m_format.as_str(), s.v_format.as_str()), ("fp8", "fp8"));
    assert_eq!((s.m_rounding, s.v_rounding), (Rounding::Stochastic, Rounding::Stochastic));
    assert_eq!((s.m_reset_every, s.v_reset_every), (300.into(), 300.into()));
    // the paper's FP8: E4M3 with one amax scale per tensor, zero kept (6.1, A.4)
    let spec = s.resolve(c.optim.beta2).unwrap();
    assert_eq!((spec.block_size, spec.m_scale, spec.v_scale, spec.v_zero), (0, ScaleKind::Amax, ScaleKind::Amax, VZero::Keep));
    assert_eq!(c.run.name, "llama100m_fp8_sr_reset");
}

/// The paper's FP4 cells: E2M1 m and unsigned E2M2 v in 128-blocks with amax scales, zero
/// excluded from v only.
#[test]
fn fp4_cells_have_the_papers_formats() {
    for t in [Table::Bf16Model, Table::Fp32Model] {
        for cell in cells(t).into_iter().filter(|c| c.0 == Fmt::Fp4) {
            let c = RunConfig::load(&cell_config(&configs(), t, cell), &[]).unwrap();
            let spec = c.optim.states.resolve(c.optim.beta2).unwrap();
            assert_eq!((spec.m_format, spec.v_format), (StateFormat::Fp4E2M1, StateFormat::Fp4UE2M2));
            assert_eq!((spec.block_size, spec.m_scale, spec.v_scale, spec.v_zero), (128, ScaleKind::Amax, ScaleKind::Amax, VZero::Exclude));
            assert_eq!(c.optim.eps, 1e-6);
        }
    }
}

/// Each cell's file sets exactly the knob it studies; everything else is the shared base.
#[test]
fn grids_match_the_config_files() {
    let base = RunConfig::load(&configs().join("paper/base_llama100m.toml"), &[]).unwrap();
    for (table, n) in [(Table::Bf16Model, 13), (Table::Fp32Model, 14), (Table::ResetPolicies, 6)] {
        let grid = cells(table);
        assert_eq!(grid.len(), n);
        for cell @ (f, x) in grid {
            let path = cell_config(&configs(), table, cell);
            let c = RunConfig::load(&path, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            let s = &c.optim.states;
            assert_eq!(c.run.name, cell_name(table, cell));
            let dtype = if table.bf16_model() { WeightDtype::Bf16 } else { WeightDtype::F32 };
            assert_eq!(c.model.dtype, dtype, "{}", path.display());
            assert_eq!((s.m_format.as_str(), s.v_format.as_str()), (f.as_str(), f.as_str()));
            let r = if x.stochastic() { Rounding::Stochastic } else { Rounding::Nearest };
            assert_eq!((s.m_rounding, s.v_rounding), (r, r), "{}", path.display());
            let (m, v) = x.reset_periods(f.paper_reset_period());
            assert_eq!((s.m_reset_every, s.v_reset_every), (m.into(), v.into()), "{}", path.display());
            let rule = if x == Fix::SrAdaptive { ResetRule::Adaptive } else { ResetRule::Periodic };
            assert_eq!(s.reset, rule, "{}", path.display());
            assert_eq!(s.weight_rounding, Rounding::Nearest);
            // the rest is the base, unchanged
            let mut norm = c.clone();
            norm.model.dtype = base.model.dtype;
            norm.optim.states = base.optim.states.clone();
            norm.run.name = base.run.name.clone();
            assert_eq!(norm.to_toml(), base.to_toml(), "{} changes more than its knob", path.display());
        }
    }
}

/// `configs/paper/<table>/<cell>_theory.toml` (the FP8/FP4 cells on the stall theory's
/// precision-only grids) are the paper's cells with `reproduce --states theory`'s overrides.
#[test]
fn theory_configs_are_the_cells_on_the_theory_grids() {
    let mut n = 0;
    for (table, sub) in [(Table::Bf16Model, "bf16_model"), (Table::Fp32Model, "fp32_model")] {
        for cell @ (f, _) in cells(table) {
            if !matches!(f, Fmt::Fp8 | Fmt::Fp4) {
                continue;
            }
            let name = format!("{}_theory", cell_name(table, cell));
            let path = configs().join("paper").join(sub).join(format!("{name}.toml"));
            let got = RunConfig::load(&path, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            let mut want = RunConfig::load(&cell_config(&configs(), table, cell), &States::Theory.overrides(f)).unwrap();
            assert_eq!(got.run.name, name);
            want.run.name = name;
            assert_eq!(got.to_toml(), want.to_toml(), "{}", path.display());
            assert!(got.optim.states.m_format.starts_with("e8m") && got.optim.states.v_format.starts_with("e8m"));
            assert_eq!(got.optim.eps, 1e-8);
            n += 1;
        }
    }
    assert_eq!(n, 16);
}

#[test]
fn scales_override_the_run_and_reset_periods() {
    let cell = (Fmt::Fp8, Fix::SrReset);
    let path = cell_config(&configs(), Table::Bf16Model, cell);
    let cfgs = configs();
    let load = |scale| {
        let spec = PlanSpec { table: Table::Bf16Model, scale, configs: &cfgs, runs_root: Path::new("runs/reproduce"), extra: &[] };
        let o = run_overrides(spec, States::Blockwise, cell, Path::new("runs/reproduce/x"), "c-s1", 1);
        RunConfig::load(&path, &o).unwrap()
    };
    let smoke = load(Scale::Smoke);
    assert_eq!(smoke.model.preset.as_deref(), Some("tiny"));
    assert_eq!(smoke.train.device, "cpu");
    assert_eq!((smoke.train.max_steps, smoke.data.seq_len, smoke.train.micro_batch), (30, 64, 4));
    assert!(smoke.data.train[0].starts_with("data/c4-sample/"));
    assert_eq!(smoke.optim.states.m_reset_every, 6.into());
    assert_eq!(smoke.train.seed, 1);
    assert_eq!(smoke.run_dir(), Path::new("runs/reproduce/x/c-s1"));
    let h = load(Scale::H200);
    assert_eq!(h.model.preset.as_deref(), Some("llama20m"));
    assert_eq!(h.train.device, "cuda");
    assert_eq!((h.train.max_steps, h.data.seq_len, h.train.micro_batch, h.optim.warmup_steps), (4000, 256, 16, 400));
    assert_eq!(h.train.max_steps * (h.data.seq_len * h.train.micro_batch) as u64, 16_384_000);
    assert!(h.data.train[0].starts_with("data/local/corpus/"));
    // the paper's own periods: 4000 steps leave BF16 3 resets, FP8 13, FP4 19
    assert_eq!((h.optim.states.m_reset_every, h.optim.states.v_reset_every), (300.into(), 300.into()));
    // the shuffled setting: both corpora shuffled, 128 x 256 tokens per step, 2400 steps,
    // warmup 10%, the tuned lr, the paper's periods
    let s = load(Scale::H200Shuffled);
    assert_eq!((s.model.preset.as_deref(), s.train.device.as_str()), (Some("llama20m"), "cuda"));
    assert_eq!((s.train.max_steps, s.data.seq_len, s.train.micro_batch, s.optim.warmup_steps, s.optim.lr), (2400, 256, 128, 240, 6e-3));
    assert_eq!(s.train.max_steps * (s.data.seq_len * s.train.micro_batch) as u64, 78_643_200);
    assert!(s.data.shuffle && s.data.train.len() == 2 && s.data.train[1].starts_with("data/local/tok/extra/"), "{:?}", s.data.train);
    assert_eq!((s.optim.states.m_reset_every, s.optim.states.v_reset_every), (300.into(), 300.into()));
    assert_eq!(Scale::H200Shuffled.as_str(), "h200-shuffled");
    let full = load(Scale::Full);
    assert_eq!(full.model.preset.as_deref(), Some("llama100m"));
    assert_eq!(full.optim.states.v_reset_every, 300.into());
    assert_eq!(full.train.max_steps, RunConfig::load(&path, &[]).unwrap().train.max_steps);
    // non-resetting cells stay non-resetting at every scale
    for scale in [Scale::Smoke, Scale::H200, Scale::H200Shuffled, Scale::Full] {
        assert!(!scale_overrides(scale, (Fmt::Fp4, Fix::Sr)).iter().any(|o| o.contains("reset_every")));
    }
    // Table 6's policies: v only every period, or the adaptive rule's own timing (no period)
    let periods = |x| scale_overrides(Scale::H200, (Fmt::Fp8, x)).into_iter().filter(|o| o.contains("reset_every")).collect::<Vec<_>>();
    assert_eq!(periods(Fix::SrResetV), ["optim.states.v_reset_every=300"]);
    assert!(periods(Fix::SrAdaptive).is_empty());
    let policy = |x| {
        let path = cell_config(&configs(), Table::ResetPolicies, (Fmt::Fp8, x));
        RunConfig::load(&path, &scale_overrides(Scale::H200, (Fmt::Fp8, x))).unwrap().optim.states.resolve(0.999).unwrap()
    };
    assert_eq!((policy(Fix::SrResetV).m_reset_every, policy(Fix::SrResetV).v_reset_every), (0, 300));
    assert_eq!(policy(Fix::SrAdaptive).reset, ResetRule::Adaptive);
    assert_eq!([reset_period(Scale::Smoke, Fmt::Bf16), reset_period(Scale::Smoke, Fmt::Fp4)], [20, 4]);
    assert_eq!([reset_period(Scale::H200, Fmt::Bf16), reset_period(Scale::H200, Fmt::Fp4)], [1000, 200]);
}

/// The resolved config of a planned run.
fn resolved(j: &Job) -> String {
    RunConfig::load(&j.config, &j.overrides).unwrap().to_toml()
}

fn spec<'a>(table: Table, configs: &'a Path, runs: &'a Path, extra: &'a [String]) -> PlanSpec<'a> {
    PlanSpec { table, scale: Scale::Smoke, configs, runs_root: runs, extra }
}

#[test]
fn plan_is_seed_major_with_one_folder_per_run() {
    let tmp = tempfile::tempdir().unwrap();
    let extra = vec!["optim.states.weight_rounding=\"stochastic\"".to_string()];
    let (cfgs, t) = (configs(), Table::Fp32Model);
    let jobs = plan(spec(t, &cfgs, tmp.path(), &extra), States::Paper, &cells(t), &[0, 1]).unwrap();
    assert_eq!(jobs.len(), 28);
    assert!(jobs[..14].iter().all(|j| j.planned.key.seed == 0) && jobs[14..].iter().all(|j| j.planned.key.seed == 1));
    let dirs: std::collections::BTreeSet<_> = jobs.iter().map(|j| j.run_dir.clone()).collect();
    assert_eq!(dirs.len(), 28);
    assert_eq!(jobs[15].run_dir, tmp.path().join("fp32-model-smoke").join("llama100m_f32model_fp32_reset-s1"));
    assert!(jobs.iter().all(|j| resolved(j).contains("weight_rounding = \"stochastic\"")));
}

/// `--states`: the paper's cells as configured, the block storage formats (128-blocks, default
/// scales, zero-free v) and the theory grids (e8m3 / e8m2, eps 1e-8), each FP8/FP4 cell in its
/// kind's folder; FP32 and BF16 cells are shared by `paper` and `blockwise`, and `theory`'s own.
#[test]
fn states_kinds_pick_formats_and_folders() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfgs, t) = (configs(), Table::Fp32Model);
    let kinds = [States::Paper, States::Blockwise, States::Theory];
    let [paper, block, theory] = kinds.map(|k| plan(spec(t, &cfgs, tmp.path(), &[]), k, &cells(t), &[0]).unwrap());
    let states = |j: &Job| {
        let c = RunConfig::load(&j.config, &j.overrides).unwrap();
        (c.optim.states.resolve(c.optim.beta2).unwrap(), c.optim.eps)
    };
    let folder = |j: &Job| j.run_dir.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    for ((p, b), th) in paper.iter().zip(&block).zip(&theory) {
        assert_eq!((p.planned.cell, b.planned.cell), (th.planned.cell, th.planned.cell));
        let ((ps, pe), (bs, be), (ts, te)) = (states(p), states(b), states(th));
        assert_eq!((pe, be, te), (1e-6, 1e-6, 1e-8));
        assert_eq!(folder(th), "fp32-model-smoke-theory");
        assert_eq!(th.planned.key.states, "theory");
        match p.planned.cell.0 {
            Fmt::Fp8 => {
                assert_eq!((ps.m_format, ps.block_size, ps.m_scale, ps.v_zero), (StateFormat::Fp8E4M3, 0, ScaleKind::Amax, VZero::Keep));
                assert_eq!(
                    (bs.m_format, bs.block_size, bs.m_scale, bs.v_zero),
                    (StateFormat::Fp8E4M3, 128, ScaleKind::Pow2, VZero::Exclude)
                );
                assert_eq!((ts.m_format, ts.v_format), (StateFormat::E8m(3), StateFormat::E8m(3)));
                assert_eq!((folder(p), folder(b)), ("fp32-model-smoke-paper".into(), "fp32-model-smoke-blockwise".into()));
            }
            Fmt::Fp4 => {
                assert_eq!((ps.v_format, ps.block_size, ps.v_scale), (StateFormat::Fp4UE2M2, 128, ScaleKind::Amax));
                assert_eq!((bs.v_format, bs.block_size, bs.v_scale), (StateFormat::Fp4UE2M2, 128, ScaleKind::Amax));
                assert_eq!((ts.m_format.name(), ts.v_format), (THEORY_FP4_M, StateFormat::E8m(2)));
            }
            Fmt::Fp32 | Fmt::Bf16 => {
                assert_eq!((ps, p.planned.key.states.as_str()), (bs, SHARED));
                assert_eq!(p.run_dir, b.run_dir, "shared cells run once");
                assert_eq!(folder(p), "fp32-model-smoke");
            }
        }
    }
    assert_eq!(States::Paper.report_name(Table::Bf16Model, Scale::H200), "bf16-model-h200.md");
    assert_eq!(States::Blockwise.report_name(Table::Bf16Model, Scale::H200), "bf16-model-h200-blockwise.md");
    assert_eq!(States::Theory.report_name(Table::Bf16Model, Scale::H200), "bf16-model-h200-theory.md");
}

// ───────── pure functions on hand-made numbers ─────────

fn one(loss: f64) -> Option<RunResult> {
    Some(RunResult { val_loss: Some(loss), stall_m: Some(0.5), stall_v: Some(0.9), theory_v: Some(0.995), ..Default::default() })
}

/// The paper's own numbers as one-seed results.
fn paper_as_results(table: Table) -> Results {
    cells(table).into_iter().filter_map(|c| Some((c, vec![one(paper_loss(table, PaperModel::Llama100m, c)?)]))).collect()
}

#[test]
fn stats_and_paired_deltas() {
    let s = Stat::of(&[3.0, 3.2]).unwrap();
    assert!((s.mean - 3.1).abs() < 1e-12);
    assert!((s.sd.unwrap() - 0.02f64.sqrt()).abs() < 1e-12);
    assert_eq!(Stat::of(&[1.0]).unwrap().sd, None);
    assert!(Stat::of(&[]).is_none());
    let mut r: Results = BTreeMap::new();
    let (a, b) = ((Fmt::Fp8, Fix::SrReset), (Fmt::Fp8, Fix::Plain));
    r.insert(a, vec![one(3.0), None, one(3.4)]);
    r.insert(b, vec![one(3.1), one(9.9), one(3.3)]);
    // seed 1 is unpaired and left out; seed 0: -0.1, seed 2: +0.1
    let d = delta(&r, a, b).unwrap();
    assert_eq!(d.n, 2);
    assert!(d.mean.abs() < 1e-12);
    assert_eq!(loss_stat(&r, b).unwrap().n, 3);
}

#[test]
fn paper_numbers_satisfy_the_papers_orderings() {
    let t = Table::Fp32Model;
    let r = paper_as_results(t);
    for c in claims(t) {
        let v = evaluate_claim(&r, &c);
        assert_eq!(v.outcome, Outcome::HoldsInAll, "{}", c.text);
        assert_eq!(v.seeds_holding, 1);
        assert_eq!(paper_verdict(t, PaperModel::Llama100m, &c).map(|p| p.1), Some(true), "{}", c.text);
    }
    // the main table publishes only plain and SR + resets
    let t = Table::Bf16Model;
    let r = paper_as_results(t);
    let verdicts: Vec<_> = claims(t).iter().map(|c| (c.text.clone(), evaluate_claim(&r, c).outcome)).collect();
    for (text, o) in &verdicts {
        if text.starts_with("SR + resets below plain") {
            assert_eq!(*o, Outcome::HoldsInAll, "{text}");
        } else {
            assert_eq!(*o, Outcome::Missing, "{text}");
        }
    }
}

#[test]
fn an_ordering_that_fails_is_reported() {
    let t = Table::Fp32Model;
    let mut r = paper_as_results(t);
    // resets help fp32 states here (against the paper), fp4 SR + resets worse than plain
    r.insert((Fmt::Fp32, Fix::Reset), vec![one(3.150)]);
    r.insert((Fmt::Fp4, Fix::SrReset), vec![one(3.300)]);
    let cl = claims(t);
    let find = |s: &str| cl.iter().find(|c| c.text.contains(s)).unwrap().clone();
    assert_eq!(evaluate_claim(&r, &find("do not help fp32")).outcome, Outcome::DoesNotHold);
    let fp4 = evaluate_claim(&r, &find("SR + resets below plain, fp4"));
    assert_eq!(fp4.outcome, Outcome::DoesNotHold);
    assert!((fp4.delta.unwrap().mean - (3.300 - 3.199)).abs() < 1e-12);
    // two seeds that disagree: mixed, whatever the mean says; each seed's delta is kept
    let mut r2: Results = BTreeMap::new();
    r2.insert((Fmt::Bf16, Fix::SrReset), vec![one(3.00), one(3.25)]);
    r2.insert((Fmt::Bf16, Fix::Plain), vec![one(3.10), one(3.20)]);
    let v = evaluate_claim(&r2, &find("SR + resets below plain, bf16"));
    assert_eq!((v.outcome, v.seeds_holding, v.delta.unwrap().n), (Outcome::Mixed, 1, 2));
    assert_eq!(v.per_seed.iter().map(|d| d.0).collect::<Vec<_>>(), [0, 1]);
    assert!((v.per_seed[0].1 + 0.10).abs() < 1e-12 && (v.per_seed[1].1 - 0.05).abs() < 1e-12);
}

#[test]
fn render_shows_paper_ours_deltas_and_verdicts() {
    let t = Table::Fp32Model;
    let mut r: Results = BTreeMap::new();
    for (i, c) in cells(t).into_iter().enumerate() {
        let p = paper_loss(t, PaperModel::Llama100m, c).unwrap();
        r.insert(c, vec![one(p + 0.5), one(p + 0.5 + 0.001 * i as f64)]);
    }
    r.insert((Fmt::Fp32, Fix::Reset), vec![one(3.0), one(3.0)]); // resets "help" fp32: fails
    r.insert((Fmt::Fp4, Fix::Sr), vec![None, None]); // missing
    let theory: Results = [((Fmt::Fp32, Fix::Plain), vec![one(3.1)])].into_iter().collect();
    let info = RunInfo {
        results_file: "records/fp32-model-smoke-results.json".into(),
        commands: vec![CommandLog {
            command: "train reproduce --table fp32-model --scale smoke".into(),
            runs: 26,
            wall_s: 125.0,
            jobs: 2,
            gpus: 0,
            states: vec!["theory".into()],
        }],
        seeds: vec![0, 1],
        runs_total: 28,
        runs_missing: vec!["llama100m_f32model_fp4_sr-s0".into(), "llama100m_f32model_fp4_sr-s1".into()],
        stale: 3,
        params: Some(8_619_648),
        tokens_per_run: Some(10240),
        steps: Some(40),
        setting: "**Setting** of the test runs.".into(),
        states_text: States::Paper.description(),
        paper: PaperBasis::paper_cells(t),
        cards: cells(t).into_iter().flat_map(|c| [((c, 0), "H100".to_string()), ((c, 1), "H200".to_string())]).collect(),
        kinds: vec![("paper", r.clone()), ("blockwise", BTreeMap::new()), ("theory", theory)],
        ..Default::default()
    };
    let md = render(t, Scale::Smoke, &r, &info);
    assert!(md.starts_with("# Reproduction of the paper's Table 2 (FP32 model), scale `smoke`"));
    assert!(md.contains("**the paper's formats**"));
    assert!(md.contains("Rendered from `records/fp32-model-smoke-results.json`: 26 of 28 runs (14 cells x seeds 0, 1)"));
    assert!(md.contains("Cards: H100, H200."), "{md}");
    assert!(md.contains("26 run(s) in 2m05s, up to 2 at once on CPU"));
    assert!(md.contains("**2 run(s) missing**"));
    assert!(md.contains("3 record(s) of the results file with another config"));
    assert!(md.contains("**Setting** of the test runs."));
    assert!(md.contains("Paper: LLaMA-100M, Table 2 (FP32 model), on C4"), "{md}");
    // fp8 SR + resets row: paper 3.155, ours 3.655 ± sd, paper deltas vs plain and vs fp32
    let row = md.lines().find(|l| l.starts_with("| fp8 | SR + resets |")).unwrap();
    assert!(row.contains("| 3.155 |"), "{row}");
    assert!(row.contains("3.65"), "{row}");
    assert!(row.contains(" ± "), "{row}");
    assert!(row.contains("| -0.038 |"), "{row}"); // 3.155 - 3.193
    assert!(row.contains("| +0.000 |"), "{row}"); // 3.155 - 3.155
    let missing = md.lines().find(|l| l.starts_with("| fp4 | SR |")).unwrap();
    assert!(missing.contains("| 3.182 | — |"), "{missing}");
    let claim = md.lines().find(|l| l.contains("resets do not help fp32 states")).unwrap();
    assert!(claim.contains("**does not hold**") && claim.contains("| 0/2 |"), "{claim}");
    // 3.0 - (3.155 + 0.5); seed 0's runs on H100, seed 1's on H200: no pair crosses cards
    assert!(claim.contains("| s0 -0.6550, s1 -0.6550 |"), "{claim}");
    let claim = md.lines().find(|l| l.contains("SR helps fp4")).unwrap();
    assert!(claim.contains("n/a"), "{claim}");
    let claim = md.lines().find(|l| l.contains("SR + resets below plain, fp8")).unwrap();
    assert!(claim.contains("**holds in all seeds**") && claim.contains("| -0.038 |"), "{claim}");
    assert!(!md.contains("-0.0000"));
    // the grid in the paper's layout
    assert!(md.contains("| states | fp32 | bf16 | fp8 | fp4 |"));
    assert!(md.lines().any(|l| l.starts_with("| SR |") && l.contains("| — |")));
    // the states kinds side by side: loss (paired delta vs fp32 states of the kind), a kind
    // without runs shows dashes
    assert!(
        md.contains("## The states kinds, cell by cell") && md.contains("| states | fix | paper | theory |"),
        "kinds without runs left out"
    );
    let row = md.lines().rfind(|l| l.starts_with("| fp8 | SR + resets |")).unwrap();
    assert_eq!(row, "| fp8 | SR + resets | 3.6595 ± 0.0064 (+0.0045 ± 0.0064) | — |");
    assert!(!md.contains("Overrides of every run"), "no override, no override sentence");
    let set = RunInfo { overrides: vec!["optim.lr=1e-3".into()], ..info.clone() };
    assert!(render(t, Scale::Smoke, &r, &set).contains("Overrides of every run beyond its cell and the scale: `optim.lr=1e-3`."));
    // a pair whose runs ran on two cards is marked
    let mut crossed = info.clone();
    crossed.cards.insert(((Fmt::Fp32, Fix::Reset), 1), "H100".into());
    let md2 = render(t, Scale::Smoke, &r, &crossed);
    let claim = md2.lines().find(|l| l.contains("resets do not help fp32 states")).unwrap();
    assert!(claim.contains("| s0 -0.6550, s1 -0.6550 × |"), "{claim}");
    let row = md2.lines().find(|l| l.starts_with("| fp32 | resets |")).unwrap();
    assert!(row.contains("| H100 |"), "{row}");
    let row = md2.lines().find(|l| l.starts_with("| fp32 | plain (nearest) |")).unwrap();
    assert!(row.contains("| H100/H200 |"), "{row}");
    let alone = RunInfo { kinds: vec![("paper", r.clone()), ("theory", BTreeMap::new())], ..info.clone() };
    assert!(!render(t, Scale::Smoke, &r, &alone).contains("## The states kinds"), "one kind: nothing to compare");
    // another scale's verdicts beside each ordering: there, resets help fp32 states by 0.1 in
    // its one seed (so "resets do not help" does not hold there either), and no other cell has runs
    let mut there: Results = BTreeMap::new();
    there.insert((Fmt::Fp32, Fix::Plain), vec![one(3.6)]);
    there.insert((Fmt::Fp32, Fix::Reset), vec![one(3.5)]);
    let md3 = render(
        t,
        Scale::PaperUpdates,
        &r,
        &RunInfo { compare: Some(Compared { scale: "h200-shuffled", results: there, cards: vec!["H200".into()] }), ..info.clone() },
    );
    assert!(md3.contains("| ours | at `h200-shuffled`: Δ mean, verdict |"), "{md3}");
    let claim = md3.lines().find(|l| l.contains("resets do not help fp32 states")).unwrap();
    assert!(claim.contains("| **does not hold** | -0.1000") && claim.ends_with(" does not hold (1 seed) |"), "{claim}");
    let claim = md3.lines().find(|l| l.contains("SR + resets below plain, fp8")).unwrap();
    assert!(claim.ends_with("| — n/a (missing runs) (0 seeds) |"), "{claim}");
    assert!(
        md3.contains("The last column is the same ordering in the same table at scale `h200-shuffled` (its own records, cards: H200:"),
        "{md3}"
    );
    assert!(!md.contains("The last column"), "no other scale, no column");
}

#[test]
fn diverged_runs_are_flagged_and_not_judged() {
    let t = Table::Bf16Model;
    let mut r = paper_as_results(t);
    let blown = RunResult { val_loss: Some(28410.5), diverged: true, ..Default::default() };
    r.insert((Fmt::Fp4, Fix::Plain), vec![Some(blown)]);
    let c = claims(t).into_iter().find(|c| c.text == "SR + resets below plain, fp4 states").unwrap();
    let v = evaluate_claim(&r, &c);
    assert_eq!((v.outcome, v.outcome.word()), (Outcome::Diverged, "n/a (a run diverged)"));
    let md = render(t, Scale::Smoke, &r, &RunInfo { seeds: vec![0], ..Default::default() });
    assert!(md.lines().any(|l| l.starts_with("| fp4 | plain (nearest) |") && l.contains("28410.5000 (diverged)")));
    assert!(md.contains("Diverged (final validation loss above the initial one): llama100m_fp4_plain"));
    assert!(md.contains("**n/a (a run diverged)**"));
}

/// A table filling in seed by seed: orderings paired in fewer seeds than the best-paired judged
/// one hold, are mixed or do not hold only "so far", counted apart from the established ones; a
/// diverged ordering stays not judged.
#[test]
fn orderings_paired_in_fewer_seeds_are_judged_only_so_far() {
    let t = Table::Fp32Model;
    // the paper's numbers + 0.5 in seeds 0-2: every ordering holds as in the paper
    let mut r: Results = cells(t).into_iter().map(|c| (c, vec![one(paper_loss(t, PaperModel::Llama100m, c).unwrap() + 0.5); 3])).collect();
    let plain4 = paper_loss(t, PaperModel::Llama100m, (Fmt::Fp4, Fix::Plain)).unwrap() + 0.5;
    r.insert((Fmt::Fp8, Fix::Reset), vec![one(3.0), None, None]); // resets help fp8: seed 0 only
    r.insert((Fmt::Fp4, Fix::Sr), vec![one(plain4 - 0.1), one(plain4 + 0.1), None]); // SR helps fp4: mixed
    r.insert((Fmt::Fp4, Fix::Reset), vec![one(plain4 + 0.2), one(plain4 + 0.3), None]); // resets help fp4: fail
    let blown = RunResult { val_loss: Some(9e3), diverged: true, ..Default::default() };
    r.insert((Fmt::Fp4, Fix::SrReset), vec![Some(blown); 3]);
    let md = render(t, Scale::Smoke, &r, &RunInfo { seeds: vec![0, 1, 2], ..Default::default() });
    let row = |text: &str| md.lines().find(|l| l.contains(text)).unwrap().to_string();
    assert!(row("resets help fp8").ends_with("| 1/1 | **holds in the 1 seed run so far (of 3)** |"), "{md}");
    assert!(row("SR helps fp4").ends_with("| 1/2 | **mixed in the 2 seeds run so far (of 3)** |"), "{md}");
    assert!(row("resets help fp4").ends_with("| 0/2 | **does not hold in the 2 seeds run so far (of 3)** |"), "{md}");
    assert!(row("SR + resets below plain, fp4").ends_with("| 0/3 | **n/a (a run diverged)** |"), "{md}");
    assert!(row("SR + resets below plain, fp8").ends_with("| 3/3 | **holds in all seeds** |"), "{md}");
    assert!(
        md.contains(
            "Of 13 orderings: 9 hold in all seeds, 0 mixed, 0 do not hold, 3 paired in fewer seeds than the others' 3 so \
             far (not established until their runs are in), 1 not judged."
        ),
        "{md}"
    );
}

#[test]
fn each_report_lists_the_commands_that_made_its_runs() {
    let log = |states: &[&str]| CommandLog {
        command: "train reproduce ...".into(),
        runs: 1,
        wall_s: 1.0,
        jobs: 1,
        gpus: 1,
        states: states.iter().map(|s| s.to_string()).collect(),
    };
    let theory = log(&["theory"]);
    assert!(theory.made_runs_of(States::Theory));
    assert!(!theory.made_runs_of(States::Paper) && !theory.made_runs_of(States::Blockwise));
    // The FP32/BF16 runs that `paper` and `blockwise` share belong to both, never to `theory`.
    let shared = log(&[SHARED]);
    assert!(shared.made_runs_of(States::Paper) && shared.made_runs_of(States::Blockwise));
    assert!(!shared.made_runs_of(States::Theory));
    let paper = log(&["paper"]);
    assert!(paper.made_runs_of(States::Paper) && !paper.made_runs_of(States::Blockwise));
    // A dropped kind's command is in no report; one written before the field, in all.
    assert!(!log(&["storage"]).made_runs_of(States::Paper));
    assert!(log(&[]).made_runs_of(States::Theory) && log(&[]).made_runs_of(States::Paper));
}

/// The simulated-stalling probe (section 3.3): FP32 states of the main table's FP32 cell, one
/// cell per (state, p) with its skip probability as an override (nothing else changes), the
/// p = 0 cell the main table's run (same name and fingerprint, so it is borrowed), `--cells`
/// by name, a "loss does not fall as p grows" ordering per step in p, and a report that marks
/// where each format's v sits instead of the format grid.
#[test]
fn stall_probe_cells_skip_one_state_and_borrow_p0_from_the_main_table() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfgs, t) = (configs(), Table::StallProbe);
    let all = cells(t);
    assert_eq!(all.len(), 1 + 2 * SKIP_PROBS.len());
    assert_eq!(t.borrows_from(), Some(Table::Bf16Model));
    assert!(all.iter().all(|c| c.0 == Fmt::Fp32 && cell_config(&cfgs, t, *c) == configs().join("llama100m_fp32_plain.toml")));
    let names: Vec<String> = all.iter().map(|c| cell_short(t, c)).collect();
    assert_eq!(&names[..3], ["fp32_plain", "fp32_skip_v_0.25", "fp32_skip_v_0.5"]);
    assert_eq!(names[10], "fp32_skip_m_0.99");
    assert_eq!(select_cells(t, &["fp32_skip_m_0.9".into()]).unwrap(), vec![(Fmt::Fp32, Fix::SkipM(900))]);
    let jobs = plan(spec(t, &cfgs, tmp.path(), &[]), States::Paper, &all, &[0]).unwrap();
    let main = plan(spec(Table::Bf16Model, &cfgs, tmp.path(), &[]), States::Paper, &[(Fmt::Fp32, Fix::Plain)], &[0]).unwrap();
    assert_eq!(jobs[0].planned, main[0].planned, "p = 0 is the main table's FP32 run");
    for j in &jobs[1..] {
        let c = RunConfig::load(&j.config, &j.overrides).unwrap();
        let (state, p) = j.planned.cell.1.skip().unwrap();
        let s = &c.optim.states;
        assert_eq!((s.m_skip_prob, s.v_skip_prob), if state == "m" { (p, 0.0) } else { (0.0, p) }, "{}", j.name(t));
        let mut plain = c.clone();
        plain.optim.states.m_skip_prob = 0.0;
        plain.optim.states.v_skip_prob = 0.0;
        plain.run = RunConfig::load(&main[0].config, &main[0].overrides).unwrap().run;
        assert_eq!(plain.to_toml(), resolved(&main[0]), "{} changes more than its skip probability", j.name(t));
    }
    let c = claims(t);
    assert_eq!(c.len(), 2 * SKIP_PROBS.len());
    assert_eq!((c[0].lhs, c[0].rhs, c[0].relation), ((Fmt::Fp32, Fix::SkipV(250)), (Fmt::Fp32, Fix::Plain), Relation::NotBelow));
    assert_eq!(c[0].text, "v skipped with p = 0.25 not below p = 0");
    assert_eq!((c[6].lhs, c[6].rhs), ((Fmt::Fp32, Fix::SkipM(500)), (Fmt::Fp32, Fix::SkipM(250))));
    // a loss that rises with p holds every ordering; a dip is reported
    let mut r: Results = all.iter().map(|&c| (c, vec![one(3.5 + c.1.skip().map_or(0.0, |s| s.1))])).collect();
    r.insert((Fmt::Fp32, Fix::SkipM(900)), vec![one(3.0)]);
    let verdicts: Vec<Outcome> = c.iter().map(|c| evaluate_claim(&r, c).outcome).collect();
    assert_eq!(verdicts.iter().filter(|&&o| o == Outcome::DoesNotHold).count(), 1, "{verdicts:?}");
    let md = render(t, Scale::H200Shuffled, &r, &RunInfo { seeds: vec![0], runs_total: 11, ..Default::default() });
    assert!(md.contains("| fp32 | v skipped, p = 0.75 |") && md.contains("## Where the formats sit"), "{md}");
    assert!(md.contains("| bf16 | 7 | 0.946 |") && md.contains("| fp8 (e4m3) | 3 | 1.000 |") && !md.contains("## Grid"), "{md}");
}

/// Table 7 (SOAP): AdamW with FP32 states, the main table's FP32 run (same name and
/// fingerprint, so it is borrowed, under the name `adamw_fp32`), and SOAP on the main table's
/// BF16 and FP8 `plain` / `reset` states at every scale, `optim.kind = "soap"` with the default
/// `[optim.soap]` their only difference from those cells' runs; `--cells` by name or format.
#[test]
fn soap_cells_are_the_main_tables_states_under_soap() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfgs, t) = (configs(), Table::Soap);
    let all = cells(t);
    let names: Vec<String> = all.iter().map(|c| cell_short(t, c)).collect();
    assert_eq!(names, ["adamw_fp32", "soap_bf16_plain", "soap_bf16_reset", "soap_fp8_plain", "soap_fp8_reset"]);
    assert_eq!((t.as_str(), t.borrows_from(), t.bf16_model()), ("soap", Some(Table::Bf16Model), true));
    assert_eq!(select_cells(t, &["soap_fp8_reset".into()]).unwrap(), [(Fmt::Fp8, Fix::Reset)]);
    assert_eq!(
        select_cells(t, &["fp8".into(), "adamw_fp32".into()]).unwrap(),
        [(Fmt::Fp32, Fix::Plain), (Fmt::Fp8, Fix::Plain), (Fmt::Fp8, Fix::Reset)]
    );
    assert!(select_cells(t, &["fp8_plain".into()]).is_err(), "the main table's name is not Table 7's");
    // a format the table has no cells of is refused, and the error lists only the table's own formats
    let e = select_cells(t, &["fp4".into()]).unwrap_err().to_string();
    assert!(e.contains("expected a format (fp32, bf16, fp8) or one of: adamw_fp32, soap_bf16_plain"), "{e}");
    assert_eq!(cell_name(t, (Fmt::Fp8, Fix::Reset)), "llama100m_soap_fp8_reset");
    assert_eq!(cell_config(&cfgs, t, (Fmt::Fp8, Fix::Reset)), cfgs.join("llama100m_fp8_reset.toml"));
    for scale in [Scale::Smoke, Scale::H200, Scale::H200Shuffled, Scale::Full] {
        let spec = PlanSpec { table: t, scale, configs: &cfgs, runs_root: tmp.path(), extra: &[] };
        let jobs = plan(spec, States::Paper, &all, &[0]).unwrap();
        let main = plan(PlanSpec { table: Table::Bf16Model, ..spec }, States::Paper, &cells(Table::Bf16Model), &[0]).unwrap();
        let of = |c: Cell| main.iter().find(|j| j.planned.cell == c).unwrap();
        let reference = of((Fmt::Fp32, Fix::Plain));
        assert_eq!(
            (jobs[0].planned.fingerprint.as_str(), jobs[0].run_dir.file_name()),
            (reference.planned.fingerprint.as_str(), reference.run_dir.file_name())
        );
        assert_eq!(jobs[0].planned.key, RunKey { states: SHARED.into(), cell: "adamw_fp32".into(), seed: 0 });
        for j in &jobs[1..] {
            let c = RunConfig::load(&j.config, &j.overrides).unwrap();
            assert_eq!((c.optim.kind, c.optim.soap), (OptimizerKind::Soap, SoapConfig::default()), "{}", j.name(t));
            let mut adamw = c.clone();
            adamw.optim.kind = OptimizerKind::Adamw;
            let m = of(j.planned.cell);
            adamw.run = RunConfig::load(&m.config, &m.overrides).unwrap().run;
            assert_eq!(adamw.to_toml(), resolved(m), "{} at {} changes more than the optimizer", j.name(t), scale.as_str());
        }
        // the paper's FP8 (E4M3, one amax scale per tensor), round to nearest, m and v (with L
        // and R) reset at the format's period at this scale
        let fp8 = RunConfig::load(&jobs[4].config, &jobs[4].overrides).unwrap();
        let st = fp8.optim.states.resolve(fp8.optim.beta2).unwrap();
        let k = reset_period(scale, Fmt::Fp8);
        assert_eq!(
            (st.m_format, st.block_size, st.m_scale, st.m_rounding, st.v_rounding),
            (StateFormat::Fp8E4M3, 0, ScaleKind::Amax, Rounding::Nearest, Rounding::Nearest)
        );
        assert_eq!((st.m_reset_every, st.v_reset_every), (k, k), "{}", scale.as_str());
    }
}

/// Table 7's orderings, seed by seed: FP8 SOAP with resets below FP8 SOAP (the paper: 3.23 vs
/// 4.15), BF16 SOAP with resets not above BF16 SOAP (3.19 vs 3.22; a tie holds); and the report:
/// optimizer and states per cell, the preconditioners' stalled fraction, deltas against AdamW
/// FP32, the paper's layout with AdamW below it.
#[test]
fn soap_claims_and_report() {
    let t = Table::Soap;
    let c = claims(t);
    assert_eq!(
        c.iter().map(|c| (c.lhs, c.rhs, c.relation)).collect::<Vec<_>>(),
        [
            ((Fmt::Fp8, Fix::Reset), (Fmt::Fp8, Fix::Plain), Relation::Below),
            ((Fmt::Bf16, Fix::Reset), (Fmt::Bf16, Fix::Plain), Relation::NotAbove),
        ]
    );
    let paper: Vec<(f64, bool)> = c.iter().map(|c| paper_verdict(t, PaperModel::Llama100m, c).unwrap()).collect();
    assert!((paper[0].0 + 0.92).abs() < 1e-12 && (paper[1].0 + 0.03).abs() < 1e-12 && paper[0].1 && paper[1].1, "{paper:?}");
    assert_eq!(paper_loss(t, PaperModel::Llama100m, (Fmt::Fp32, Fix::Plain)), None, "Table 7 has no AdamW number");
    let soap = |loss: f64, precond: f64| Some(RunResult { stall_precond: Some(precond), ..one(loss).unwrap() });
    let mut r: Results = BTreeMap::new();
    r.insert((Fmt::Fp32, Fix::Plain), vec![one(3.50), one(3.52)]);
    r.insert((Fmt::Bf16, Fix::Plain), vec![soap(3.60, 0.8), soap(3.61, 0.8)]);
    r.insert((Fmt::Bf16, Fix::Reset), vec![soap(3.60, 0.7), soap(3.63, 0.7)]); // a tie, then above
    r.insert((Fmt::Fp8, Fix::Plain), vec![soap(4.20, 0.99), soap(4.30, 0.99)]);
    r.insert((Fmt::Fp8, Fix::Reset), vec![soap(3.70, 0.9), soap(3.75, 0.9)]);
    let bf16 = evaluate_claim(&r, &c[1]);
    assert_eq!((bf16.outcome, bf16.seeds_holding), (Outcome::Mixed, 1));
    assert_eq!(evaluate_claim(&r, &c[0]).outcome, Outcome::HoldsInAll);
    let info = RunInfo { seeds: vec![0, 1], runs_total: 10, paper: PaperBasis::paper_cells(t), ..Default::default() };
    let md = render(t, Scale::Smoke, &r, &info);
    assert!(md.starts_with("# Reproduction of the paper's Table 7 (SOAP with low-precision states, BF16 model), scale `smoke`"), "{md}");
    assert!(md.contains("`optim.kind = \"soap\"`") && md.contains("| Δ vs AdamW fp32 (ours) | stalled m / v / w / L,R (ours) |"), "{md}");
    let row = md.lines().find(|l| l.starts_with("| SOAP, fp8 | resets |")).unwrap();
    assert!(
        row.contains("| 3.230 | 3.7250 ± 0.0354 | 2 | — | -0.920 | -0.5250 ± 0.0354 | — | +0.2150 ± 0.0212 | 0.500 / 0.900 / — / 0.900 |"),
        "{row}"
    );
    let adamw = md.lines().find(|l| l.starts_with("| AdamW, fp32 | plain (nearest) |")).unwrap();
    assert!(adamw.contains("| — | 3.5100 ± 0.0141 |") && adamw.contains("| 0.500 / 0.900 / — / — |"), "{adamw}");
    assert!(md.contains("| SOAP + resets | 3.6150 (3.190) | 3.7250 (3.230) |"), "{md}");
    assert!(md.contains("AdamW with FP32 states (the reference, not in Table 7): 3.5100."), "{md}");
    let claim = md.lines().find(|l| l.starts_with("| SOAP + resets not above SOAP, bf16 states |")).unwrap();
    assert!(claim.contains("| -0.030 | s0 +0.0000, s1 +0.0200 |") && claim.contains("| 1/2 | **mixed** |"), "{claim}");
    assert!(!md.contains("## Grid: ours (paper)\n\n| states |"), "not the format grid");
}
