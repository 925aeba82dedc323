//! Settings that run, but not as a user may expect: each is said once at start, naming the key
//! and why. The rule: a setting that cannot affect the run is refused (where the
//! config check can tell: `lowbit_optim::StatesConfig::resolve`) or warned about here.

use crate::config::{RunConfig, WeightDtype};
use candle_core::DType;
use lowbit_data::{PassSize, RowOrder};
use lowbit_optim::{
    BiasCorrection, GroupStates, Moments, ResetRule, Rounding, ScaleChoice, StateFormat, StatesPlan, StatesSpec, VResetIdle,
};
use std::collections::BTreeMap;

/// Every [`setting_warnings`] and the [`passes_warning`] of a run of `cfg` with the optimizer
/// states `states` (of the settings `plan`) over a training text of `pass`.
pub fn for_run(cfg: &RunConfig, plan: &StatesPlan, states: &Moments, pass: PassSize) -> Vec<String> {
    let mut largest = BTreeMap::new();
    for t in &states.tensors {
        let n = largest.entry(t.info.group.as_str()).or_insert(0);
        *n = t.info.len.max(*n);
    }
    let passes = passes_planned(cfg, pass);
    // (the bias-correction warnings are about m and v together: not Muon's matrices, which
    // keep m alone, without bias correction)
    let per_group: Vec<_> = states.tensors.iter().filter(|t| t.momentum.is_none()).map(|t| (t.info.group.as_str(), &t.spec)).collect();
    setting_warnings(cfg, plan, &largest)
        .into_iter()
        .chain(data_warnings(cfg, pass))
        .chain(soap_warnings(cfg))
        .chain(muon_warnings(cfg, states))
        .chain(continued_bias_correction(cfg, states.spec.reset, per_group.iter().copied()))
        .chain(restarted_m_without_v(cfg, per_group.iter().copied()))
        .chain(passes_warning(cfg, pass, passes))
        .collect()
}

/// The tensor groups of `per_group` whose states `pick` selects, each named once, sorted by
/// name; `None` when none is.
fn groups_where<'a>(per_group: impl IntoIterator<Item = (&'a str, &'a StatesSpec)>, pick: impl Fn(&StatesSpec) -> bool) -> Option<String> {
    let groups: std::collections::BTreeSet<&str> = per_group.into_iter().filter(|(_, s)| pick(s)).map(|(g, _)| g).collect();
    (!groups.is_empty()).then(|| groups.into_iter().collect::<Vec<_>>().join(", "))
}

/// The warning for `bias_correction = "continue"` where v is reset (periodically within the
/// run, or by the adaptive rule `reset`), over the tensor groups' states `per_group` (`[optim.
/// states]` merged with `[optim.states.groups.<group>]`): after a reset v holds one step's
/// (1 − β2)·g² while its correction stays near 1, so the k-th update after it is (1 − β1^k) /
/// sqrt(1 − β2^k) times the restarted one where m resets with v, 1 / sqrt(1 − β2^k) where v
/// resets alone. `None` when no group combines the two.
pub fn continued_bias_correction<'a>(
    cfg: &RunConfig,
    reset: ResetRule,
    per_group: impl IntoIterator<Item = (&'a str, &'a StatesSpec)>,
) -> Option<String> {
    let max_steps = cfg.train.max_steps;
    let resets_v = |s: &StatesSpec| reset == ResetRule::Adaptive || (s.v_reset_every > 0 && s.v_reset_every < max_steps);
    let groups = groups_where(per_group, |s| s.bias_correction == BiasCorrection::Continue && resets_v(s))?;
    let (b1, b2) = (cfg.optim.beta1, cfg.optim.beta2);
    let joint = (1..=100_000).map(|k| (1.0 - b1.powi(k)) / (1.0 - b2.powi(k)).sqrt()).fold(0.0, f64::max);
    Some(format!(
        "optim.states: bias_correction = \"continue\" with resets of v (tensor groups {}): after a reset v holds one \
         step's (1 - beta2) g^2 while its correction stays near 1, so the updates are too large: up to {joint:.1}x where m \
         resets with v, {:.0}x right after a reset of v alone (v-only resets with it cost 1.5-2.7 nats at LLaMA-20M, \
         reproduce/departures.md section 3). \"restart\" (the default) is the paper's",
        groups,
        1.0 / (1.0 - b2).sqrt()
    ))
}

