//! A run between its steps: [`Session::open`] sets up data, model, optimizer, resume and the
//! run folder (with every builder it uses); then [`Session::validate`] and
//! [`Session::checkpoint`] are, with the step ([`crate::step`]), the units that
//! [`crate::run::run`]'s loop calls.

use crate::checkpoint::{self, Stateful};
use crate::components::ModelWeights;
use crate::config::{KernelChoice, MatmulPrecision, RunConfig, WeightDtype};
use crate::distributed;
use crate::distributed::collective::{Collective, Solo};
use crate::eval::{evaluate_until, export_check, EXPORT_CHECK};
use crate::logs::metrics::MetricsRow;
use crate::logs::stall_writer::StallWriter;
use crate::logs::stalls::Theory;
use crate::logs::summary::StateGroup;
use crate::logs::RunLogs;
use crate::run_folder::{self, FolderUse, RunLock};
use crate::setting_warnings::{passes_planned, passes_warning, setting_warnings};
use crate::train_state::{load_state, records_data_order, TrainState};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Var};
use lowbit_data::{load_tokenizer, shared_documents, validation_batches, Batch, DataPosition, TrainStream, OVERLAP_SAMPLE};
use lowbit_model::{init_params, try_param_group, Kernels, Llama, LlamaConfig};
use lowbit_optim::{Hyper, LowbitAdamW, Optimizer, ParamInfo, StatesPlan};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// How a run starts.
pub struct Launch {
    pub config: RunConfig,
    /// Resume from this checkpoint folder.
    pub resume_from: Option<PathBuf>,
    /// Accept a checkpoint without `manifest.json` (its files unverified; `--trust-checkpoint`).
    /// Otherwise such a checkpoint is refused ([`crate::checkpoint::verify_for_resume`]).
    pub trust_unverified: bool,
    /// New run, new run over an old one moved aside, or resume ([`FolderUse`]).
    pub folder: FolderUse,
    /// Set by Ctrl-C or SIGTERM: write a checkpoint and stop after the current step.
    pub interrupt: Arc<AtomicBool>,
    /// Stop (with a checkpoint) after this step, as if interrupted (tests of resume).
    pub stop_after: Option<u64>,
    /// The other ranks of a data-parallel job ([`Solo`] for one process).
    pub comm: Arc<dyn Collective>,
    /// This process's rank on its host (`LOCAL_RANK`): the GPU it trains on when
    /// `train.device = "cuda"`.
    pub local_rank: usize,
}

impl Launch {
    /// A new run of `config` (its folder must not hold a run yet), not interrupted.
    pub fn new(config: RunConfig) -> Launch {
        Launch {
            config,
            resume_from: None,
            trust_unverified: false,
            folder: FolderUse::New,
            interrupt: Default::default(),
            stop_after: None,
            comm: Arc::new(Solo),
            local_rank: 0,
        }
    }

    /// Resume `config`'s run from the checkpoint folder `from`.
    pub fn resume(config: RunConfig, from: PathBuf) -> Launch {
        Launch { resume_from: Some(from), folder: FolderUse::Resume, ..Launch::new(config) }
    }
}

/// Everything a run holds between steps.
pub struct Session {
    /// What runs (model, states, theory), for the caller to show once.
    banner: String,
    pub cfg: RunConfig,
    pub run_dir: PathBuf,
    config_toml: String,
    pub dev: Device,
    dtype: DType,
    /// The exported `config.json`: the model and the tokenizer's special ids.
    hf_config: serde_json::Value,
    varmap: candle_nn::VarMap,
    pub(crate) model: Llama,
    pub(crate) params: ParamSet,
    pub(crate) opt: Box<dyn Optimizer>,
    pub state: TrainState,
    val: Vec<Batch>,
    pub(crate) stream: TrainStream,
    /// The other ranks ([`crate::distributed::collective::Solo`] in a single process).
    pub(crate) comm: Arc<dyn Collective>,
    /// Micro-batches this rank accumulates per step (`train.grad_accum / ranks`).
    pub(crate) accum_per_rank: usize,
    /// The run folder's writers: rank 0 only (`None` on the other ranks, which write nothing).
    pub(crate) logs: Option<RunLogs>,
    /// The stall rows not written yet (counts are read `count_lag` steps late), and their writer.
    pub(crate) stall_log: StallWriter,
    pub n_params: usize,
    pub state_bytes: usize,
    /// Optimizer state bytes this rank holds (its shard with `train.zero = 1`).
    pub rank_state_bytes: usize,
    /// Which tensors got which states (`summary.json`'s `state_groups`).
    pub state_groups: Vec<StateGroup>,
    /// CUDA pool high-water mark, bytes.
    pub device_peak: Option<u64>,
    pub last_checkpoint: Option<PathBuf>,
    /// Held until the run ends (rank 0): no second run writes into this folder meanwhile.
    _lock: Option<RunLock>,
}

