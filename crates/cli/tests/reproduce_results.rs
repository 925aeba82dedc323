//! `train reproduce`'s results, through pure functions on hand-made numbers and the `train reproduce` binary:
//! the results file (fingerprints, records, merging over commands, what is left to run),
//! subsets of a table (`--cells`, `--seeds`, `--seed-list`), spreading runs over GPUs, and a
//! report rendered from a results file with seed-by-seed verdicts.

use lowbit_reproduce::*;
use lowbit_train::config::RunConfig;
use lowbit_train::logs::summary::Summary;
use std::path::{Path, PathBuf};
use std::process::Command;

fn configs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs")
}

fn smoke<'a>(table: Table, configs: &'a Path, runs: &'a Path) -> PlanSpec<'a> {
    PlanSpec { table, scale: Scale::Smoke, configs, runs_root: runs, extra: &[] }
}

/// A summary with these losses and stalled fractions.
fn summary(initial: f64, last: f64) -> Summary {
    Summary {
        status: Default::default(),
        steps: 30,
        tokens: 7680,
        params: 8_619_648,
        state_bytes: 0,
        state_bytes_per_param: 0.0,
        state_bytes_per_rank: 0,
        initial_val_loss: Some(initial),
        final_val_loss: Some(last),
        final_train_loss: None,
        mean_stall_m: Some(0.25),
        mean_stall_v: Some(0.97),
        mean_stall_w: None,
        mean_unchanged_m: Some(0.4),
        mean_unchanged_v: Some(0.98),
        mean_unchanged_w: None,
        mean_stall_precond: None,
        mean_unchanged_precond: None,
        theory_stall_v: Some(0.989),
        mean_zero_v: None,
        skipped_steps: 0,
        tokens_per_s: 1.0,
        peak_memory_bytes: None,
        epochs: Some(0.01),
        tokens_per_epoch: Some(768_000),
        tokens_per_epoch_exact: Some(true),
        data_order: None,
        state_groups: None,
    }
}

fn key(states: &str, cell: &str, seed: usize) -> RunKey {
    RunKey { states: states.into(), cell: cell.into(), seed }
}

fn record(states: &str, cell: &str, seed: usize, fp: &str, loss: f64) -> Record {
    Record::from_summary(key(states, cell, seed), fp.into(), 1e-3, &summary(10.0, loss))
}

