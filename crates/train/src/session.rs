//! A run between its steps: [`Session::open`] builds its parts as torchtitan's trainer does,
//! one builder each in the module that owns the part (device, model, optimizer, resume, data,
//! logs and run folder); then [`Session::validate`] and [`Session::checkpoint`] are, with the
//! step ([`crate::step`]), the units that [`crate::run::train`]'s loop calls.

use crate::banner::banner;
use crate::checkpoint::{self, Saves};
use crate::components::ModelWeights;
use crate::config::RunConfig;
use crate::distributed;
use crate::distributed::agreement::{any_rank, same_config_as_rank0};
use crate::distributed::collective::{Collective, Solo};
use crate::eval::{evaluate_until, export_check, EXPORT_CHECK};
use crate::logs::metrics::MetricsRow;
use crate::logs::stall_writer::StallWriter;
use crate::logs::stalls::Theory;
use crate::logs::RunLogs;
use crate::memory::MemoryFloor;
use crate::model::TrainModel;
use crate::optimizer::RunSizes;
use crate::resume_compat::Resume;
use crate::run_folder::{self, FolderUse, RunLock};
use crate::train_state::TrainState;
use crate::{data, optimizer, setting_warnings};
use anyhow::{Context, Result};
use candle_core::{DType, Device};
use lowbit_data::{Batch, TrainStream};
use lowbit_model::Llama;
use lowbit_optim::{Optimizer, StatesPlan};
use std::path::PathBuf;
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
    /// The model, its weights and what a checkpoint exports of it.
    pub(crate) model: TrainModel,
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
    /// The update before which this process last saw the adaptive rule reset (for the log's
    /// cycle lengths; not checkpointed).
    pub(crate) last_adaptive_reset: Option<u64>,
    /// Parameters and optimizer state bytes, for the summary.
    pub sizes: RunSizes,
    /// CUDA pool high-water mark, bytes.
    pub device_peak: Option<u64>,
    /// Seconds this rank's step would take at the card's dense peak ([`crate::flops`]: every
    /// position of its rows, padding included); a step's MFU is this over its seconds.
    /// `None` on the CPU or a card without a known peak.
    pub peak_step_seconds: Option<f64>,
    pub last_checkpoint: Option<PathBuf>,
    /// Held until the run ends (rank 0): no second run writes into this folder meanwhile.
    _lock: Option<RunLock>,
}

impl Session {
    /// Sets up a run (or resumes one): device, tokenizer, model, optimizer states, the
    /// checkpoint's state, validation batches and training stream, then the run folder and
    /// its writers, which are touched (and the model banner is printed) only after all of
    /// these succeeded ([`run_folder::claim`]).
    pub fn open(launch: &Launch) -> Result<Session> {
        let mut cfg = launch.config.clone();
        let resume = launch.resume_from.as_deref().map(Resume::read).transpose()?;
        if let Some(r) = &resume {
            r.adopt_unrecorded(&mut cfg)?;
        }
        let config_toml = cfg.to_toml();
        // the config check first: a rank with another device setting must not reach NCCL's set-up
        same_config_as_rank0(launch.comm.as_ref(), &config_toml)?;
        let dev = crate::device::open(&cfg.train.device, launch.local_rank)?;
        let comm = distributed::for_device(launch.comm.clone(), &dev)?;
        let (leader, world) = (comm.rank() == 0, comm.world_size());
        let accum_per_rank = cfg.train.accum_per_rank(world)?;
        let plan = StatesPlan::resolve(&cfg.optim.states, cfg.optim.beta2).map_err(anyhow::Error::msg)?;
        let tok = data::tokenizer(&cfg)?;
        let mcfg = cfg.model_config(tok.vocab_size()).with_context(|| format!("model config with tokenizer {}", tok.source.display()))?;
        // before anything of the model's size is allocated (on the CPU an allocation that
        // fails aborts the process) or the run folder is claimed
        let mut floor = MemoryFloor::of(&cfg, &mcfg, &plan, world);
        if lowbit_data::reads_through_shuffle_buffer(&cfg.data_config()).map_err(data::data_err)? {
            floor = floor.with_shuffle_buffer(&cfg);
        }
        if !matches!(dev, Device::Cpu) {
            // the shuffle buffer is in host memory, the rest on the device
            let host = crate::memory::host_available().map(|b| (b, "this host's available memory"));
            floor.host_part().check_every_rank(host, launch.comm.as_ref())?;
            floor = floor.device_part();
        }
        floor.check_every_rank(crate::device::available_memory(&dev), launch.comm.as_ref())?;
        let model = TrainModel::build(&cfg, &mcfg, &tok, &dev)?;
        let mut host = optimizer::states(&cfg, plan.clone(), &model.params)?;
        let mut state = TrainState::at_start(host.states(), world, cfg.train.micro_batch.saturating_mul(cfg.train.grad_accum));
        if let Some(r) = resume {
            state = r.restore(state, &cfg, &model.varmap, &mut host, leader)?;
        }
        let (val, stream) = data::open(&cfg, &tok, &state.data)?;
        let theory = Theory::for_spec(&host.moments().spec, cfg.optim.beta2);
        let banner = banner(&cfg, &mcfg, &model, &host, &stream, &theory, world);
        let warnings = if leader {
            let run = setting_warnings::for_run(&cfg, &plan, host.moments(), stream.pass_size());
            run.into_iter().chain(setting_warnings::shuffle_buffer_warning(&cfg, stream.order())).collect()
        } else {
            Vec::new()
        };
        let stall_log = StallWriter::new(host.moments(), theory, cfg.run.stall_detail_every);
        let (opt, sizes) = optimizer::for_run(host, model.params.num_params(), &cfg, &comm, &dev)?;
        let peak_step_seconds = crate::flops::peak_step_seconds(&cfg, &mcfg, sizes.n_params, model.compute_dtype, accum_per_rank, &dev);
        // Only now, with everything validated and a resume's checkpoint accepted, touch the run
        // folder (rank 0 alone writes it): a start that fails leaves the folder as it was.
        let resumed_at = launch.resume_from.is_some().then_some(state.step);
        let writer = leader.then(|| run_folder::start(&cfg.run_dir(), launch.folder, &config_toml, resumed_at, cfg.run.tensorboard));
        let (_lock, logs) = writer.transpose()?.flatten().unzip();
        warnings.iter().for_each(|w| tracing::warn!("{w}"));
        Ok(Session {
            banner,
            run_dir: cfg.run_dir(),
            cfg,
            config_toml,
            dev,
            model,
            opt,
            state,
            val,
            stream,
            comm,
            accum_per_rank,
            logs,
            stall_log,
            last_adaptive_reset: None,
            sizes,
            device_peak: None,
            peak_step_seconds,
            last_checkpoint: None,
            _lock,
        })
    }