impl Session {
    /// Sets up a run (or resumes one): tokenizer, model, optimizer states, the checkpoint's
    /// state, validation batches, the training stream and the run folder's writers. The run
    /// folder is touched, and the model banner printed, only after all of these succeeded
    /// ([`run_folder::claim`]).
    pub fn open(launch: &Launch) -> Result<Session> {
        let mut cfg = launch.config.clone();
        let resume = match &launch.resume_from {
            Some(dir) => Some((dir, load_state(dir)?)),
            None => None,
        };
        if let Some((dir, saved)) = &resume {
            adopt_unrecorded_scale_kind(&mut cfg, dir, saved)?;
            adopt_unrecorded_data_order(&mut cfg, dir)?;
        }
        let run_dir = cfg.run_dir();
        let config_toml = cfg.to_toml();
        // the config check first: a rank with another device setting must not reach NCCL's set-up
        same_config_as_rank0(launch.comm.as_ref(), &config_toml)?;
        let dev = crate::device::open(&cfg.train.device, launch.local_rank)?;
        let comm = distributed::for_device(launch.comm.clone(), &dev)?;
        let (rank, world) = (comm.rank(), comm.world_size());
        let accum_per_rank = cfg.train.accum_per_rank(world)?;
        let plan = StatesPlan::resolve(&cfg.optim.states, cfg.optim.beta2).map_err(anyhow::Error::msg)?;
        let spec = plan.base;

        // Data and model.
        let tok = load_tokenizer(&cfg.data.tokenizer, cfg.data.allow_download).map_err(data_err)?;
        let mcfg = cfg.model_config(tok.vocab_size()).with_context(|| format!("model config with tokenizer {}", tok.source.display()))?;
        // before anything of the model's size is allocated (on the CPU an allocation that
        // fails aborts the process) or the run folder is claimed
        let refused = match crate::device::available_memory(&dev) {
            Some((available, place)) => crate::memory::MemoryFloor::of(&cfg, &mcfg, &plan, world).check(available, place).err(),
            None => None,
        };
        // every rank takes the same way (a rank that went on would wait in a collective)
        let any_refused = any_rank(launch.comm.as_ref(), refused.is_some())?;
        match refused {
            Some(e) => return Err(e),
            None if any_refused => bail!("another rank's device cannot hold this config (its error names the sizes)"),
            None => {}
        }
        let dtype = match cfg.model.dtype {
            WeightDtype::F32 => DType::F32,
            WeightDtype::Bf16 => DType::BF16,
        };
        // The exported config.json: the model, and the tokenizer's special ids for `generate`.
        let mut hf_config = mcfg.hf_config_json_with_dtype(dtype);
        hf_config.as_object_mut().context("config.json is a JSON object")?.extend(tok.hf_token_ids());
        let varmap = init_params(&mcfg, cfg.train.seed, dtype, &dev)?;
        let model = build_model(&cfg, &mcfg, &varmap, dtype, &dev)?;
        let params = ParamSet::from_varmap(&varmap);
        let infos = param_infos(&params)?;
        plan.check_groups(infos.iter().map(|i| i.group.as_str())).map_err(anyhow::Error::msg)?;
        let hyper = Hyper { beta1: cfg.optim.beta1, beta2: cfg.optim.beta2, eps: cfg.optim.eps, weight_decay: cfg.optim.weight_decay };
        let mut host = LowbitAdamW::new(hyper, plan, cfg.train.seed, infos.clone());
        let state_groups = StateGroup::of(&host);

        // Resume.
        let mut state = TrainState {
            step: 0,
            tokens: 0,
            data: DataPosition::default(),
            nonfinite_in_row: 0,
            updates: 0,
            m_format: spec.m_format.name().into(),
            v_format: spec.v_format.name().into(),
            block_size: spec.block_size,
            v_zero: spec.v_zero.as_str().into(),
            m_scale: scale_name(spec.m_format, spec.m_scale),
            v_scale: scale_name(spec.v_format, spec.v_scale),
            reset: spec.reset.as_str().into(),
            adaptive_reset: None,
            params: infos.iter().map(|i| (i.name.clone(), i.len)).collect(),
            rng: lowbit_optim::rng::SCHEME.into(),
            ranks: world as u64,
            global_batch: cfg.train.micro_batch.saturating_mul(cfg.train.grad_accum) as u64,
            tensor_states: host.tensors.iter().filter(|t| t.spec != spec).map(|t| (t.info.name.clone(), t.spec.describe())).collect(),
        };
        if let Some((dir, saved)) = resume {
            check_compatible(dir, &saved, &state)?;
            if saved.adaptive_reset.is_some() {
                // written before the optimizer saved the rule's state itself: state.json has it
                host.adaptive = saved.adaptive_reset.clone();
            }
            checkpoint::load(dir, &mut [&mut ModelWeights(&varmap), &mut host])?;
            if saved.global_batch != 0 && saved.global_batch != state.global_batch && rank == 0 {
                tracing::warn!(
                    "--resume {}: the global batch changes from {} sequences per step to {} (train.micro_batch {} x \
                     train.grad_accum {}); set them back to keep it",
                    dir.display(),
                    saved.global_batch,
                    state.global_batch,
                    cfg.train.micro_batch,
                    cfg.train.grad_accum
                );
            }
            state = TrainState {
                rng: lowbit_optim::rng::SCHEME.into(),
                v_zero: spec.v_zero.as_str().into(),
                reset: state.reset,
                adaptive_reset: None,
                m_scale: state.m_scale,
                v_scale: state.v_scale,
                ranks: state.ranks,
                global_batch: state.global_batch,
                ..saved
            };
            tracing::info!("resumed from {} at step {}", dir.display(), state.step);
        }
        let theory = Theory::for_spec(&spec, cfg.optim.beta2);
        let stall_log = StallWriter::new(&host, theory, cfg.run.stall_detail_every);
        let (mut opt, rank_state_bytes): (Box<dyn Optimizer>, Option<usize>) = match cfg.train.zero {
            0 => (lowbit_optim::for_device(host, &dev)?, None),
            _ => {
                let opt = distributed::zero::Zero1::new(&host, comm.clone(), &dev)?;
                let bytes = opt.local_state_bytes();
                tracing::info!("train.zero = 1: rank {rank} of {world} holds {bytes} bytes of optimizer states");
                (Box::new(opt), Some(bytes))
            }
        };

        let n_params = params.num_params();
        let state_bytes = opt.states()?.state_bytes();
        let rank_state_bytes = rank_state_bytes.unwrap_or(state_bytes);
        let global_batch = state.global_batch;
        let val = validation_batches(&cfg.data, &tok, cfg.train.micro_batch).map_err(data_err)?;
        // (no validation set, as in `train bench training`: nothing to overlap)
        let shared = if cfg.data.val_tokens == 0 { 0 } else { shared_documents(&cfg.data, &tok, OVERLAP_SAMPLE).map_err(data_err)? };
        if shared > 0 {
            tracing::warn!(
                shared,
                sample = OVERLAP_SAMPLE,
                "the validation shards share documents with the training shards ({shared} of the first \
                 {OVERLAP_SAMPLE} documents of each training shard): the validation loss measures \
                 memorisation; check data.validation"
            );
        }
        let stream = TrainStream::new(&cfg.data_config(), &tok, state.data.clone()).map_err(data_err)?;
        let passes = passes_planned(&cfg, stream.pass_size());

        // Only now, with everything validated and a resume's checkpoint accepted, touch the run
        // folder: a start that fails leaves the folder as it was.
        // Rank 0 alone writes the run folder.
        let (lock, logs) = if rank == 0 && launch.folder != FolderUse::None {
            let lock = run_folder::claim(&run_dir, launch.folder)?;
            // a summary marks an ended run (`train stalls --follow` stops on it)
            let _ = std::fs::remove_file(run_dir.join("summary.json"));
            checkpoint::write_atomic(&run_dir.join("config.toml"), config_toml.as_bytes())?;
            let keep = launch.resume_from.is_some().then_some(state.step);
            let logs = RunLogs::open(&run_dir, keep, cfg.run.tensorboard)?;
            (Some(lock), Some(logs))
        } else {
            (None, None)
        };
        // What runs, said by the caller once the folder is ours (a refused start says only its
        // error): the model, the states, the theory.
        let mut banner = format!(
            "model {} params ({} layers, hidden {}, {:?} weights, {:?} kernels) | states m={} v={} ({} / {}): {} bytes = {:.3} bytes/param | batch {} x {} tokens{} | device {}\nstates: {}",
            n_params,
            mcfg.num_layers,
            mcfg.hidden_size,
            dtype,
            model.kernels(),
            spec.m_format.name(),
            spec.v_format.name(),
            spec.m_rounding.as_str(),
            spec.v_rounding.as_str(),
            state_bytes,
            state_bytes as f64 / n_params as f64,
            global_batch,
            cfg.data.seq_len,
            match world {
                1 => String::new(),
                w => format!(" ({w} ranks x micro-batch {} x {accum_per_rank} accumulated)", cfg.train.micro_batch),
            },
            cfg.train.device,
            spec.describe(),
        );
        if state_groups.len() > 1 {
            banner += &state_groups.iter().map(|g| format!("\n{}", g.line())).collect::<String>();
        }
        banner += &format!("\n{}", weight_decay_line(&infos, cfg.optim.weight_decay));
        banner += &format!(
            "\ndata: {} | {} target tokens per pass{}; {} steps make {passes:.2} passes",
            stream.order().describe(),
            stream.pass_size().tokens,
            if stream.pass_size().exact { "" } else { " (estimated from the shards' size)" },
            cfg.train.max_steps
        );
        if let Some(p) = theory.v {
            banner += &format!("\ntheory: v stalled fraction {p:.3} for {} at b2 = {}", spec.v_format.name(), cfg.optim.beta2);
        }
        if rank == 0 {
            let largest = infos.iter().map(|i| i.len).max().unwrap_or(0);
            for w in setting_warnings(&cfg, &spec, largest).into_iter().chain(passes_warning(&cfg, stream.pass_size(), passes)) {
                tracing::warn!("{w}");
            }
        }

        Ok(Session {
            banner,
            cfg,
            run_dir,
            config_toml,
            dev,
            dtype,
            hf_config,
            varmap,
            model,
            params,
            opt,
            state,
            val,
            stream,
            comm,
            accum_per_rank,
            logs,
            stall_log,
            n_params,
            state_bytes,
            rank_state_bytes,
            state_groups,
            device_peak: None,
            last_checkpoint: None,
            _lock: lock,
        })
    }