#[test]
fn fingerprint_ignores_the_runs_folder_only() {
    let path = configs().join("fp32_model/llama100m_f32model_fp8_sr.toml");
    let load = |o: &[&str]| RunConfig::load(&path, &o.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let base = fingerprint(&load(&[]));
    assert_eq!(base.len(), 8);
    assert!(base.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(fingerprint(&load(&["run.dir=\"/tmp/elsewhere\""])), base, "another --runs folder, same run");
    assert_ne!(fingerprint(&load(&["train.max_steps=300"])), base);
    assert_ne!(fingerprint(&load(&["train.seed=1"])), base);
    assert_ne!(fingerprint(&load(&["optim.states.m_format=\"e8m3\""])), base);
}

/// Every record of the committed results files (`reproduce/records/`, the tables' and every
/// ablation's) has the fingerprint that today's configs give its run (for an ablation, with its
/// overrides): a change to the configs, to the config format (a new setting in the resolved
/// TOML) or to an ablation's overrides that would leave committed records stale fails here, not
/// on the device, where the runner would silently run every cell again; and `train reproduce
/// --ablation NAME` reruns exactly the runs its records hold.
#[test]
fn committed_results_match_todays_configs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reproduce");
    let mut targets: Vec<(Table, Scale, Option<Ablation>)> = vec![];
    for table in [Table::Fp32Model, Table::Bf16Model, Table::ResetPolicies, Table::Soap, Table::StallProbe] {
        for scale in [Scale::Smoke, Scale::H200, Scale::H200Shuffled, Scale::PaperUpdates] {
            targets.push((table, scale, None));
        }
    }
    targets.extend(ablations().into_iter().map(|a| (a.table, a.scale, Some(a))));
    let (mut checked, mut files) = (0, 0);
    for (table, scale, ablation) in targets {
        let path = results_path(&dir, table, scale, ablation.as_ref().map(|a| a.name.as_str()));
        if !path.exists() {
            continue;
        }
        files += 1;
        let file = ResultsFile::load(&path, table, scale).unwrap();
        let extra = ablation.as_ref().map_or(vec![], |a| a.overrides.clone());
        let spec = PlanSpec { table, scale, configs: &configs(), runs_root: Path::new("/tmp/runs"), extra: &extra };
        let planned: Vec<Planned> = [States::Paper, States::Blockwise, States::Theory]
            .into_iter()
            .flat_map(|s| plan_loadable(spec, s, &cells(table), &file.seeds()))
            .map(|j| j.planned)
            .collect();
        for r in &file.runs {
            let p = planned.iter().find(|p| p.key == r.key()).unwrap_or_else(|| panic!("{}: {:?} is not a cell", path.display(), r.key()));
            assert_eq!(r.fingerprint, p.fingerprint, "{} {:?}: stale record", path.display(), r.key());
            checked += 1;
        }
    }
    assert!(files >= 11 + 27, "{files} results files: the tables' and the 27 ablations' are committed");
    assert!(checked >= 446, "{checked} records checked");
}

#[test]
fn records_take_the_summary_and_flag_divergence() {
    let r = Record::from_summary(key("paper", "fp8_sr", 1), "0badf00d".into(), 1e-3, &summary(10.4, 5.61));
    assert_eq!((r.states.as_str(), r.cell.as_str(), r.seed, r.fingerprint.as_str()), ("paper", "fp8_sr", 1, "0badf00d"));
    assert_eq!((r.initial_val_loss, r.final_val_loss, r.steps, r.tokens), (Some(10.4), Some(5.61), 30, 7680));
    assert_eq!((r.mean_stall_m, r.mean_stall_v, r.theory_stall_v), (Some(0.25), Some(0.97), Some(0.989)));
    assert_eq!((r.mean_unchanged_m, r.mean_unchanged_v), (Some(0.4), Some(0.98)));
    assert!(!r.diverged);
    assert!(Record::from_summary(key("paper", "fp4_plain", 0), "x".into(), 1e-3, &summary(10.4, 28410.5)).diverged);
    assert!(Record::from_summary(key("paper", "fp4_plain", 0), "x".into(), 1e-3, &summary(10.4, f64::NAN)).diverged);
    let res = r.result();
    assert_eq!((res.val_loss, res.stall_v, res.theory_v, res.diverged), (Some(5.61), Some(0.97), Some(0.989), false));
}

/// Two device commands fill one table: each merges its finished runs into the file; a record
/// with the same key is replaced, commands are kept once each.
#[test]
fn results_files_merge_across_commands() {
    let t = Table::Fp32Model;
    let log = |runs| CommandLog { command: format!("train reproduce ... {runs}"), runs, wall_s: 470.0, jobs: 14, gpus: 2, states: vec![] };
    let mut committed = ResultsFile::new(t, Scale::H200);
    committed.upsert(record("shared", "fp32_plain", 0, "aaaaaaaa", 5.60));
    committed.upsert(record("paper", "fp8_sr", 0, "bbbbbbbb", 5.62));
    committed.commands.push(log(2));
    let mut second = ResultsFile::new(t, Scale::H200);
    second.upsert(record("paper", "fp8_sr", 0, "cccccccc", 5.58)); // rerun with another config
    second.upsert(record("shared", "fp32_plain", 1, "dddddddd", 5.64));
    second.upsert(record("blockwise", "fp8_sr", 0, "eeeeeeee", 5.63));
    second.commands.push(log(3));
    let mut merged = committed.clone();
    merged.merge(second.clone());
    merged.merge(second); // merging the same file twice changes nothing
    assert_eq!(merged.commands.len(), 2);
    let keys: Vec<_> = merged.runs.iter().map(|r| (r.states.as_str(), r.cell.as_str(), r.seed)).collect();
    assert_eq!(keys, [("blockwise", "fp8_sr", 0), ("paper", "fp8_sr", 0), ("shared", "fp32_plain", 0), ("shared", "fp32_plain", 1)]);
    assert_eq!(merged.runs[1].final_val_loss, Some(5.58), "the later command's record wins");
    assert_eq!(merged.seeds(), [0, 1]);
    // round trip through the file, and errors that name it
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(results_name(t, Scale::H200));
    assert_eq!(path.file_name().unwrap(), "fp32-model-h200-results.json");
    assert_eq!(ResultsFile::load(&path, t, Scale::H200).unwrap(), ResultsFile::new(t, Scale::H200), "missing = empty");
    merged.save(&path).unwrap();
    assert_eq!(ResultsFile::load(&path, t, Scale::H200).unwrap(), merged);
    let err = format!("{:#}", ResultsFile::load(&path, Table::Bf16Model, Scale::H200).unwrap_err());
    assert!(err.contains("fp32-model-h200-results.json") && err.contains("holds table fp32-model"), "{err}");
    std::fs::write(&path, "{ not json").unwrap();
    let err = format!("{:#}", ResultsFile::load(&path, t, Scale::H200).unwrap_err());
    assert!(err.contains("fp32-model-h200-results.json") && err.contains("does not parse"), "{err}");
}

/// A run the file holds with the same fingerprint is found (not run again); another config or
/// another seed is not; shared cells are found under `shared` for both kinds.
#[test]
fn the_file_decides_what_is_left_to_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cfgs = configs();
    let mut spec = smoke(Table::Fp32Model, &cfgs, tmp.path());
    let cells = select_cells(Table::Fp32Model, &["fp32_plain".into(), "fp8_sr".into()]).unwrap();
    let paper = plan(spec, States::Paper, &cells, &[0, 1]).unwrap();
    let storage = plan(spec, States::Blockwise, &cells, &[0]).unwrap();
    let mut file = ResultsFile::new(Table::Fp32Model, Scale::Smoke);
    for j in &paper[..2] {
        // seed 0 of both cells finished
        file.upsert(record(&j.planned.key.states, &j.planned.key.cell, 0, &j.planned.fingerprint, 6.0));
    }
    let left = |jobs: &[Job]| jobs.iter().filter(|j| file.find(&j.planned).is_none()).map(|j| j.name(Table::Fp32Model)).collect::<Vec<_>>();
    assert_eq!(left(&paper), ["llama100m_f32model_fp32_plain-s1", "llama100m_f32model_fp8_sr-s1"]);
    // storage: the shared fp32 cell is the same run; its fp8 cell is another one
    assert_eq!(storage[0].planned, paper[0].planned);
    assert_eq!(storage[0].planned.key.states, SHARED);
    assert_eq!(left(&storage), ["llama100m_f32model_fp8_sr-s0"]);
    // a changed override (here a shorter run) changes every fingerprint: all run again
    let extra = ["train.max_steps=20".to_string()];
    spec.extra = &extra;
    assert_eq!(left(&plan(spec, States::Paper, &cells, &[0]).unwrap()).len(), 2);
    // the results by cell and seed, for the report
    let r = file.results(&paper.iter().map(|j| j.planned.clone()).collect::<Vec<_>>());
    assert_eq!(r[&(Fmt::Fp8, Fix::Sr)].len(), 1);
    assert_eq!(r[&(Fmt::Fp8, Fix::Sr)][0].unwrap().val_loss, Some(6.0));
}

#[test]
fn cells_flag_takes_cells_and_formats() {
    let t = Table::Fp32Model;
    let pick = |s: &[&str]| select_cells(t, &s.iter().map(|x| x.to_string()).collect::<Vec<_>>());
    assert_eq!(pick(&[]).unwrap(), cells(t));
    assert_eq!(pick(&["fp4_sr_reset", "fp8_sr"]).unwrap(), [(Fmt::Fp8, Fix::Sr), (Fmt::Fp4, Fix::SrReset)], "table order");
    assert_eq!(
        pick(&["fp4", "fp4_sr"]).unwrap(),
        [(Fmt::Fp4, Fix::Plain), (Fmt::Fp4, Fix::Sr), (Fmt::Fp4, Fix::Reset), (Fmt::Fp4, Fix::SrReset)]
    );
    assert_eq!(pick(&["fp32"]).unwrap(), [(Fmt::Fp32, Fix::Plain), (Fmt::Fp32, Fix::Reset)]);
    let err = format!("{:#}", pick(&["fp32_sr"]).unwrap_err());
    assert!(err.starts_with("--cells: \"fp32_sr\" is not a cell of the fp32-model table"), "{err}");
    assert!(err.contains("fp4_sr_reset"), "{err}");
    // the main table has no fp32 resets cell
    assert!(select_cells(Table::Bf16Model, &["fp32_reset".into()]).is_err());
    assert_eq!(select_cells(Table::Bf16Model, &["fp32".into()]).unwrap(), [(Fmt::Fp32, Fix::Plain)]);
}