/// The warning for periodic resets of m at updates where v does not reset, with the
/// bias-correction counter restarted (the default), over the tensor groups' states
/// `per_group`: m's counter restarts and v's counts on, so the first update after such a reset
/// divides one gradient, m_hat = g, by v's long average, v_hat >= (1 − β2)·g² / (1 − β2^t), and
/// an element's step can reach lr·sqrt(1 − β2^t) / sqrt(1 − β2) (up to 1 / sqrt(1 − β2)), ten
/// times Adam's at the same t; in Kingma & Ba's single-spike case (2015, 2.1) Adam's is
/// lr (1 − β1) / sqrt(1 − β2). `None` when no group has such resets within the run (the
/// adaptive rule resets m and v together, with periods of 0).
pub fn restarted_m_without_v<'a>(cfg: &RunConfig, per_group: impl IntoIterator<Item = (&'a str, &'a StatesSpec)>) -> Option<String> {
    let max_steps = cfg.train.max_steps;
    let m_alone = |s: &StatesSpec| s.bias_correction == BiasCorrection::Restart && s.resets_m_without_v() && s.m_reset_every < max_steps;
    let groups = groups_where(per_group, m_alone)?;
    let (b1, b2) = (cfg.optim.beta1, cfg.optim.beta2);
    Some(format!(
        "optim.states: m resets without v (tensor groups {groups}): m's bias correction restarts while v keeps its long \
         average, so right after each such reset an element's step can reach up to {:.0}x lr, where Adam's single-spike \
         step is {:.1}x (m-only resets cost 0.64-0.67 nats at LLaMA-20M with FP4 states, reproduce/departures.md section \
         2). Reset v whenever m resets (v_reset_every dividing m_reset_every, the paper's Alg. 1 when equal), or, with \
         m-only resets, set bias_correction = \"continue\"",
        1.0 / (1.0 - b2).sqrt(),
        (1.0 - b1) / (1.0 - b2).sqrt()
    ))
}

/// The warnings for `cfg` with the states `plan`, on a model whose tensor groups' largest
/// tensors have the elements `largest` (by group name); empty when every setting does what it
/// says.
pub fn setting_warnings(cfg: &RunConfig, plan: &StatesPlan, largest: &BTreeMap<&str, usize>) -> Vec<String> {
    let mut w = Vec::new();
    let max_steps = cfg.train.max_steps;
    let spec = &plan.base;
    if cfg.optim.warmup_steps >= max_steps {
        w.push(format!(
            "optim.warmup_steps = {} is not shorter than train.max_steps = {max_steps}: the warmup is cut to {} steps so \
             that the learning rate still decays",
            cfg.optim.warmup_steps,
            max_steps.saturating_sub(1)
        ));
    }
    if spec.weight_rounding == Rounding::Stochastic && cfg.model.dtype.weights() == DType::F32 {
        let master = if cfg.model.dtype == WeightDtype::Bf16Mixed { " (the master copy; each pass's BF16 copy is made anew)" } else { "" };
        w.push(format!(
            "optim.states.weight_rounding = \"stochastic\" does nothing with model.dtype = \"{}\": FP32 weights{master} \
             are updated exactly, nothing is rounded (it applies to BF16 weights, model.dtype = \"bf16\")",
            cfg.model.dtype
        ));
    }
    let groups =
        cfg.optim.states.groups.iter().filter_map(|(name, g)| Some(Section { group: Some((name, g)), spec: plan.groups.get(name)? }));
    for section in std::iter::once(Section { group: None, spec }).chain(groups) {
        section_warnings(cfg, plan, &section, largest, &mut w);
    }
    min_numel_warnings(cfg, spec, largest.values().copied().max().unwrap_or(0), &mut w);
    if spec.reset == ResetRule::Adaptive && spec.v_format == StateFormat::Fp32 {
        w.push(format!(
            "optim.states.reset = \"adaptive\" with v_format = \"fp32\": the rule resets when v's measured stalled \
             fraction says so, and FP32 v hardly ever stalls (theory {:.1e}): expect no reset",
            lowbit_optim::states::theory::p_stall(23, cfg.optim.beta2, spec.v_rounding)
        ));
    }
    if spec.resets_v_without_m() && spec.v_reset_every < max_steps {
        w.push(format!(
            "optim.states: v resets every {} updates without an m reset: at each, every element whose gradient is 0 moves \
             by lr * m / eps (eps = {}); their count is logged at each such reset and in stalls.jsonl (zero_grad)",
            spec.v_reset_every, cfg.optim.eps
        ));
    }
    w
}

/// One section of state settings: `[optim.states]` (`group` `None`) or a tensor group's
/// `[optim.states.groups.<group>]`, with its settings resolved (`spec`: the group's merged
/// over `[optim.states]`).
struct Section<'a> {
    group: Option<(&'a str, &'a GroupStates)>,
    spec: &'a StatesSpec,
}