    /// Validation loss of the model now, written to `metrics.jsonl` as step `step`;
    /// `batch_done(done, total)` after each validation batch.
    pub fn validate(&mut self, step: u64, batch_done: &mut dyn FnMut(usize, usize)) -> Result<f64> {
        Ok(self.validate_until(step, &AtomicBool::new(false), batch_done)?.expect("never stopped"))
    }

    /// [`Session::validate`] that gives up (`None`, nothing written) once `stop` is set.
    pub fn validate_until(&mut self, step: u64, stop: &AtomicBool, batch_done: &mut dyn FnMut(usize, usize)) -> Result<Option<f64>> {
        let Some(vl) = evaluate_until(&self.model, &self.val, &self.dev, stop, batch_done)? else { return Ok(None) };
        if let Some(logs) = &mut self.logs {
            logs.metric(&MetricsRow::Eval { step, tokens: self.state.tokens, val_loss: vl, val_ppl: vl.exp() })?;
        }
        Ok(Some(vl))
    }

    /// Ends a new run stopped before its first step: the files it wrote into its folder
    /// (config, logs, lock) are removed, and the folder too when nothing else is in it, so the
    /// same command starts afresh. Returns the folder.
    pub fn discard(mut self) -> Result<PathBuf> {
        let dir = self.run_dir.clone();
        let lock = self._lock.take();
        drop(self); // closes the logs
                    // with the lock still held: no other run can claim the folder meanwhile
        if lock.is_some() {
            crate::run_folder::remove_run_files(&dir)?;
        }
        drop(lock); // releases and removes the lock file
        let _ = std::fs::remove_dir(&dir); // only when empty
        Ok(dir)
    }