#[test]
fn seeds_are_a_count_or_an_explicit_list() {
    assert_eq!(parse_seed_list("1").unwrap(), [1]);
    assert_eq!(parse_seed_list("2,3").unwrap(), [2, 3]);
    assert_eq!(parse_seed_list("0-2").unwrap(), [0, 1, 2]);
    assert_eq!(parse_seed_list("4, 0-1,1").unwrap(), [0, 1, 4]);
    let err = format!("{:#}", parse_seed_list("2-1").unwrap_err());
    assert!(err.contains("--seed-list") && err.contains("backwards"), "{err}");
    let err = format!("{:#}", parse_seed_list("1,x").unwrap_err());
    assert!(err.contains("--seed-list") && err.contains("\"x\" is not a seed"), "{err}");
    assert_eq!(seeds_to_run(Some(2), None, 1).unwrap(), [0, 1], "--seeds 2 = seeds 0 and 1");
    assert_eq!(seeds_to_run(None, Some("2"), 1).unwrap(), [2], "--seed-list 2 = seed 2");
    assert_eq!(seeds_to_run(None, None, 2).unwrap(), [0, 1], "the scale's default count");
    assert!(format!("{:#}", seeds_to_run(Some(2), Some("1"), 1).unwrap_err()).contains("exclude each other"));
    assert!(format!("{:#}", seeds_to_run(Some(0), None, 1).unwrap_err()).contains("--seeds 0"));
}

#[test]
fn runs_spread_over_every_gpu() {
    assert_eq!(gpus_from(Some("2,3"), None), ["2", "3"]);
    assert_eq!(gpus_from(Some(""), Some("GPU 0: H200")), Vec::<String>::new(), "CUDA_VISIBLE_DEVICES wins");
    let smi = "GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n";
    assert_eq!(gpus_from(None, Some(smi)), ["0", "1"]);
    assert_eq!(gpus_from(None, None), Vec::<String>::new());
    // least-loaded first, ties to the lowest: round-robin at the start, refills a freed GPU
    let mut load = vec![0usize; 2];
    let mut order = vec![];
    for _ in 0..5 {
        let g = pick_gpu(&load).unwrap();
        load[g] += 1;
        order.push(g);
    }
    assert_eq!(order, [0, 1, 0, 1, 0]);
    load[1] -= 2; // two runs on GPU 1 finished
    assert_eq!(pick_gpu(&load), Some(1));
    assert_eq!(pick_gpu(&[]), None);
    // only CUDA runs take a GPU
    let (cfgs, tmp) = (configs(), tempfile::tempdir().unwrap());
    let mut spec = smoke(Table::Bf16Model, &cfgs, tmp.path());
    let one = [(Fmt::Fp8, Fix::Sr)];
    assert!(!plan(spec, States::Paper, &one, &[0]).unwrap()[0].cuda);
    spec.scale = Scale::H200;
    assert!(plan(spec, States::Paper, &one, &[0]).unwrap()[0].cuda);
    // default runs at once: per GPU from the scale, times the GPUs
    assert_eq!(Scale::H200.jobs_per_gpu(), 10);
    assert_eq!(Scale::H200.default_jobs(2), 20);
    assert_eq!(Scale::H200.default_jobs(0), 10);
    assert_eq!(Scale::Smoke.default_jobs(0), 2);
    // one full-length run fills the GPU at 128 x 256 (bench/training_h100.md)
    assert_eq!(Scale::H200Shuffled.default_jobs(2), 2);
}

/// The h200 scale's numbers: 10 runs of 4000 steps fit one command's 510 s at the measured
/// 81 steps/s per GPU (FP32 model), 11 do not.
#[test]
fn h200_scale_is_sized_from_the_measured_speed() {
    let steps = 4000.0;
    assert!(10.0 * steps / 81.0 <= 510.0 && 11.0 * steps / 81.0 > 510.0);
    assert_eq!(Scale::H200.jobs_per_gpu(), 10);
}

// ───────── through the binary ─────────

/// The smoke results file of `table` under the reproduce folder `root`.
fn results_at(root: &Path, table: Table) -> PathBuf {
    results_path(root, table, Scale::Smoke, None)
}