impl Section<'_> {
    /// The config key `key` of this section, as the warnings name it.
    fn key(&self, key: &str) -> String {
        match self.group {
            None => format!("optim.states.{key}"),
            Some((name, _)) => format!("optim.states.groups.{name}.{key}"),
        }
    }

    /// Whether this section sets `key`: a group's when it writes it, `[optim.states]` always
    /// (it holds every value a group does not set).
    fn sets(&self, key: &str) -> bool {
        self.group.is_none_or(|(_, g)| g.sets(key))
    }

    /// The states this section's `key` reaches, each with its tensor group's largest tensor
    /// (`largest`): the group's own, or for `[optim.states]` every tensor group of the model
    /// whose section does not set `key` itself (`plan` has each group's states).
    fn reach<'p>(&self, key: &str, cfg: &RunConfig, plan: &'p StatesPlan, largest: &BTreeMap<&str, usize>) -> Vec<(&'p StatesSpec, usize)> {
        let own = |g: &str| cfg.optim.states.groups.get(g).is_some_and(|s| s.sets(key));
        largest
            .iter()
            .filter(|(g, _)| match self.group {
                Some((name, _)) => **g == name,
                None => !own(g),
            })
            .map(|(g, &n)| (plan.groups.get(*g).unwrap_or(&plan.base), n))
            .collect()
    }
}

/// The warnings about the keys of one state section that cannot act on the states they reach
/// ([`Section::reach`]): a signed v format, a scale kind without fp8 or fp4 states, a block size
/// without block-scaled states or as large as every tensor, a reset period not shorter than the
/// run, `v_reset_idle = "keep"` without resets of v alone; appended to `w`. A group's section is
/// warned about for the keys it sets.
fn section_warnings(cfg: &RunConfig, plan: &StatesPlan, s: &Section, largest: &BTreeMap<&str, usize>, w: &mut Vec<String>) {
    let (spec, max_steps) = (s.spec, cfg.train.max_steps);
    let reach = |key: &str| s.reach(key, cfg, plan, largest);
    let acts = |key: &str| s.sets(key) && !reach(key).is_empty();
    let names = format!("m ({}) and v ({})", spec.m_format.name(), spec.v_format.name());
    if acts("v_format") && spec.v_format == StateFormat::Fp4E2M1 {
        w.push(format!(
            "{} = \"fp4e2m1\" is signed: v is never negative, so its sign bit is wasted; `fp4` for v (= fp4ue2m2, \
             unsigned) spends it on one more mantissa bit",
            s.key("v_format")
        ));
    }
    let scale = s.group.map_or(cfg.optim.states.scale, |(_, g)| g.scale.unwrap_or_default());
    let has_scale_kind = |t: &StatesSpec| t.m_format.minifloat().is_some() || t.v_format.minifloat().is_some();
    if acts("scale") && scale != ScaleChoice::Default && !reach("scale").iter().any(|(t, _)| has_scale_kind(t)) {
        w.push(format!(
            "{} = \"{}\" does nothing: {names} have no scale kind to choose (it sets the scale of fp8 and fp4 states; int8 \
             keeps its absmax scale)",
            s.key("scale"),
            spec.m_scale.as_str()
        ));
    }
    if acts("block_size") {
        // `[optim.states]`' block size counts as set when it is not the default
        let set = s.group.is_some() || spec.block_size != lowbit_optim::StatesConfig::default().block_size;
        let scaled = |t: &StatesSpec| t.m_format.is_scaled() || t.v_format.is_scaled();
        let blocked = reach("block_size").into_iter().filter(|(t, _)| scaled(t)).map(|(_, n)| n).max();
        match blocked {
            None if set => w.push(format!(
                "{} = {} does nothing: {names} have no scale blocks (they apply to fp8, fp4 and int8 states)",
                s.key("block_size"),
                spec.block_size
            )),
            Some(n) if spec.block_size != 0 && spec.block_size >= n => w.push(format!(
                "{} = {} is not smaller than the largest tensor ({n} elements): every tensor has one scale, as with \
                 block_size = 0, which says so",
                s.key("block_size"),
                spec.block_size
            )),
            _ => {}
        }
    }
    for (key, every) in [("m_reset_every", spec.m_reset_every), ("v_reset_every", spec.v_reset_every)] {
        if acts(key) && every > 0 && every >= max_steps {
            w.push(format!(
                "{} = {every} is not shorter than train.max_steps = {max_steps}: the first reset would come after the \
                 run's last update, so {} never resets in this run",
                s.key(key),
                &key[..1]
            ));
        }
    }
    if acts("v_reset_idle") && spec.v_reset_idle == VResetIdle::Keep && !reach("v_reset_idle").iter().any(|(t, _)| t.resets_v_without_m()) {
        w.push(format!(
            "{} = \"keep\" does nothing: it applies at resets of v without m, and this run has none (v_reset_every is \
             0, a multiple of m_reset_every, or the adaptive rule resets both)",
            s.key("v_reset_idle")
        ));
    }
}