    /// Number of validation micro-batches.
    pub fn val_batches(&self) -> usize {
        self.val.len()
    }

    /// Writes the stall rows still pending, then a checkpoint of the current step (rank 0;
    /// every rank must call it, as the states may be gathered from all). Returns the
    /// checkpoint folder on rank 0.
    pub fn checkpoint(&mut self) -> Result<Option<PathBuf>> {
        self.flush_stalls()?;
        // rank 0 of a run with a folder (its writers are open) writes it
        let writes = self.is_leader() && self.logs.is_some();
        let states = self.opt.states()?;
        if !writes {
            return Ok(None);
        }
        let check = export_check(&self.model, &self.val, &self.dev, self.dtype)?;
        // the stream's whole position: in streaming mode with the shuffle buffer's rows
        self.state.data = self.stream.position();
        let state = &self.state;
        let files = [
            ("config.json", serde_json::to_vec_pretty(&self.hf_config)?),
            ("state.json", state.to_json()?),
            ("config.toml", self.config_toml.clone().into_bytes()),
            (EXPORT_CHECK, serde_json::to_vec(&check)?),
        ];
        let components: [&dyn Stateful; 3] = [&ModelWeights(&self.varmap), states, &state.data];
        let dir = checkpoint::save(&self.run_dir, state.step, self.cfg.train.keep_checkpoints, &components, &files)?;
        tracing::info!("checkpoint {}", dir.display());
        self.last_checkpoint = Some(dir.clone());
        Ok(Some(dir))
    }