fn train(args: &[&str], cwd: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_train")).args(args).current_dir(cwd).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `train reproduce --table TABLE --scale smoke --report-only --seed-list SEEDS` in `tmp`, with
/// the repository's configs, run folders in `tmp/runs`, the committed results read from
/// `tmp/committed` and the merge and reports written to `tmp/out`.
fn report_only(tmp: &Path, table: &str, seeds: &str) -> (bool, String, String) {
    let [runs, out, committed] = ["runs", "out", "committed"].map(|d| tmp.join(d));
    let cfgs = configs();
    let dirs = [("--configs", &cfgs), ("--runs", &runs), ("--out", &out), ("--merge", &committed)];
    let mut args = vec!["reproduce", "--table", table, "--scale", "smoke", "--report-only", "--seed-list", seeds];
    args.extend(dirs.iter().flat_map(|(flag, d)| [*flag, d.to_str().unwrap()]));
    train(&args, tmp)
}

/// The report is rendered from the results file merged from `--merge`: seeds 0 and 1 of the FP8
/// cells but FP8 resets (seed 0 only), one ordering that holds in one seed only (mixed), one
/// paired in seed 0 only (holds so far, not established), stale records left out.
#[test]
fn report_only_renders_from_the_merged_results_file() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfgs, runs) = (configs(), tmp.path().join("runs"));
    let spec = smoke(Table::Fp32Model, &cfgs, &runs);
    let cells = select_cells(Table::Fp32Model, &["fp8".into()]).unwrap();
    let jobs = plan(spec, States::Paper, &cells, &[0, 1]).unwrap();
    // fp8 SR below plain in seed 0 only; SR + resets below plain in both
    let loss = |c: &str, s: usize| match (c, s) {
        ("fp8_plain", 0) => 6.00,
        ("fp8_plain", _) => 6.10,
        ("fp8_sr", 0) => 5.95,
        ("fp8_sr", _) => 6.12,
        (_, 0) => 5.90,
        _ => 6.05,
    };
    let committed = tmp.path().join("committed");
    std::fs::create_dir_all(&committed).unwrap();
    let mut file = ResultsFile::new(Table::Fp32Model, Scale::Smoke);
    for j in &jobs {
        let k = &j.planned.key;
        if (k.cell.as_str(), k.seed) != ("fp8_reset", 1) {
            file.upsert(record(&k.states, &k.cell, k.seed, &j.planned.fingerprint, loss(&k.cell, k.seed)));
        }
    }
    file.upsert(record("paper", "fp4_sr", 0, "00000000", 1.0)); // an older config
    file.save(&results_at(&committed, Table::Fp32Model)).unwrap();
    let out = tmp.path().join("out");
    let args = [
        "reproduce",
        "--table",
        "fp32-model",
        "--scale",
        "smoke",
        "--report-only",
        "--seed-list",
        "0",
        "--configs",
        cfgs.to_str().unwrap(),
        "--runs",
        runs.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--merge",
        committed.to_str().unwrap(),
    ];
    let (ok, md, err) = train(&args, tmp.path());
    assert!(ok, "{err}");
    assert_eq!(std::fs::read_to_string(out.join("fp32-model-smoke.md")).unwrap().trim_end(), md.trim_end());
    assert_eq!(
        ResultsFile::load(&results_at(&out, Table::Fp32Model), Table::Fp32Model, Scale::Smoke).unwrap(),
        file,
        "the merged file goes into --out's records"
    );
    assert!(
        md.contains("Rendered from `records/fp32-model-smoke-results.json`: 7 of 28 runs (14 cells x seeds 0, 1)"),
        "seed 1 is in the file: {md}"
    );
    assert!(md.contains("1 record(s) of the results file with another config"), "{md}");
    let row = md.lines().find(|l| l.starts_with("| fp8 | SR + resets |")).unwrap();
    assert!(row.contains("| 5.9750 ± 0.1061 | 2 |"), "{row}");
    assert!(row.contains("| 0.250 / 0.970 | 0.400 / 0.980 | 0.989 |"), "both estimators beside the theory: {row}");
    let claim = md.lines().find(|l| l.contains("SR helps fp8 states")).unwrap();
    assert!(claim.contains("| s0 -0.0500, s1 +0.0200 |") && claim.contains("| 1/2 | **mixed** |"), "{claim}");
    let claim = md.lines().find(|l| l.contains("SR + resets below plain, fp8")).unwrap();
    assert!(claim.contains("| s0 -0.1000, s1 -0.0500 |") && claim.contains("**holds in all seeds**"), "{claim}");
    let claim = md.lines().find(|l| l.contains("resets help fp8 states")).unwrap();
    assert!(claim.contains("| s0 -0.1000 |") && claim.contains("| 1/1 | **holds in the 1 seed run so far (of 2)** |"), "{claim}");
    assert!(
        md.contains(
            "Of 13 orderings: 1 hold in all seeds, 1 mixed, 0 do not hold, 1 paired in fewer seeds than the others' 2 so far \
             (not established until their runs are in), 10 not judged."
        ),
        "{md}"
    );
    // a bad subset is refused before anything runs, naming the flag
    let (ok, _, err) = train(&["reproduce", "--table", "fp32-model", "--scale", "smoke", "--cells", "fp9"], tmp.path());
    assert!(!ok && err.contains("--cells: \"fp9\""), "{err}");
    let (ok, _, err) = train(&["reproduce", "--table", "fp32-model", "--scale", "smoke", "--merge", "nowhere"], tmp.path());
    assert!(!ok && err.contains("--merge nowhere: no such folder"), "{err}");
    std::fs::write(tmp.path().join("notes.md"), "a file").unwrap();
    let (ok, _, err) = train(&["reproduce", "--table", "fp32-model", "--scale", "smoke", "--merge", "notes.md"], tmp.path());
    assert!(!ok && err.contains("--merge notes.md: not a folder"), "{err}");
}

/// Table 6 (reset policies) reads the cells it shares with the main table (FP32 plain, FP8
/// plain / SR / SR + symmetric resets) from the main table's results file: they are not run
/// twice, its own file takes their records (those made with today's configs only), and only
/// its two policies are left to run.
#[test]
fn reset_policies_borrow_the_main_tables_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfgs, runs) = (configs(), tmp.path().join("runs"));
    let main = plan(smoke(Table::Bf16Model, &cfgs, &runs), States::Paper, &cells(Table::Bf16Model), &[0]).unwrap();
    let committed = tmp.path().join("committed");
    std::fs::create_dir_all(&committed).unwrap();
    let mut file = ResultsFile::new(Table::Bf16Model, Scale::Smoke);
    let mut own = ResultsFile::new(Table::ResetPolicies, Scale::Smoke);
    for (i, j) in main.iter().enumerate() {
        let k = &j.planned.key;
        if k.cell == "fp8_sr" {
            // the main table's record is stale (another config); Table 6's own is current
            file.upsert(record(&k.states, &k.cell, k.seed, "00000000", 1.0));
            own.upsert(record(&k.states, &k.cell, k.seed, &j.planned.fingerprint, 7.77));
        } else {
            file.upsert(record(&k.states, &k.cell, k.seed, &j.planned.fingerprint, 6.0 + 0.01 * i as f64));
        }
    }
    file.save(&results_at(&committed, Table::Bf16Model)).unwrap();
    own.save(&results_at(&committed, Table::ResetPolicies)).unwrap();
    let (out, (ok, md, err)) = (tmp.path().join("out"), report_only(tmp.path(), "reset-policies", "0"));
    assert!(ok, "{err}");
    let own = ResultsFile::load(&results_at(&out, Table::ResetPolicies), Table::ResetPolicies, Scale::Smoke).unwrap();
    let cells_held: Vec<&str> = own.runs.iter().map(|r| r.cell.as_str()).collect();
    assert_eq!(cells_held, ["fp8_plain", "fp8_sr", "fp8_sr_reset", "fp32_plain"], "the shared cells, and only those");
    let sr = own.runs.iter().find(|r| r.cell == "fp8_sr").unwrap();
    assert_eq!(sr.final_val_loss, Some(7.77), "a stale record of the main table never replaces a current one");
    assert!(md.contains("Reproduction of the paper's Table 6 (FP8 reset policies, BF16 model)"), "{md}");
    assert!(md.contains("4 of 6 runs (6 cells x seed 0)"), "{md}");
    assert!(md.contains("fp8_sr_reset_v-s0, fp8_sr_adaptive-s0"), "the policies are left to run: {md}");
    // the tiny model is no size of the paper's: no paper loss beside its runs, only the
    // paper's deltas (at LLaMA-100M) of the orderings
    assert!(md.contains("No paper loss is shown beside these runs"), "{md}");
    let row = md.lines().find(|l| l.starts_with("| fp8 | SR + resets |")).unwrap();
    assert!(!row.contains("3.223"), "Table 6's symmetric policy is not this cell: {row}");
    assert!(md.contains("| SR + v resets only | — | — | — |"), "{md}");
    assert!(md.contains("| claim | paper Δ (LLaMA-100M) |"), "{md}");
}