    /// Validation loss of the model now, written to `metrics.jsonl` as step `step`;
    /// `batch_done(done, total)` after each validation batch.
    pub fn validate(&mut self, step: u64, batch_done: &mut dyn FnMut(usize, usize)) -> Result<f64> {
        Ok(self.validate_until(step, &AtomicBool::new(false), batch_done)?.expect("never stopped"))
    }

    /// [`Session::validate`] that gives up (`None`, nothing written) once `stop` is set.
    pub fn validate_until(&mut self, step: u64, stop: &AtomicBool, batch_done: &mut dyn FnMut(usize, usize)) -> Result<Option<f64>> {
        let Some(vl) = evaluate_until(&self.model.llama, &self.val, &self.dev, stop, batch_done)? else { return Ok(None) };
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
        let check = export_check(&self.model.llama, &self.val, &self.dev, self.model.dtype)?;
        // the stream's whole position: in streaming mode with the shuffle buffer's rows
        self.state.data = self.stream.position();
        let state = &self.state;
        let mut files = vec![
            ("config.json", serde_json::to_vec_pretty(&self.model.hf_config)?),
            ("state.json", state.to_json()?),
            ("config.toml", self.config_toml.clone().into_bytes()),
            (EXPORT_CHECK, serde_json::to_vec(&check)?),
        ];
        files.extend(self.model.hf_tokenizer.iter().cloned());
        let components: [&dyn Saves; 3] = [&ModelWeights(&self.model.varmap), &states, &state.data];
        let dir = checkpoint::save(&self.run_dir, state.step, self.cfg.train.keep_checkpoints, &components, &files)?;
        tracing::info!("checkpoint {}", dir.display());
        self.last_checkpoint = Some(dir.clone());
        Ok(Some(dir))
    }

    /// What runs: the model, the states, the theory (a few lines).
    pub fn banner(&self) -> &str {
        &self.banner
    }

    /// The model being trained.
    pub fn model(&self) -> &Llama {
        &self.model.llama
    }

    /// The model's weights' dtype (F32 for `model.dtype = "bf16-mixed"`).
    pub fn dtype(&self) -> DType {
        self.model.dtype
    }

    /// The dtype the model computes in (BF16 for `model.dtype = "bf16-mixed"`; the peak of
    /// its MFU).
    pub fn compute_dtype(&self) -> DType {
        self.model.compute_dtype
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