    /// What runs: the model, the states, the theory (a few lines).
    pub fn banner(&self) -> &str {
        &self.banner
    }

    /// The model being trained, and its weights' dtype.
    pub fn model(&self) -> &Llama {
        &self.model
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The folder of the checkpoint of `step` (written by rank 0).
    pub fn checkpoint_dir_of(&self, step: u64) -> PathBuf {
        checkpoint::step_dir(&self.run_dir, step)
    }

    /// Whether this is rank 0, which writes the run folder and reports.
    pub fn is_leader(&self) -> bool {
        self.comm.rank() == 0
    }

    /// Data-parallel ranks of this launch (1 for a single process).
    pub fn ranks(&self) -> usize {
        self.comm.world_size()
    }

    /// Whether `flag` is true on any rank (every rank must call it: e.g. an interrupt seen by
    /// one rank stops all of them after the same step).
    pub fn any_rank(&self, flag: bool) -> Result<bool> {
        any_rank(self.comm.as_ref(), flag)
    }

    /// Writes every pending stall row (waits for the device's counters).
    pub fn flush_stalls(&mut self) -> Result<()> {
        self.write_stalls(0)?;
        Ok(())
    }

    /// Writes the stall rows due with `lag` steps left pending: each update's counts read from
    /// the optimizer (which observes them itself for its adaptive reset rule), a skipped
    /// step's zero. Returns the (m, v) stalled fractions of the last row written.
    pub(crate) fn write_stalls(&mut self, lag: usize) -> Result<Option<(Option<f64>, Option<f64>)>> {
        let mut last = None;
        while let Some((step, update)) = self.stall_log.next_due(lag) {
            let counts = match update {
                Some(u) => Some((u, self.opt.stall_counts(u)?)),
                None => None,
            };
            let row = counts.as_ref().map(|(u, c)| (*u, c.as_slice()));
            last = Some(self.stall_log.write(step, row, self.logs.as_mut())?);
        }
        Ok(last)
    }
}

/// A checkpoint written before scale kinds were recorded holds `pow2` FP8/FP4 states: with
/// `optim.states.scale = "default"` (whose FP4 kind is now `amax`), resume it with `pow2`, said
/// once and written to the run's `config.toml` (an explicit kind is left to the checkpoint
/// check, which refuses a mismatch).
fn adopt_unrecorded_scale_kind(cfg: &mut RunConfig, dir: &std::path::Path, saved: &TrainState) -> Result<()> {
    let states = &cfg.optim.states;
    if !(saved.m_scale.is_empty() && saved.v_scale.is_empty()) || states.scale != lowbit_optim::ScaleChoice::Default {
        return Ok(());
    }
    let spec = states.resolve(cfg.optim.beta2).map_err(anyhow::Error::msg)?;
    let minifloat_amax = |f: lowbit_optim::StateFormat, k| f.minifloat().is_some() && k == lowbit_optim::ScaleKind::Amax;
    if minifloat_amax(spec.m_format, spec.m_scale) || minifloat_amax(spec.v_format, spec.v_scale) {
        tracing::info!(
            "{}: written before scale kinds were recorded, its fp8/fp4 states have pow2 scales: resuming with \
             optim.states.scale = \"pow2\"",
            dir.join("state.json").display()
        );
        cfg.optim.states.scale = lowbit_optim::ScaleChoice::Pow2;
    }
    Ok(())
}

/// A checkpoint written before the training rows could be shuffled read them in file order:
/// its run resumes in file order (`data.shuffle = false`, said in the log and in the run's
/// config.toml), as it ran.
fn adopt_unrecorded_data_order(cfg: &mut RunConfig, dir: &std::path::Path) -> Result<()> {
    if cfg.data.shuffle && !records_data_order(dir)? {
        tracing::info!(
            "{}: written before the training rows could be shuffled, its run read them in file order: resuming with \
             data.shuffle = false",
            dir.join("state.json").display()
        );
        cfg.data.shuffle = false;
    }
    Ok(())
}

/// The scale kind a checkpoint records for a state: its name for fp8/fp4 states, empty for
/// formats without one.
fn scale_name(format: lowbit_optim::StateFormat, kind: lowbit_optim::ScaleKind) -> String {
    if format.minifloat().is_some() {
        kind.as_str().into()
    } else {
        String::new()
    }
}

/// Whether `flag` is true on any rank of `comm` (every rank must call it).
fn any_rank(comm: &dyn Collective, flag: bool) -> Result<bool> {
    let mut n = [u64::from(flag)];
    comm.sum_u64(&mut n)?;
    Ok(n[0] > 0)
}

/// Every rank must run rank 0's resolved config (a multi-node launch could give a node
/// another file): rank 0 broadcasts its `config.toml`, the others compare, and every rank
/// learns each one's first difference, so that all of them (rank 0 too, which the user reads
/// first) fail with the same message naming the ranks and the lines.
fn same_config_as_rank0(comm: &dyn Collective, config_toml: &str) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    if world == 1 {
        return Ok(());
    }
    let mut theirs = config_toml.as_bytes().to_vec();
    comm.broadcast(&mut theirs)?;
    let diff = match theirs == config_toml.as_bytes() {
        true => String::new(),
        false => {
            let theirs = String::from_utf8_lossy(&theirs);
            let first = config_toml.lines().zip(theirs.lines()).find(|(a, b)| a != b);
            let (mine, zero) = first.unwrap_or(("(length)", "(length)"));
            format!("rank {rank} has {mine:?} where rank 0 has {zero:?}")
        }
    };
    let mut lens = vec![0u64; world];
    lens[rank] = diff.len() as u64;
    comm.sum_u64(&mut lens)?;
    if lens.iter().all(|&n| n == 0) {
        return Ok(());
    }
    let counts: Vec<usize> = lens.iter().map(|&n| n as usize).collect();
    let all = comm.all_gather(diff.as_bytes(), &counts)?;
    let mut diffs = Vec::new();
    let mut at = 0;
    for n in counts {
        if n > 0 {
            diffs.push(String::from_utf8_lossy(&all[at..at + n]).into_owned());
        }
        at += n;
    }
    anyhow::bail!("the ranks resolved different configs (every rank needs the same --config and --set): {}", diffs.join("; "))
}