/// Table 7 (SOAP) reads its AdamW reference from the main table's results file, under its own
/// name (`fp32_plain` there, `adamw_fp32` here), only with today's config; the main table's
/// BF16 and FP8 runs, AdamW's, are never taken for the SOAP cells of the same states.
#[test]
fn soap_borrows_only_the_adamw_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfgs, runs) = (configs(), tmp.path().join("runs"));
    let main = plan(smoke(Table::Bf16Model, &cfgs, &runs), States::Paper, &cells(Table::Bf16Model), &[0, 1]).unwrap();
    let committed = tmp.path().join("committed");
    std::fs::create_dir_all(&committed).unwrap();
    let mut file = ResultsFile::new(Table::Bf16Model, Scale::Smoke);
    for j in &main {
        let k = &j.planned.key;
        // seed 1's FP32 record is stale (another config)
        let fp = if k.seed == 1 { "00000000" } else { &j.planned.fingerprint };
        file.upsert(record(&k.states, &k.cell, k.seed, fp, 6.0 + k.seed as f64));
    }
    file.save(&results_at(&committed, Table::Bf16Model)).unwrap();
    let (out, (ok, md, err)) = (tmp.path().join("out"), report_only(tmp.path(), "soap", "0-1"));
    assert!(ok, "{err}");
    let own = ResultsFile::load(&results_at(&out, Table::Soap), Table::Soap, Scale::Smoke).unwrap();
    let held: Vec<(&str, &str, usize, Option<f64>)> =
        own.runs.iter().map(|r| (r.states.as_str(), r.cell.as_str(), r.seed, r.final_val_loss)).collect();
    assert_eq!(held, [(SHARED, "adamw_fp32", 0, Some(6.0))], "the reference of seed 0 only");
    assert!(md.contains("Reproduction of the paper's Table 7 (SOAP with low-precision states, BF16 model)"), "{md}");
    assert!(md.contains("1 of 10 runs (5 cells x seeds 0, 1)") && md.contains("soap_bf16_plain-s0"), "{md}");
    assert!(md.contains("AdamW with FP32 states (the reference, not in Table 7): 6.0000."), "{md}");
    // a SOAP key in --set, which the AdamW reference cell's config refuses: the command still
    // reports its SOAP cells, the reference shown as missing (it cannot have runs of that config)
    let set = tmp.path().join("with_set");
    std::fs::create_dir_all(set.join("committed")).unwrap();
    let (set_out, set_committed) = (set.join("out"), set.join("committed"));
    let dirs = [("--configs", &cfgs), ("--runs", &runs), ("--out", &set_out), ("--merge", &set_committed)];
    let mut args = vec!["reproduce", "--table", "soap", "--scale", "smoke", "--report-only", "--seed-list", "0"];
    args.extend(["--cells", "soap_fp8_plain", "--set", "optim.soap.precond_format=\"fp32\""]);
    args.extend(dirs.iter().flat_map(|(flag, d)| [*flag, d.to_str().unwrap()]));
    let (ok, md, err) = train(&args, tmp.path());
    assert!(ok, "{err}");
    assert!(md.contains("AdamW with FP32 states (the reference, not in Table 7): —."), "{md}");
}

/// Two commands through the real runner (2-step runs of one cell on the CPU): each merges its
/// run into the file, and a run the file holds is not run again.
#[test]
fn commands_fill_the_file_and_never_rerun_a_finished_run() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, runs) = (tmp.path().join("out"), tmp.path().join("runs"));
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cmd = |seeds: &str| {
        let args = [
            "reproduce",
            "--table",
            "fp32-model",
            "--scale",
            "smoke",
            "--cells",
            "fp32_plain",
            "--seed-list",
            seeds,
            "--set",
            "train.max_steps=2",
            "--out",
            out.to_str().unwrap(),
            "--runs",
            runs.to_str().unwrap(),
        ];
        let (ok, _, err) = train(&args, &repo);
        assert!(ok, "{err}");
        (ResultsFile::load(&results_at(&out, Table::Fp32Model), Table::Fp32Model, Scale::Smoke).unwrap(), err)
    };
    let (first, err) = cmd("0");
    assert!(err.contains("reproduce: started ") && err.contains("fp32_plain-s0 (log "), "{err}");
    assert_eq!(first.runs.len(), 1);
    assert_eq!((first.runs[0].states.as_str(), first.runs[0].cell.as_str(), first.runs[0].steps), (SHARED, "fp32_plain", 2));
    assert_eq!(first.commands.len(), 1);
    assert!(first.commands[0].command.starts_with("train reproduce --table fp32-model"), "{:?}", first.commands);
    let (again, err) = cmd("0");
    assert!(
        err.contains("1 of the 1 selected run(s) are already in")
            && err.contains("nothing to run")
            && err.contains("to run them afresh: --out DIR"),
        "{err}"
    );
    assert_eq!(again, first, "nothing ran, nothing changed");
    let (second, _) = cmd("0-1");
    assert_eq!(second.runs.iter().map(|r| r.seed).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(second.runs[0], first.runs[0]);
    assert_eq!(second.commands.len(), 2);
    let md = std::fs::read_to_string(out.join("fp32-model-smoke.md")).unwrap();
    assert!(md.contains("2 of 28 runs (14 cells x seeds 0, 1)"), "{md}");
}