/// `optim.states.min_quantized_numel` where it cannot act: m and v in formats that are not
/// quantized (every tensor keeps its format anyway), or above the largest tensor (`largest`
/// elements: every state is FP32, whatever the formats and the start banner's theory say).
fn min_numel_warnings(cfg: &RunConfig, spec: &StatesSpec, largest: usize, w: &mut Vec<String>) {
    let min = cfg.optim.states.min_quantized_numel;
    if min == 0 {
        return;
    }
    let low = |f: StateFormat| f != StateFormat::Fp32;
    if !low(spec.m_format) && !low(spec.v_format) {
        w.push(format!(
            "optim.states.min_quantized_numel = {min} does nothing: m and v are FP32 already (it keeps small tensors' \
             states in FP32 when m or v is in a lower precision)"
        ));
    } else if min > largest {
        w.push(format!(
            "optim.states.min_quantized_numel = {min} is above the largest tensor ({largest} elements): every tensor keeps \
             FP32 m and v, so the {} / {} formats (and their stall theory) apply to none",
            spec.m_format.name(),
            spec.v_format.name()
        ));
    }
}

/// The `[data]` order settings that cannot act: a seed or a shuffle buffer with `data.shuffle =
/// false` (rows in file order), and a shuffle buffer in memory mode (`pass` knows the rows of a
/// pass: every pass is permuted whole; the buffer is streaming mode's).
pub fn data_warnings(cfg: &RunConfig, pass: PassSize) -> Vec<String> {
    let d = &cfg.data;
    let buffer_set = d.shuffle_buffer != lowbit_data::DataConfig::default().shuffle_buffer;
    let mut w = Vec::new();
    if !d.shuffle {
        if let Some(seed) = d.seed {
            w.push(format!("data.seed = {seed} does nothing with data.shuffle = false: the rows are read in file order"));
        }
        if buffer_set {
            w.push(format!(
                "data.shuffle_buffer = {} does nothing with data.shuffle = false: the rows are read in file order",
                d.shuffle_buffer
            ));
        }
    } else if buffer_set && pass.rows.is_some() {
        w.push(format!(
            "data.shuffle_buffer = {} does nothing: the training text ({} tokens) fits data.in_memory_max_tokens = {}, so \
             each pass's rows are permuted in memory (the buffer is streaming mode's)",
            d.shuffle_buffer, pass.tokens, d.in_memory_max_tokens
        ));
    }
    w
}

/// `[optim.soap]` settings that leave SOAP something else: no side rotated (it is Adam), or no
/// refresh of the eigenbases after the first update's within `train.max_steps`.
pub fn soap_warnings(cfg: &RunConfig) -> Vec<String> {
    if cfg.optim.kind != lowbit_optim::OptimizerKind::Soap {
        return vec![];
    }
    let (soap, steps) = (&cfg.optim.soap, cfg.train.max_steps);
    let mut w = Vec::new();
    if soap.max_precond_dim <= 1 {
        w.push(format!(
            "optim.soap.max_precond_dim = {} leaves every matrix side unrotated: SOAP is Adam here (with its preconditioner \
             state's memory)",
            soap.max_precond_dim
        ));
    }
    if soap.precondition_frequency >= steps {
        w.push(format!(
            "optim.soap.precondition_frequency = {} is not shorter than train.max_steps = {steps}: the eigenbases are \
             computed at each matrix's first update and never refreshed",
            soap.precondition_frequency
        ));
    }
    w
}

/// The v settings of a tensor group whose tensors are all Muon's matrices
/// (`optim.kind = "muon"`): they keep no v, so `[optim.states.groups.<group>]`'s v keys and
/// `bias_correction` cannot act there.
pub fn muon_warnings(cfg: &RunConfig, states: &Moments) -> Vec<String> {
    const V_KEYS: [&str; 6] = ["v_format", "v_zero", "v_rounding", "v_reset_every", "v_reset_idle", "bias_correction"];
    let muon_only = |group: &str| {
        let mut tensors = states.tensors.iter().filter(|t| t.info.group == group).peekable();
        tensors.peek().is_some() && tensors.all(|t| t.momentum.is_some())
    };
    let mut w = Vec::new();
    for (group, g) in &cfg.optim.states.groups {
        if !muon_only(group) {
            continue;
        }
        for key in V_KEYS.into_iter().filter(|k| g.sets(k)) {
            w.push(format!(
                "optim.states.groups.{group}.{key} does nothing: with optim.kind = \"muon\" the {group} matrices keep their \
                 momentum alone (m, without v or bias correction)"
            ));
        }
    }
    w
}

/// Passes over the training text that `train.max_steps` steps of the global batch make: by
/// rows where the rows of a pass are known (in memory), else by target tokens (a step's rows
/// hold at most `seq_len` targets each).
pub fn passes_planned(cfg: &RunConfig, pass: PassSize) -> f64 {
    let rows = cfg.train.max_steps as f64 * (cfg.train.micro_batch * cfg.train.grad_accum) as f64;
    match pass.rows {
        Some(r) => rows / r.max(1) as f64,
        None => rows * cfg.data.seq_len as f64 / pass.tokens.max(1) as f64,
    }
}

/// Passes beyond which repeated text starts to cost: Muennighoff et al., "Scaling
/// Data-Constrained Language Models" (NeurIPS 2023), find up to ~4 epochs about as good as
/// new data, and returns diminishing quickly after.
pub const MAX_GOOD_PASSES: f64 = 4.0;