/// Model parameters in the optimizer's order (sorted by name; the index is the tensor id of
/// the RNG streams).
pub struct ParamSet {
    pub names: Vec<String>,
    pub vars: Vec<Var>,
}

impl ParamSet {
    /// All variables of a VarMap, sorted by name.
    pub fn from_varmap(vm: &candle_nn::VarMap) -> Self {
        let data = vm.data().lock().unwrap();
        let mut pairs: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let (names, vars) = pairs.into_iter().unzip();
        ParamSet { names, vars }
    }

    /// Total number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.vars.iter().map(|v| v.elem_count()).sum()
    }
}

/// Model parameters' optimizer metadata, sorted by name: the stall-report group of each
/// tensor (from its HF LLaMA name) and whether it takes weight decay (matrices do, vectors
/// (the norms' gains) do not, as nanoGPT's and torchtitan's AdamW groups).
///
/// # Errors
/// A tensor name outside the LLaMA layout (no group to report its stalls under).
pub fn param_infos(params: &ParamSet) -> Result<Vec<ParamInfo>> {
    params
        .names
        .iter()
        .zip(&params.vars)
        .map(|(n, v)| {
            let group =
                try_param_group(n).with_context(|| format!("parameter {n}: not a LLaMA tensor name (embed, attn, mlp, norm or head)"))?;
            Ok(ParamInfo { name: n.clone(), group: group.as_str().to_string(), len: v.elem_count(), weight_decay: v.rank() >= 2 })
        })
        .collect()
}