/// `--deadline`: a run that would end after it is not started; with no length known or no
/// deadline, every run starts. A run's length from the file: the newest command with as many
/// runs at once, its seconds over its waves of `jobs` runs.
#[test]
fn a_run_that_would_end_after_the_deadline_is_not_started() {
    let (t, s) = (std::time::Instant::now(), std::time::Duration::from_secs);
    assert!(fits(t, Some(s(150)), Some(t + s(560))));
    assert!(fits(t + s(410), Some(s(150)), Some(t + s(560))), "ends exactly at the deadline");
    assert!(!fits(t + s(411), Some(s(150)), Some(t + s(560))));
    assert!(fits(t + s(600), None, Some(t + s(560))), "no length known");
    assert!(fits(t + s(10_000), Some(s(150)), None));
    let log = |runs, wall_s, jobs| CommandLog { command: String::new(), runs, wall_s, jobs, gpus: 1, states: vec![] };
    assert_eq!(log(3, 471.0, 3).run_seconds(), Some(471.0), "one wave of three");
    assert_eq!(log(13, 330.0, 2).run_seconds(), Some(330.0 / 7.0), "seven waves of two");
    assert_eq!(log(0, 5.0, 1).run_seconds(), None);
    let mut file = ResultsFile::new(Table::Fp32Model, Scale::H200Shuffled);
    file.commands = vec![log(2, 290.0, 1), log(3, 471.0, 3), log(4, 560.0, 1)];
    assert_eq!(file.expected_run_seconds(1), Some(140.0), "the newest at --jobs 1");
    assert_eq!(file.expected_run_seconds(3), Some(471.0));
    assert_eq!(file.expected_run_seconds(2), None);
    for wall_s in [-1.0, 1e300, f64::NAN, f64::INFINITY, MAX_WALL_S + 1.0] {
        assert_eq!(log(1, wall_s, 1).run_seconds(), None, "wall_s {wall_s}: no length");
    }
    assert!(!fits(t, Some(std::time::Duration::MAX), Some(t + s(560))), "a length past any instant never fits");
}

/// `--deadline` takes at most a year of seconds: a larger value is refused by the command line,
/// naming the flag and the range (it panicked adding the seconds to the start instant).
#[test]
fn an_absurd_deadline_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let args = ["reproduce", "--table", "fp32-model", "--scale", "smoke", "--report-only", "--out", out.to_str().unwrap()];
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // past a year, past u64, negative: each named with the range, never a panic or "unexpected argument"
    for bad in ["18446744073709551615", "-5", "31536001"] {
        let all = [&args[..], &["--deadline", bad]].concat();
        let run = Command::new(env!("CARGO_BIN_EXE_train")).args(&all).current_dir(&repo).output().unwrap();
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{err}");
        let range = format!("give whole seconds from 0 to {MAX_DEADLINE_S}");
        assert!(err.contains("--deadline") && err.contains(&range) && !err.contains("panicked"), "{bad}: {err}");
    }
}

/// A results file whose command's `wall_s` is negative or absurd gives no run length: with
/// `--deadline 500` the run starts and finishes (the runner panicked converting the seconds).
#[test]
fn an_absurd_wall_s_in_the_results_file_is_an_unknown_length() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for wall_s in [-1.0, 1e300] {
        let tmp = tempfile::tempdir().unwrap();
        let (out, runs) = (tmp.path().join("out"), tmp.path().join("runs"));
        let mut file = ResultsFile::new(Table::Fp32Model, Scale::Smoke);
        file.commands = vec![CommandLog { command: "train reproduce".into(), runs: 1, wall_s, jobs: 1, gpus: 0, states: vec![] }];
        file.save(&results_at(&out, Table::Fp32Model)).unwrap();
        let mut args = vec!["reproduce", "--table", "fp32-model", "--scale", "smoke", "--cells", "fp32_plain", "--seed-list", "0"];
        args.extend(["--jobs", "1", "--deadline", "500", "--set", "train.max_steps=2"]);
        args.extend(["--out", out.to_str().unwrap(), "--runs", runs.to_str().unwrap()]);
        let run = Command::new(env!("CARGO_BIN_EXE_train")).args(&args).current_dir(&repo).output().unwrap();
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(0), "wall_s {wall_s}: {err}");
        assert!(err.contains("reproduce: started "), "{err}");
    }
}

/// `train reproduce --help` is plain text: no rustdoc links (`[`Table::borrows_from`]`) from
/// the doc comments of its flags and their values, and the numbers they stood for are given.
#[test]
fn reproduce_help_is_plain_text() {
    let run = Command::new(env!("CARGO_BIN_EXE_train")).args(["reproduce", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{help}");
    assert!(!help.contains("[`") && !help.contains("`]"), "{help}");
    use lowbit_reproduce::scale::{H200S_STEPS as steps, PU_LR, PU_STEPS};
    assert!(PU_STEPS == 20_000 && (PU_LR - 6e-3).abs() < 1e-12, "the help's numbers of the paper-updates scale");
    assert!(help.contains(&format!("{steps} steps")) && help.contains("20,000 steps") && help.contains("6e-3"), "{help}");
}

/// Through the runner (2-step runs of one cell, one at a time on the CPU): with `--deadline 0`
/// the first run starts (no length known yet), the second is left, named, and the command
/// exits 75 with the first run's record kept; again with `--deadline 0`, the file's command
/// gives the length and no run starts; without the deadline the same command goes on.
#[test]
fn deadline_leaves_runs_for_the_next_command_and_exits_75() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, runs) = (tmp.path().join("out"), tmp.path().join("runs"));
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (o, r) = (out.to_str().unwrap(), runs.to_str().unwrap());
    let mut args = vec!["reproduce", "--table", "fp32-model", "--scale", "smoke", "--cells", "fp32_plain", "--seed-list", "0-1"];
    args.extend(["--jobs", "1", "--set", "train.max_steps=2", "--out", o, "--runs", r]);
    let with_deadline = [&args[..], &["--deadline", "0"]].concat();
    let out_of = |a: &[&str]| Command::new(env!("CARGO_BIN_EXE_train")).args(a).current_dir(&repo).output().unwrap();
    let seeds = || {
        let file = ResultsFile::load(&results_at(&out, Table::Fp32Model), Table::Fp32Model, Scale::Smoke).unwrap();
        file.runs.iter().map(|r| r.seed).collect::<Vec<_>>()
    };
    let first = out_of(&with_deadline);
    let err = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(75), "{err}");
    assert!(
        err.contains("1 run(s) not started: a run takes ~")
            && err.contains("(the longest finished here)")
            && err.contains("1 run(s) left by --deadline for the next command")
            && err.contains("llama100m_f32model_fp32_plain-s1"),
        "{err}"
    );
    assert_eq!(seeds(), [0]);
    let again = out_of(&with_deadline);
    let err = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(75), "{err}");
    assert!(err.contains("(the results file's last command at this --jobs)") && !err.contains("reproduce: started "), "{err}");
    assert_eq!(seeds(), [0]);
    let last = out_of(&args);
    assert_eq!(last.status.code(), Some(0), "{}", String::from_utf8_lossy(&last.stderr));
    assert_eq!(seeds(), [0, 1]);
}