/// The warning for a run that will read its training text more than [`MAX_GOOD_PASSES`]
/// times (`passes` planned, of `pass`).
pub fn passes_warning(cfg: &RunConfig, pass: PassSize, passes: f64) -> Option<String> {
    (passes > MAX_GOOD_PASSES).then(|| {
        format!(
            "train.max_steps = {} x {} sequences of {} tokens make {passes:.1} passes over the training text ({} target \
             tokens per pass{}): beyond ~{MAX_GOOD_PASSES} passes repeated text is worth less than new text (Muennighoff \
             et al. 2023); add text to data.train or shorten the run",
            cfg.train.max_steps,
            cfg.train.micro_batch * cfg.train.grad_accum,
            cfg.data.seq_len,
            pass.tokens,
            if pass.exact { "" } else { ", estimated from the shards' size" }
        )
    })
}

/// Bytes of a shuffle buffer above which it is said at start (1 GiB): it is held in memory and
/// written into every checkpoint.
pub const LARGE_SHUFFLE_BUFFER: f64 = (1u64 << 30) as f64;

/// The note for a run that streams through a shuffle buffer (`order`) of more than
/// [`LARGE_SHUFFLE_BUFFER`] bytes: its memory and what it adds to each checkpoint.
pub fn shuffle_buffer_warning(cfg: &RunConfig, order: RowOrder) -> Option<String> {
    let RowOrder::Buffered { buffer, .. } = order else { return None };
    let memory = buffer as f64 * lowbit_data::shuffle_buffer_row_bytes(cfg.data.seq_len);
    let gib = |b: f64| b / (1u64 << 30) as f64;
    (memory > LARGE_SHUFFLE_BUFFER).then(|| {
        format!(
            "data.shuffle_buffer = {buffer} rows of data.seq_len + 1 = {} tokens holds {:.1} GiB in memory and adds {:.1} GiB \
             to every checkpoint (train.keep_checkpoints = {} are kept); lower data.shuffle_buffer to shrink both",
            cfg.data.seq_len + 1,
            gib(memory),
            gib(lowbit_data::shuffle_buffer_checkpoint_bytes(buffer, cfg.data.seq_len)),
            cfg.train.keep_checkpoints
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny CPU config (100 steps, warmup 10) with `sets`.
    fn tiny(sets: &[&str]) -> RunConfig {
        let base = "[model]\npreset = \"tiny\"\n[data]\n[optim]\nwarmup_steps = 10\n[train]\nmax_steps = 100\n";
        let mut v: toml::Value = toml::from_str(base).unwrap();
        for s in sets {
            crate::config::apply_override(&mut v, s).unwrap();
        }
        serde::Deserialize::deserialize(v).unwrap()
    }

    /// A shuffle buffer over 1 GiB is said at start with its memory and its size in each
    /// checkpoint (2.5M rows of 257 ids: 2.5 GiB, 2.4 GiB per checkpoint); the default's 10,000
    /// rows and a run held in memory are not.
    #[test]
    fn a_large_shuffle_buffer_is_said_with_its_checkpoint_size() {
        let cfg = tiny(&["data.seq_len=256"]);
        let buffered = |buffer| RowOrder::Buffered { seed: 0, buffer };
        let w = shuffle_buffer_warning(&cfg, buffered(2_500_000)).unwrap();
        assert!(w.starts_with("data.shuffle_buffer = 2500000 rows of data.seq_len + 1 = 257 tokens holds 2.5 GiB in memory"), "{w}");
        assert!(w.contains("adds 2.4 GiB to every checkpoint"), "{w}");
        assert_eq!(shuffle_buffer_warning(&cfg, buffered(10_000)), None);
        assert_eq!(shuffle_buffer_warning(&cfg, RowOrder::Permuted { seed: 0 }), None);
    }

    /// The states of `cfg`.
    fn plan(cfg: &RunConfig) -> StatesPlan {
        StatesPlan::resolve(&cfg.optim.states, cfg.optim.beta2).unwrap()
    }

    /// The warnings of [`tiny`] with `sets`, on a model of tensor groups `attn` and `mlp`
    /// whose largest tensors have 4096 elements.
    fn warnings(sets: &[&str]) -> Vec<String> {
        let cfg = tiny(sets);
        setting_warnings(&cfg, &plan(&cfg), &BTreeMap::from([("attn", 4096), ("mlp", 4096)]))
    }

    /// The one warning `sets` give, which must name `key`.
    fn one(sets: &[&str], key: &str) -> String {
        let w = warnings(sets);
        assert_eq!(w.len(), 1, "{sets:?}: {w:?}");
        assert!(w[0].starts_with(key), "{w:?}");
        w.into_iter().next().unwrap()
    }

    #[test]
    fn a_default_config_gets_no_warning() {
        assert_eq!(warnings(&[]), Vec::<String>::new());
        let paper_fp8 =
            ["optim.states.m_format=\"fp8\"", "optim.states.v_format=\"fp8\"", "optim.states.scale=\"amax\"", "optim.states.block_size=0"];
        assert_eq!(warnings(&paper_fp8), Vec::<String>::new(), "a scale kind and per-tensor scales for fp8 states");
        assert_eq!(warnings(&["optim.states.v_format=\"int8\"", "optim.states.block_size=256"]), Vec::<String>::new());
    }

    /// A pass of `rows` rows known (in memory) or not (streaming), of 1M tokens.
    fn pass(rows: Option<u64>) -> PassSize {
        PassSize { tokens: 1_000_000, exact: true, rows }
    }

    /// Stochastic weight rounding cannot act on FP32 weights: `f32`, and `bf16-mixed`'s master
    /// copy; it acts on `bf16`'s.
    #[test]
    fn weight_rounding_without_bf16_weights() {
        let sr = "optim.states.weight_rounding=\"stochastic\"";
        let w = one(&[sr], "optim.states.weight_rounding");
        assert!(w.contains("does nothing with model.dtype = \"f32\": FP32 weights are updated exactly"), "{w}");
        let w = one(&[sr, "model.dtype=\"bf16-mixed\""], "optim.states.weight_rounding");
        assert!(w.contains("does nothing with model.dtype = \"bf16-mixed\": FP32 weights (the master copy"), "{w}");
        assert_eq!(warnings(&[sr, "model.dtype=\"bf16\""]), Vec::<String>::new());
        assert_eq!(warnings(&["model.dtype=\"bf16-mixed\""]), Vec::<String>::new());
    }

    #[test]
    fn data_order_settings_that_cannot_act() {
        assert_eq!(data_warnings(&tiny(&[]), pass(Some(4000))), Vec::<String>::new());
        let w = data_warnings(&tiny(&["data.shuffle=false", "data.seed=7", "data.shuffle_buffer=50"]), pass(None));
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].starts_with("data.seed = 7 does nothing with data.shuffle = false"), "{w:?}");
        assert!(w[1].starts_with("data.shuffle_buffer = 50 does nothing with data.shuffle = false"), "{w:?}");
        let w = data_warnings(&tiny(&["data.shuffle_buffer=50"]), pass(Some(4000)));
        assert!(w.len() == 1 && w[0].contains("permuted in memory") && w[0].contains("1000000 tokens"), "{w:?}");
        assert_eq!(data_warnings(&tiny(&["data.shuffle_buffer=50"]), pass(None)), Vec::<String>::new(), "streaming uses it");
    }

    #[test]
    fn soap_settings_that_leave_it_adam_or_unrefreshed() {
        assert_eq!(soap_warnings(&tiny(&["optim.kind=\"soap\""])), Vec::<String>::new());
        assert_eq!(soap_warnings(&tiny(&["optim.soap.max_precond_dim=1"])), Vec::<String>::new(), "AdamW ignores [optim.soap]");
        let w = soap_warnings(&tiny(&[
            "optim.kind=\"soap\"",
            "optim.soap.max_precond_dim=1",
            "optim.soap.precondition_frequency=1000000000000",
        ]));
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("SOAP is Adam here") && w[1].contains("never refreshed"), "{w:?}");
    }

    #[test]
    fn min_quantized_numel_that_cannot_act() {
        one(&["optim.states.min_quantized_numel=4096"], "optim.states.min_quantized_numel = 4096 does nothing");
        let w = one(
            &["optim.states.m_format=\"fp8\"", "optim.states.v_format=\"fp8\"", "optim.states.min_quantized_numel=9223372036854775807"],
            "optim.states.min_quantized_numel = 9223372036854775807 is above the largest tensor",
        );
        assert!(w.contains("4096 elements") && w.contains("fp8e4m3"), "{w}");
        assert_eq!(warnings(&["optim.states.v_format=\"fp8\"", "optim.states.min_quantized_numel=1024"]), Vec::<String>::new());
    }

    #[test]
    fn a_scale_kind_without_fp8_or_fp4_states() {
        let w = one(&["optim.states.scale=\"amax\"", "optim.states.v_format=\"bf16\""], "optim.states.scale = \"amax\" does nothing");
        assert!(w.contains("m (fp32) and v (bf16)"), "{w}");
        assert_eq!(warnings(&["optim.states.scale=\"pow2\"", "optim.states.v_format=\"fp4\""]), Vec::<String>::new());
    }

    #[test]
    fn blocks_that_do_nothing_or_span_every_tensor() {
        one(&["optim.states.block_size=64"], "optim.states.block_size = 64 does nothing");
        let w =
            one(&["optim.states.v_format=\"fp8\"", "optim.states.block_size=1048576"], "optim.states.block_size = 1048576 is not smaller");
        assert!(w.contains("4096 elements") && w.contains("block_size = 0"), "{w}");
    }

    #[test]
    fn resets_after_the_last_update() {
        let w = one(&["optim.states.v_reset_every=1000000000000000000"], "optim.states.v_reset_every = 1000000000000000000 is not shorter");
        assert!(w.contains("v never resets"), "{w}");
        let w = warnings(&["optim.states.m_reset_every=100", "optim.states.v_reset_every=100"]);
        assert!(
            w.len() == 2 && w[0].starts_with("optim.states.m_reset_every = 100") && w[1].starts_with("optim.states.v_reset_every = 100"),
            "{w:?}"
        );
        assert_eq!(warnings(&["optim.states.m_reset_every=99", "optim.states.v_reset_every=99"]), Vec::<String>::new());
    }

    /// A group's section gets the warnings of `[optim.states]` for the keys it sets, judged by
    /// the group's own formats; a key of `[optim.states]` acts where a group with other formats
    /// takes it.
    #[test]
    fn a_groups_settings_that_cannot_act() {
        let one_in_mlp = |sets: &[&str], what: &str| {
            let sets: Vec<String> = sets.iter().map(|s| format!("optim.states.groups.mlp.{s}")).collect();
            one(&sets.iter().map(String::as_str).collect::<Vec<_>>(), &format!("optim.states.groups.mlp.{what}"))
        };
        one_in_mlp(&["v_format=\"fp4e2m1\""], "v_format = \"fp4e2m1\" is signed");
        let w = one_in_mlp(&["scale=\"amax\"", "v_format=\"bf16\""], "scale = \"amax\" does nothing");
        assert!(w.contains("m (fp32) and v (bf16)"), "{w}");
        one_in_mlp(&["block_size=64"], "block_size = 64 does nothing");
        let w = one_in_mlp(&["v_format=\"fp8\"", "block_size=4096"], "block_size = 4096 is not smaller than the largest tensor");
        assert!(w.contains("4096 elements"), "{w}");
        one_in_mlp(&["m_reset_every=100"], "m_reset_every = 100 is not shorter than train.max_steps = 100");
        one_in_mlp(&["v_reset_every=1000"], "v_reset_every = 1000 is not shorter");
        one_in_mlp(&["v_reset_idle=\"keep\""], "v_reset_idle = \"keep\" does nothing");
        // acting in the group: its own fp8 v, its v-only resets
        let mlp = |s: &str| format!("optim.states.groups.mlp.{s}");
        let (fp8, amax, keep) = (mlp("v_format=\"fp8\""), mlp("scale=\"amax\""), mlp("v_reset_idle=\"keep\""));
        assert_eq!(warnings(&[&fp8, &amax, &mlp("block_size=64")]), Vec::<String>::new());
        assert_eq!(warnings(&[&keep, &mlp("v_reset_every=30")]), Vec::<String>::new());
        // `[optim.states]`' scale and block size act on the group's fp8 v, though its own
        // states are fp32; its signed v is not warned about where every group sets its own
        assert_eq!(warnings(&[&fp8, "optim.states.scale=\"amax\"", "optim.states.block_size=64"]), Vec::<String>::new());
        let (attn_fp8, signed) = ("optim.states.groups.attn.v_format=\"fp8\"", "optim.states.v_format=\"fp4e2m1\"");
        assert_eq!(warnings(&[&fp8, attn_fp8, signed]), Vec::<String>::new());
        one(&[&fp8, signed], "optim.states.v_format = \"fp4e2m1\" is signed");
    }

    /// With Muon, a v key set for a group of Muon matrices is warned about (they keep no v);
    /// the same key for an AdamW group (the embedding) acts, and is not.
    #[test]
    fn v_settings_of_muons_matrices_cannot_act() {
        let cfg = tiny(&["optim.kind=\"muon\"", "optim.states.groups.attn.v_format=\"fp8\"", "optim.states.groups.embed.v_format=\"fp8\""]);
        let info = |group: &str, len| lowbit_optim::ParamInfo { name: group.into(), group: group.into(), len, weight_decay: true };
        let hyper = lowbit_optim::Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
        let moments = Moments::new(hyper, plan(&cfg), 0, vec![info("attn", 16), info("embed", 32)]);
        let muon = lowbit_optim::LowbitMuon::new(moments, cfg.optim.muon, &[vec![4, 4], vec![8, 4]]);
        let w = muon_warnings(&cfg, &muon.moments);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("optim.states.groups.attn.v_format does nothing: with optim.kind = \"muon\""), "{w:?}");
    }

    #[test]
    fn an_adaptive_rule_over_fp32_v() {
        let w = one(&["optim.states.reset=\"adaptive\""], "optim.states.reset = \"adaptive\" with v_format = \"fp32\"");
        assert!(w.contains("expect no reset"), "{w}");
        assert_eq!(warnings(&["optim.states.reset=\"adaptive\"", "optim.states.v_format=\"fp8\""]), Vec::<String>::new());
    }

    #[test]
    fn keeping_idle_v_without_v_only_resets() {
        one(&["optim.states.v_reset_idle=\"keep\""], "optim.states.v_reset_idle = \"keep\" does nothing");
        let both = ["optim.states.v_reset_idle=\"keep\"", "optim.states.m_reset_every=20", "optim.states.v_reset_every=40"];
        one(&both, "optim.states.v_reset_idle = \"keep\" does nothing");
        // with v-only resets it acts: only the note on them
        let w = warnings(&["optim.states.v_reset_idle=\"keep\"", "optim.states.v_reset_every=30"]);
        assert!(w.len() == 1 && w[0].starts_with("optim.states: v resets every 30"), "{w:?}");
    }

    /// The per-group warnings, [`continued_bias_correction`] and [`restarted_m_without_v`], for
    /// [`tiny`] with `sets`, over groups `attn` and `mlp` (tensors of 4096 elements).
    fn group_warnings(sets: &[&str]) -> [Option<String>; 2] {
        let cfg = tiny(sets);
        let plan = plan(&cfg);
        let specs = [("attn", plan.for_tensor("attn", 4096)), ("mlp", plan.for_tensor("mlp", 4096))];
        let per_group = || specs.iter().map(|(g, s)| (*g, s));
        [continued_bias_correction(&cfg, plan.base.reset, per_group()), restarted_m_without_v(&cfg, per_group())]
    }

    fn continued(sets: &[&str]) -> Option<String> {
        let [c, _] = group_warnings(sets);
        c
    }

    fn m_alone(sets: &[&str]) -> Option<String> {
        let [_, m] = group_warnings(sets);
        m
    }

    #[test]
    fn a_continued_bias_correction_with_resets_of_v() {
        let c = "optim.states.bias_correction=\"continue\"";
        let w = continued(&[c, "optim.states.m_reset_every=20", "optim.states.v_reset_every=20"]).unwrap();
        assert!(w.contains("(tensor groups attn, mlp)") && w.contains("up to 6.6x") && w.contains("32x right after"), "{w}");
        assert!(continued(&[c, "optim.states.v_reset_every=30"]).is_some(), "v-only resets");
        assert!(continued(&[c, "optim.states.reset=\"adaptive\"", "optim.states.v_format=\"fp8\""]).is_some());
        // m resets alone leave v's correction right; v resets after the last update never come
        assert_eq!(continued(&[c, "optim.states.m_reset_every=20"]), None);
        assert_eq!(continued(&[c, "optim.states.v_reset_every=100"]), None);
        assert_eq!(continued(&["optim.states.v_reset_every=30"]), None, "restart: the default");
        // set or reset by one group only
        let w = continued(&[c, "optim.states.groups.mlp.v_reset_every=30"]).unwrap();
        assert!(w.contains("(tensor groups mlp)"), "{w}");
        let w = continued(&["optim.states.v_reset_every=30", "optim.states.groups.attn.bias_correction=\"continue\""]).unwrap();
        assert!(w.contains("(tensor groups attn)"), "{w}");
    }

    #[test]
    fn restarted_m_resets_without_v() {
        let w = m_alone(&["optim.states.m_reset_every=20"]).unwrap();
        assert!(w.contains("(tensor groups attn, mlp)") && w.contains("reach up to 32x lr, where Adam's single-spike step is 3.2x"), "{w}");
        // m every 20, v every 40: m resets alone at 21, 61, ...
        assert!(m_alone(&["optim.states.m_reset_every=20", "optim.states.v_reset_every=40"]).is_some());
        // v with every m reset, the counter continuing, or no m reset within the run: none
        assert_eq!(m_alone(&["optim.states.m_reset_every=20", "optim.states.v_reset_every=20"]), None);
        assert_eq!(m_alone(&["optim.states.m_reset_every=40", "optim.states.v_reset_every=20"]), None);
        assert_eq!(m_alone(&["optim.states.m_reset_every=20", "optim.states.bias_correction=\"continue\""]), None);
        assert_eq!(m_alone(&["optim.states.m_reset_every=100"]), None);
        assert_eq!(m_alone(&["optim.states.v_reset_every=30"]), None, "v-only resets");
        let w = m_alone(&["optim.states.groups.mlp.m_reset_every=20"]).unwrap();
        assert!(w.contains("(tensor groups mlp)"), "{w}");
    }

    #[test]
    fn passes_are_counted_by_rows_when_known() {
        let cfg = RunConfig::from_toml("[model]\npreset = \"tiny\"\n[data]\n[train]\nmax_steps = 100\nmicro_batch = 8\n").unwrap();
        assert_eq!(passes_planned(&cfg, PassSize { tokens: 1, exact: true, rows: Some(400) }), 2.0);
        assert_eq!(passes_planned(&cfg, PassSize { tokens: 204_800, exact: false, rows: None }), 1.0);
        assert!(passes_warning(&cfg, PassSize { tokens: 204_800, exact: false, rows: Some(100) }, 8.0).unwrap().contains("estimated"));
        assert!(passes_warning(&cfg, PassSize { tokens: 1, exact: true, rows: None }, 4.0).is_none());
    }
}