/// The banner's weight-decay line: which tensors take it.
fn weight_decay_line(infos: &[ParamInfo], weight_decay: f64) -> String {
    let (decayed, kept): (Vec<&ParamInfo>, Vec<&ParamInfo>) = infos.iter().partition(|i| i.weight_decay);
    let count = |v: &[&ParamInfo]| v.iter().map(|i| i.len).sum::<usize>();
    format!(
        "weight decay {weight_decay} on {} matrices ({} parameters), none on {} vectors ({} parameters: norm gains)",
        decayed.len(),
        count(&decayed),
        kept.len(),
        count(&kept)
    )
}

/// The model on `dev` with the configured kernels and FP32 matmul precision.
pub fn build_model(cfg: &RunConfig, mcfg: &LlamaConfig, varmap: &candle_nn::VarMap, dtype: DType, dev: &Device) -> Result<Llama> {
    let model = Llama::new(mcfg, candle_nn::VarBuilder::from_varmap(varmap, dtype, dev))?;
    let kernels = match cfg.model.kernels {
        KernelChoice::Auto => {
            let k = Kernels::for_model(mcfg, dev);
            if let (true, Err(why)) = (k != Kernels::for_device(dev), Kernels::fits(mcfg)) {
                tracing::warn!("model.kernels = \"auto\": composed ops ({why})");
            }
            k
        }
        KernelChoice::Fused => {
            if !(cfg!(feature = "cuda") && dev.is_cuda()) {
                bail!(
                    "model.kernels = \"fused\": the fused kernels run on CUDA in the CUDA build (train.device = \
                     \"cuda\"); on the CPU use \"auto\" or \"composed\""
                );
            }
            Kernels::fits(mcfg).map_err(|e| anyhow::anyhow!("model.kernels = \"fused\": {e}"))?;
            Kernels::Fused
        }
        KernelChoice::Composed => Kernels::Composed,
    };
    let tf32 = cfg.model.matmul_precision == MatmulPrecision::Tf32;
    #[cfg(feature = "cuda")]
    candle_core::cuda::set_gemm_reduced_precision_f32(tf32);
    #[cfg(not(feature = "cuda"))]
    let _ = tf32; // CPU matrix products are FP32
    model.with_kernels(kernels).context("model.kernels")
}

/// A data error as one line (its message already includes its source, so `{:#}` must not
/// append the source a second time), with how to get the data when it is a corpus the README
/// fetches.
fn data_err(e: lowbit_data::DataError) -> anyhow::Error {
    use lowbit_data::DataError::{MissingFile, NoMatch};
    let hint = match &e {
        MissingFile { pattern, .. } | NoMatch { pattern, .. } if pattern.contains("data/local/c4") => {
            "; get C4 with `train data fetch c4 --config <this config>` (as many shards as the config's tokens need; \
             docs/data.md), or point data.train / data.validation at your shards"
        }
        MissingFile { pattern, .. } | NoMatch { pattern, .. } if pattern.contains("data/local/corpus") => {
            "; link the shared corpus with `scripts/link_shared_corpus.sh` (docs/data.md)"
        }
        _ => "",
    };
    anyhow::anyhow!("{e}{hint}")
}