/// A second `train reproduce` on the same table, scale and `--out` while one is running is
/// refused up front, naming the first (two at once split the cells and overwrote each other's
/// records); the lock goes with the command.
#[test]
fn a_second_runner_on_the_same_results_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir_all(out.join(RECORDS)).unwrap();
    let lock_path = results_at(&out, Table::Fp32Model).with_extension("json.lock");
    let held = lowbit_train::run_folder::lock_file(&lock_path, |_, _| unreachable!()).unwrap();
    let args = ["reproduce", "--table", "fp32-model", "--scale", "smoke", "--report-only", "--out", out.to_str().unwrap()];
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (ok, _, err) = train(&args, &repo);
    assert!(!ok, "{err}");
    assert!(
        err.contains("fp32-model-smoke-results.json is being written by another train reproduce (process ")
            && err.contains(&format!("process {}", std::process::id())),
        "{err}"
    );
    drop(held);
    assert!(!lock_path.exists());
    let (ok, _, err) = train(&args, &repo);
    assert!(ok, "{err}");
    assert!(!lock_path.exists(), "the command's lock is gone with it");
}

/// `train reproduce --ablation NAME --report-only` over records made for that ablation, with
/// `--merge` (the committed folder): records ready under `<merge>/records/ablations/<name>/`.
fn ablation_report(tmp: &Path, name: &str, set: &[&str], records: &[(&str, usize, f64, usize)]) -> (bool, String, String) {
    let (cfgs, runs, committed, out) = (configs(), tmp.join("runs"), tmp.join("committed"), tmp.join("out"));
    let ab = ablation(name).unwrap();
    let extra: Vec<String> = ab.overrides.iter().cloned().chain(set.iter().map(|s| s.to_string())).collect();
    let spec = PlanSpec { table: ab.table, scale: ab.scale, configs: &cfgs, runs_root: &runs, extra: &extra };
    let cells = select_cells(ab.table, &ab.cells).unwrap();
    let jobs = plan(spec, States::Paper, &cells, &[0, 1]).unwrap();
    let mut file = ResultsFile::new(ab.table, ab.scale);
    for &(cell, seed, loss, params) in records {
        let j = jobs.iter().find(|j| (j.planned.key.cell.as_str(), j.planned.key.seed) == (cell, seed)).unwrap();
        let mut r = record(&j.planned.key.states, cell, seed, &j.planned.fingerprint, loss);
        r.params = params;
        r.card = Some("NVIDIA H100 80GB HBM3".into());
        file.upsert(r);
    }
    let path = results_path(&committed, ab.table, ab.scale, Some(name));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    file.save(&path).unwrap();
    let mut args = vec!["reproduce", "--ablation", name, "--report-only"];
    for s in set {
        args.extend(["--set", s]);
    }
    let dirs = [("--configs", &cfgs), ("--runs", &runs), ("--out", &out), ("--merge", &committed)];
    args.extend(dirs.iter().flat_map(|(flag, d)| [*flag, d.to_str().unwrap()]));
    train(&args, tmp)
}

/// An ablation's report is rendered from its runs' resolved config: a reset-period override at
/// another model size shows no paper number beside its runs (neither the 100M main table's
/// 3.260 nor Table 4's 60M 3.48: the state settings are not the paper's cell), its heading
/// names the model size and the overrides, and its missing-run list names only the runs the
/// ablation plans (its one cell, its seeds 0-1), not the table's other cells or a seed 2.
#[test]
fn an_ablation_report_shows_only_its_runs_and_no_paper_number() {
    let tmp = tempfile::tempdir().unwrap();
    let set = ["model.preset=\"llama60m\""];
    let (ok, md, err) = ablation_report(tmp.path(), "fp4_period_400", &set, &[("fp4_sr_reset", 0, 3.61, 58_100_000)]);
    assert!(ok, "{err}");
    let out = tmp.path().join("out");
    assert_eq!(std::fs::read_to_string(out.join("ablations/fp4_period_400.md")).unwrap().trim_end(), md.trim_end());
    assert!(md.starts_with("# Ablation `fp4_period_400`: FP4 SR + resets of m and v every 400 steps (Fig. 4)"), "{md}");
    assert!(md.contains("Rendered from `../records/ablations/fp4_period_400/bf16-model-h200-shuffled-results.json`: 1 of 2 runs (1 cells x seeds 0, 1); 58.1M parameters"), "{md}");
    assert!(md.contains("`llama60m` model (58.1M parameters), BF16 weights and activations"), "{md}");
    assert!(
        md.contains("Overrides of every run beyond its cell and the scale: `optim.states.m_reset_every=400`, `optim.states.v_reset_every=400`, `model.preset=\"llama60m\"`."),
        "{md}"
    );
    assert!(md.contains("**1 run(s) missing** (not run yet, failed, or did not finish): fp4_sr_reset-s1.\n"), "{md}");
    assert!(md.contains("No paper number is shown"), "{md}");
    for paper in ["3.260", "3.480", "3.48 ", "(paper)", "-0.060", "-0.040"] {
        assert!(!md.contains(paper), "{paper:?} in {md}");
    }
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| fp")).collect();
    assert_eq!(rows.len(), 1, "only the ablation's cell: {rows:?}");
    assert!(rows[0].starts_with("| fp4 | SR + resets | 3.6100 | 1 | H100 |"), "{}", rows[0]);
    assert!(md.contains("Cards: H100."), "{md}");
}