fn check_compatible(dir: &Path, saved: &TrainState, now: &TrainState) -> Result<()> {
    if saved.rng != now.rng {
        tracing::warn!(
            "{}: written with random-bit scheme {:?}, this build uses {:?}: the run continues, but its \
             stochastic-rounding draws differ from an uninterrupted run of the older build",
            dir.join("state.json").display(),
            saved.rng,
            now.rng
        );
    }
    if saved.params != now.params {
        let first = saved.params.iter().zip(&now.params).find(|(a, b)| a != b);
        let what = match first {
            _ if saved.params.len() != now.params.len() => {
                format!("the checkpoint has {} parameter tensors, the config {} (model.num_layers?)", saved.params.len(), now.params.len())
            }
            Some(((sn, sl), (nn, nl))) if sn == nn => {
                format!("{sn} has {sl} elements in the checkpoint, {nl} in the config")
            }
            Some(((sn, _), (nn, _))) => format!("the checkpoint has {sn} where the config has {nn}"),
            None => "parameter lists differ".into(),
        };
        bail!(
            "{}: checkpoint of another model: {what} (resume with the [model] settings it was trained with)",
            dir.join("state.json").display()
        );
    }
    // (v_zero: a checkpoint without the field was written as "keep"; scale kinds: as pow2)
    let saved_v_zero = if saved.v_zero.is_empty() { "keep" } else { saved.v_zero.as_str() };
    for (key, format, saved_kind, kind) in
        [("m", &saved.m_format, &saved.m_scale, &now.m_scale), ("v", &saved.v_format, &saved.v_scale, &now.v_scale)]
    {
        let saved_kind = if saved_kind.is_empty() && !kind.is_empty() { "pow2" } else { saved_kind.as_str() };
        if saved_kind != kind.as_str() && format == if key == "m" { &now.m_format } else { &now.v_format } {
            bail!(
                "{}: checkpoint {key} states ({format}) have {saved_kind} scales, the config asks for {kind} \
                 (resume with --set optim.states.scale=\"{saved_kind}\")",
                dir.join("state.json").display()
            );
        }
    }
    if saved.reset_rule() != now.reset_rule() {
        bail!(
            "{}: the checkpoint's states reset by the {} rule, the config asks for the {} one (optim.states.reset \
             must match to resume: the bias correction counts from the last reset)",
            dir.join("state.json").display(),
            saved.reset_rule(),
            now.reset_rule()
        );
    }
    if saved.tensor_states != now.tensor_states {
        let names: std::collections::BTreeSet<&String> = saved.tensor_states.keys().chain(now.tensor_states.keys()).collect();
        let first = names.into_iter().find(|n| saved.tensor_states.get(*n) != now.tensor_states.get(*n)).expect("the maps differ");
        let says = |m: &std::collections::BTreeMap<String, String>| m.get(first).cloned().unwrap_or_else(|| "[optim.states]'s".into());
        bail!(
            "{}: {first} has states {} in the checkpoint, the config gives it {} (optim.states.groups.* and \
             optim.states.min_quantized_numel must match to resume)",
            dir.join("state.json").display(),
            says(&saved.tensor_states),
            says(&now.tensor_states)
        );
    }
    if (saved.m_format.as_str(), saved.v_format.as_str(), saved.block_size, saved_v_zero)
        != (now.m_format.as_str(), now.v_format.as_str(), now.block_size, now.v_zero.as_str())
    {
        bail!(
            "{}: checkpoint states are m={} v={} block {} v_zero {}, the config asks for m={} v={} block {} \
             v_zero {} (optim.states.m_format / v_format / block_size / v_zero must match to resume)",
            dir.join("state.json").display(),
            saved.m_format,
            saved.v_format,
            saved.block_size,
            saved_v_zero,
            now.m_format,
            now.v_format,
            now.block_size,
            now.v_zero
        );
    }
    Ok(())
}