/// The model-scale ablation at 60M keeps the paper's state settings: its cells are the paper's
/// cells at a size the paper publishes (Table 4), so Table 4's 60M numbers stand beside them and
/// the orderings quote Table 4's 60M deltas (FP4 3.52 -> 3.48: -0.040), never the 100M table's.
#[test]
fn the_60m_ablation_sits_beside_table_4s_60m_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = [("fp4_plain", 0, 3.80, 58_100_000), ("fp4_sr_reset", 0, 3.82, 58_100_000)];
    let (ok, md, err) = ablation_report(tmp.path(), "model_60m", &[], &runs);
    assert!(ok, "{err}");
    assert!(md.contains("Paper: LLaMA-60M, Table 4 (model scale), on C4"), "{md}");
    let row = md.lines().find(|l| l.starts_with("| fp4 | SR + resets |")).unwrap();
    assert!(row.starts_with("| fp4 | SR + resets | 3.480 | 3.8200 | 1 | H100 | -0.040 | +0.0200 |"), "{row}");
    let claim = md.lines().find(|l| l.starts_with("| SR + resets below plain, fp4 states |")).unwrap();
    assert!(claim.contains("| -0.040 | s0 +0.0200 |") && claim.contains("**does not hold"), "{claim}");
    assert!(md.contains("| claim | paper Δ (LLaMA-60M) |"), "{md}");
    assert!(!md.contains("3.260") && !md.contains("3.320"), "no 100M number: {md}");
    // 14 planned runs (7 cells x seeds 0, 1): the two recorded, twelve named missing
    assert!(md.contains("2 of 14 runs (7 cells x seeds 0, 1)") && md.contains("**12 run(s) missing**"), "{md}");
}

/// `--list-ablations` names every ablation with its table, cells and purpose; `--ablation`
/// refuses an unknown name (listing the known) and a `--scale` other than its own.
#[test]
fn ablations_are_listed_and_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let (ok, list, err) = train(&["reproduce", "--list-ablations"], tmp.path());
    assert!(ok, "{err}");
    for name in ["fp4_period_400", "fp8_period_2000", "soap_fp8_block128", "model_60m", "batch_512", "v_only_keep", "fp4_variant_mx"] {
        assert!(list.lines().any(|l| l.starts_with(name)), "{name} not listed: {list}");
    }
    assert!(
        list.contains("fp4_period_400 ") && list.contains("bf16-model h200-shuffled [fp4_sr_reset] seeds 0-1: FP4 SR + resets"),
        "{list}"
    );
    assert_eq!(list.lines().count(), ablations().len());
    let (ok, _, err) = train(&["reproduce", "--ablation", "fp4_period_7"], tmp.path());
    assert!(!ok && err.contains("--ablation \"fp4_period_7\": no such ablation") && err.contains("fp4_period_400"), "{err}");
    let (ok, _, err) = train(&["reproduce", "--ablation", "fp4_period_400", "--scale", "smoke"], tmp.path());
    assert!(!ok && err.contains("runs at scale h200-shuffled, not --scale smoke"), "{err}");
    let (ok, _, err) = train(&["reproduce", "--scale", "smoke"], tmp.path());
    assert!(!ok && err.contains("--table"), "{err}");
}

/// The process ids whose parent is `parent` (`/proc/*/stat`'s fourth field).
#[cfg(target_os = "linux")]
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // after the command's name in parentheses: state, then the parent's id
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent)
        })
        // the training run, not a short-lived probe such as `nvidia-smi -L`
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.windows(8).any(|w| w == b"--config")))
        .collect()
}

/// Whether `pid` is still running (not gone, not a zombie waiting for its reaper).
#[cfg(target_os = "linux")]
fn running(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()).is_some_and(|s| s != "Z" && s != "X")
}

/// A run of `train reproduce` dies with its runner: SIGINT, SIGTERM or SIGKILL to the runner
/// while a training child runs, and the child (which trained on as an orphan) ends. On SIGINT
/// and SIGTERM the runner passes the signal on and waits: when it ends, by that signal, its run
/// has ended; on SIGKILL the run gets SIGTERM from the kernel and ends within seconds.
#[cfg(target_os = "linux")]
#[test]
fn runs_die_with_their_runner() {
    use std::os::unix::process::ExitStatusExt;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGKILL] {
        let tmp = tempfile::tempdir().unwrap();
        let (out, runs) = (tmp.path().join("out"), tmp.path().join("runs"));
        let args = ["reproduce", "--table", "fp32-model", "--scale", "smoke", "--cells", "fp32_plain", "--seed-list", "0"];
        let mut runner = Command::new(env!("CARGO_BIN_EXE_train"))
            .args(args)
            .args(["--set", "train.max_steps=100000", "--out", out.to_str().unwrap(), "--runs", runs.to_str().unwrap()])
            .current_dir(&repo)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        let child = loop {
            if let Some(&c) = children_of(runner.id()).first() {
                break c;
            }
            assert!(t0.elapsed().as_secs() < 60, "no training run started");
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert!(running(child), "the run is under way");
        // SAFETY: a signal to the runner this test started
        unsafe { libc::kill(runner.id() as libc::pid_t, signal) };
        let status = runner.wait().unwrap();
        assert_eq!(status.signal(), Some(signal), "the runner ends by the signal it got");
        if signal != libc::SIGKILL {
            assert!(!running(child), "the runner (signal {signal}) ended before its run (process {child})");
        }
        let t1 = std::time::Instant::now();
        while running(child) {
            if t1.elapsed().as_secs() >= 30 {
                // SAFETY: a signal to the orphan of the runner this test started
                unsafe { libc::kill(child as libc::pid_t, libc::SIGKILL) };
                panic!("the run (process {child}) outlived its runner (signal {signal}) by 30 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}
