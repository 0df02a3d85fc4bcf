//! The CRI-O apply engine: plan (pure comparison of desired and on-disk drop-ins), then act
//! (atomic writes, restart over D-Bus only on change, rollback when the restart fails).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::config::{CrioConfig, DropIn};
use super::state::{digest, under_root, Pending, State, StateError, StatePaths};
use crate::agent::fsops::{self, FsError};
use crate::agent::host::journal;
use crate::agent::host::systemd::{SystemdError, UnitManager, UnitStatus};

/// What happens to one drop-in file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// A new file.
    Create,
    /// New content for a file nodekeeper owns (or adopts).
    Update,
    /// A file nodekeeper created earlier and no longer declares.
    Remove,
}

/// One planned file change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The drop-in file name.
    pub name: String,
    /// What happens.
    pub action: Action,
    /// Current content (None: absent).
    pub old: Option<Vec<u8>>,
    /// Desired content (None: remove).
    pub new: Option<Vec<u8>>,
}

/// The comparison of desired and on-disk state.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Files to change, in name order.
    pub changes: Vec<Change>,
    /// Ownership after the change (name → digest).
    pub owned_after: BTreeMap<String, String>,
}

/// Why an apply failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// File-system failure.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// State file failure.
    #[error(transparent)]
    State(#[from] StateError),
    /// A file that nodekeeper did not create is in the way.
    #[error(
        "refusing to overwrite {}: it was not created by nodekeeper (remove or rename it, or set `adopt = true` on this drop-in to take it over; its content is then backed up for rollback)",
        path.display()
    )]
    NotOwned {
        /// The file.
        path: PathBuf,
    },
    /// Another apply holds the lock.
    #[error("another `nodekeeper crio apply` holds {}; try again when it finishes", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// systemd refused or failed before anything was changed.
    #[error("{0}; nothing was changed")]
    SystemdBefore(#[source] SystemdError),
    /// The restart failed and the previous files were restored.
    #[error(transparent)]
    RestartFailed(Box<RestartFailure>),
}

/// A restart that failed, and its rollback.
#[derive(Debug, thiserror::Error)]
#[error(
    "restart of {unit} failed (job result: {job_result}, unit {active_state}){}; rolled back {files}{}",
    unit_log.as_deref().map(|l| format!("; {unit} said: {l}")).unwrap_or_default(),
    rollback_note.as_deref().map(|n| format!("; {n}")).unwrap_or_default()
)]
pub struct RestartFailure {
    /// The unit.
    pub unit: String,
    /// The job result, or the systemd error.
    pub job_result: String,
    /// ActiveState after the failed restart.
    pub active_state: String,
    /// The files rolled back (paths).
    pub files: String,
    /// The unit's own last error line from the journal (CRI-O's `level=fatal …`), where the
    /// journal is readable.
    pub unit_log: Option<String>,
    /// What happened on the rollback restart, when that failed too.
    pub rollback_note: Option<String>,
}

/// The outcome, printed as text or as one JSON line.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ApplyReport {
    /// Something in the drop-in directory changed (or would, with `--dry-run`).
    pub changed: bool,
    /// The unit was restarted (successfully or not).
    pub restarted: bool,
    /// The change was rolled back.
    pub rolled_back: bool,
    /// The files changed (or rolled back).
    pub files: Vec<FileReport>,
    /// The unit's ActiveState at the end (`unknown` when not asked).
    pub unit_state: String,
    /// A dry run: nothing was touched.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The error, on failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the running CRI-O said on its socket afterwards (absent on a dry run, after a failure,
    /// when the unit is not running, and when no drop-in is declared).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeReport>,
}

/// The running CRI-O's answers after an apply ([`super::runtime`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RuntimeReport {
    /// The socket asked (under `--root`).
    pub socket: PathBuf,
    /// The CRI `Version` answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<super::runtime::RuntimeVersion>,
    /// Drop-in keys its live configuration lacks or overrides.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<super::runtime::Ignored>,
    /// Why it could not be asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RuntimeReport {
    /// One line per finding, for logs and the text output.
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self.ignored.iter().map(ToString::to_string).collect();
        if let Some(e) = &self.error {
            out.push(format!(
                "cannot check the drop-ins against the running CRI-O: {e}"
            ));
        }
        out
    }
}

/// How long each question to CRI-O's socket may take.
const RUNTIME_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks the running CRI-O for its version and live configuration, and compares the declared
/// drop-ins with it.
pub async fn check_runtime(cfg: &CrioConfig, root: Option<&Path>) -> RuntimeReport {
    let socket = under_root(root, &cfg.socket);
    let mut report = RuntimeReport {
        socket: socket.clone(),
        ..RuntimeReport::default()
    };
    match super::runtime::version(&socket, RUNTIME_TIMEOUT).await {
        Ok(v) => report.version = Some(v),
        Err(e) => {
            report.error = Some(crate::telemetry::error_chain(&e));
            return report;
        }
    }
    let live = match super::runtime::live_config(&socket, RUNTIME_TIMEOUT).await {
        Ok(text) => text.parse::<toml::Table>().map_err(|e| {
            format!(
                "CRI-O's live configuration on {} is not TOML: {}",
                socket.display(),
                e.message()
            )
        }),
        Err(e) => Err(crate::telemetry::error_chain(&e)),
    };
    match live {
        Ok(live) => {
            let dropins: Vec<(String, toml::Table)> = cfg
                .dropins
                .iter()
                .filter_map(|d| {
                    let text = String::from_utf8(render(d)).ok()?;
                    Some((d.name.clone(), text.parse().ok()?))
                })
                .collect();
            report.ignored = super::runtime::ignored_keys(&dropins, &live);
        }
        Err(e) => report.error = Some(e),
    }
    report
}

/// One file in the report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FileReport {
    /// File name in the drop-in directory.
    pub name: String,
    /// Full path on the host (under `--root`).
    pub path: PathBuf,
    /// What happened.
    pub action: Action,
    /// Unified-style diff (dry run only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

/// Inputs of one apply.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Prefix for every host path (`--root`).
    pub root: Option<PathBuf>,
    /// Print the diff; touch nothing.
    pub dry_run: bool,
}

/// Host paths of one apply.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The drop-in directory.
    pub dropin_dir: PathBuf,
    /// State, backups, temp files.
    pub state: StatePaths,
}

impl Paths {
    /// Resolves the configured directories under `root`.
    pub fn new(cfg: &CrioConfig, root: Option<&Path>) -> Self {
        Self {
            dropin_dir: under_root(root, &cfg.dropin_dir),
            state: StatePaths {
                dir: under_root(root, &cfg.state_dir),
            },
        }
    }
}

/// The bytes a drop-in renders to.
pub fn render(d: &DropIn) -> Vec<u8> {
    match (&d.content, &d.settings) {
        (Some(c), _) => c.as_bytes().to_vec(),
        (None, Some(t)) => toml::to_string_pretty(t).unwrap_or_default().into_bytes(),
        (None, None) => Vec::new(),
    }
}

/// Compares the desired drop-ins with the directory. Pure apart from reading files.
pub fn plan(cfg: &CrioConfig, paths: &Paths, state: &State) -> Result<Plan, ApplyError> {
    let mut plan = Plan::default();
    let mut desired: BTreeMap<&str, (&DropIn, Vec<u8>)> = BTreeMap::new();
    for d in &cfg.dropins {
        desired.insert(d.name.as_str(), (d, render(d)));
    }
    for (name, (d, new)) in &desired {
        let path = paths.dropin_dir.join(name);
        let old = fsops::read_opt(&path)?;
        let owned = state.owned.contains_key(*name);
        let same = old.as_deref() == Some(new.as_slice());
        if !owned && old.is_some() && !d.adopt {
            if same {
                // Identical content already there, written by someone else: leave it alone, own nothing.
                continue;
            }
            return Err(ApplyError::NotOwned { path });
        }
        plan.owned_after.insert((*name).to_string(), digest(new));
        if !same {
            let action = if old.is_some() {
                Action::Update
            } else {
                Action::Create
            };
            plan.changes.push(Change {
                name: (*name).to_string(),
                action,
                old,
                new: Some(new.clone()),
            });
        }
    }
    for name in state.owned.keys() {
        if desired.contains_key(name.as_str()) {
            continue;
        }
        let old = fsops::read_opt(&paths.dropin_dir.join(name))?;
        if old.is_some() {
            plan.changes.push(Change {
                name: name.clone(),
                action: Action::Remove,
                old,
                new: None,
            });
        }
    }
    plan.changes.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(plan)
}

/// Holds the exclusive apply lock until dropped.
pub struct ApplyLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// Takes the exclusive lock in `state_dir`, failing fast if another apply holds it.
pub fn lock(paths: &Paths) -> Result<ApplyLock, ApplyError> {
    let path = paths.state.lock_file();
    fsops::ensure_dir(&paths.state.dir)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| FsError {
            op: "open lock file",
            path: path.clone(),
            source,
        })?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(ApplyLock { _lock: l }),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(ApplyError::Locked { path }),
        Err((_, e)) => Err(FsError {
            op: "lock",
            path,
            source: e.into(),
        }
        .into()),
    }
}

fn file_reports(paths: &Paths, changes: &[Change], with_diff: bool) -> Vec<FileReport> {
    changes
        .iter()
        .map(|c| FileReport {
            name: c.name.clone(),
            path: paths.dropin_dir.join(&c.name),
            action: c.action,
            diff: with_diff.then(|| diff(&c.name, c.old.as_deref(), c.new.as_deref())),
        })
        .collect()
}

/// Runs one apply with `systemd` as the unit manager. Connects lazily: the bus is only needed
/// when something changed.
pub async fn apply<M, F, Fut>(
    cfg: &CrioConfig,
    opts: &ApplyOptions,
    connect: F,
) -> (ApplyReport, Result<(), ApplyError>)
where
    M: UnitManager,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<M, SystemdError>>,
{
    let mut report = ApplyReport {
        unit_state: "unknown".to_string(),
        dry_run: opts.dry_run,
        ..ApplyReport::default()
    };
    let result = apply_inner(cfg, opts, connect, &mut report).await;
    match &result {
        Err(e) => report.error = Some(crate::telemetry::error_chain(e)),
        // A unit that is not running (the boot-time oneshot) has no socket yet; with no drop-in
        // declared (e.g. a containerd node) there is nothing to check.
        Ok(())
            if !opts.dry_run
                && !cfg.dropins.is_empty()
                && matches!(report.unit_state.as_str(), "active" | "unknown") =>
        {
            let runtime = check_runtime(cfg, opts.root.as_deref()).await;
            for w in runtime.warnings() {
                tracing::warn!(socket = %runtime.socket.display(), "{w}");
            }
            report.runtime = Some(runtime);
        }
        Ok(()) => {}
    }
    (report, result)
}

async fn apply_inner<M, F, Fut>(
    cfg: &CrioConfig,
    opts: &ApplyOptions,
    connect: F,
    report: &mut ApplyReport,
) -> Result<(), ApplyError>
where
    M: UnitManager,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<M, SystemdError>>,
{
    let paths = Paths::new(cfg, opts.root.as_deref());
    if opts.dry_run {
        let state = paths.state.load()?;
        let plan = plan(cfg, &paths, &state)?;
        report.changed = !plan.changes.is_empty();
        report.files = file_reports(&paths, &plan.changes, true);
        return Ok(());
    }
    let _lock = lock(&paths)?;
    fsops::clean_tmp(&paths.state.tmp_dir())?;
    let mut state = paths.state.load()?;
    let plan = plan(cfg, &paths, &state)?;
    report.changed = !plan.changes.is_empty();
    report.files = file_reports(&paths, &plan.changes, false);
    if plan.changes.is_empty() && state.pending.is_none() {
        if state.owned != plan.owned_after {
            state.owned = plan.owned_after;
            paths.state.save(&state)?;
        }
        return Ok(());
    }
    // Something changed, or an earlier run was killed before confirming its restart.
    let systemd = connect().await.map_err(ApplyError::SystemdBefore)?;
    let before = systemd
        .status(&cfg.unit)
        .await
        .map_err(ApplyError::SystemdBefore)?;
    report.unit_state = before.active_state.clone();

    begin(&paths, &mut state, &plan)?;
    for c in &plan.changes {
        let path = paths.dropin_dir.join(&c.name);
        match &c.new {
            Some(bytes) => fsops::atomic_write(&path, bytes, &paths.state.tmp_dir())?,
            None => fsops::remove(&path)?,
        }
        tracing::info!(file = %path.display(), action = ?c.action, "drop-in written");
    }
    if !needs_restart(&before) {
        tracing::info!(unit = %cfg.unit, state = %before.active_state, "unit not running: it reads the new drop-ins when it starts");
        return commit(&paths, &mut state, plan.owned_after);
    }
    report.restarted = true;
    // systemd's start limit (5 starts in 10 s by default) guards against a crash loop; nodekeeper's
    // restart is one deliberate start per change, as its rollback's is. Without the reset, a
    // change soon after a few restarts (a killed apply finished by the next, the boot oneshot
    // then the agent) is refused (`start-limit-hit`, no CRI-O line) and rolled back; a failed
    // unit would refuse it too.
    reset_failed(&systemd, &cfg.unit).await;
    let restart_began = std::time::SystemTime::now();
    let outcome = systemd.restart(&cfg.unit, cfg.restart_timeout).await;
    match outcome {
        Ok(o) if o.succeeded() => {
            report.unit_state = o.status.active_state;
            tracing::info!(unit = %cfg.unit, "restarted after drop-in change");
            commit(&paths, &mut state, plan.owned_after)
        }
        failed => {
            let (job_result, active_state) = match &failed {
                Ok(o) => (o.job_result.clone(), o.status.active_state.clone()),
                Err(e) => (e.to_string(), current_state(&systemd, &cfg.unit).await),
            };
            let unit_log =
                journal::last_error_line(opts.root.as_deref(), &cfg.unit, restart_began).await;
            tracing::error!(unit = %cfg.unit, %job_result, %active_state, unit_log = unit_log.as_deref().unwrap_or(""), "restart failed: rolling back");
            let (files, rollback_note, unit_state) =
                rollback(&paths, &mut state, &systemd, &cfg.unit, cfg.restart_timeout).await?;
            report.rolled_back = true;
            report.unit_state = unit_state;
            Err(ApplyError::RestartFailed(Box::new(RestartFailure {
                unit: cfg.unit.clone(),
                job_result,
                active_state,
                files,
                unit_log,
                rollback_note,
            })))
        }
    }
}

/// A unit that is not running (e.g. the boot-time oneshot runs before crio starts) needs no
/// restart: it reads the drop-ins when it starts. A failed unit is restarted: the new config
/// may be what fixes it.
fn needs_restart(s: &UnitStatus) -> bool {
    s.active_state != "inactive"
}

async fn current_state<M: UnitManager>(m: &M, unit: &str) -> String {
    m.status(unit)
        .await
        .map(|s| s.active_state)
        .unwrap_or_else(|_| "unknown".to_string())
}

async fn reset_failed<M: UnitManager>(m: &M, unit: &str) {
    if let Err(error) = m.reset_failed(unit).await {
        tracing::warn!(unit, %error, "cannot reset the unit's failed state");
    }
}

/// Records the transaction (with backups of what is about to change) before touching the directory.
fn begin(paths: &Paths, state: &mut State, plan: &Plan) -> Result<(), ApplyError> {
    let pending = state.pending.get_or_insert_with(|| Pending {
        files: BTreeMap::new(),
        owned_before: state.owned.clone(),
    });
    for c in &plan.changes {
        // A pending transaction left by a killed run keeps its original backups: they are the last good files.
        if pending.files.contains_key(&c.name) {
            continue;
        }
        if let Some(old) = &c.old {
            paths.state.save_backup(&c.name, old)?;
        }
        pending.files.insert(c.name.clone(), c.old.is_some());
    }
    // Own the new names before creating them, so a killed run never leaves an unowned file behind.
    for (name, d) in &plan.owned_after {
        state.owned.insert(name.clone(), d.clone());
    }
    paths.state.save(state)?;
    Ok(())
}

fn commit(
    paths: &Paths,
    state: &mut State,
    owned: BTreeMap<String, String>,
) -> Result<(), ApplyError> {
    state.owned = owned;
    state.pending = None;
    paths.state.save(state)?;
    paths.state.clear_backups()?;
    Ok(())
}

/// Restores the files of the pending transaction, restarts again, and clears the transaction.
/// Returns (files restored, note on the rollback restart, final ActiveState).
async fn rollback<M: UnitManager>(
    paths: &Paths,
    state: &mut State,
    systemd: &M,
    unit: &str,
    timeout: Duration,
) -> Result<(String, Option<String>, String), ApplyError> {
    let Some(pending) = state.pending.clone() else {
        return Ok((String::new(), None, current_state(systemd, unit).await));
    };
    let mut restored = Vec::new();
    for (name, existed) in &pending.files {
        let path = paths.dropin_dir.join(name);
        match (existed, paths.state.read_backup(name)?) {
            (true, Some(bytes)) => fsops::atomic_write(&path, &bytes, &paths.state.tmp_dir())?,
            _ => fsops::remove(&path)?,
        }
        restored.push(path.display().to_string());
    }
    state.owned = pending.owned_before;
    state.pending = None;
    paths.state.save(state)?;
    paths.state.clear_backups()?;
    // The failed restart counts against the unit's start limit (default 5 in 10 s): without a
    // reset, repeated failed applies would get the rollback restart refused and leave CRI-O down.
    reset_failed(systemd, unit).await;
    let (note, unit_state) = match systemd.restart(unit, timeout).await {
        Ok(o) if o.succeeded() => (None, o.status.active_state),
        Ok(o) => (
            Some(format!(
                "the restart with the restored files failed too (job result: {})",
                o.job_result
            )),
            o.status.active_state,
        ),
        Err(e) => (
            Some(format!(
                "the restart with the restored files failed too: {e}"
            )),
            current_state(systemd, unit).await,
        ),
    };
    Ok((restored.join(", "), note, unit_state))
}

/// Lines of context around each change in [`diff`].
const DIFF_CONTEXT: usize = 3;

/// A line diff (`-` old, `+` new, ` ` context) of two texts, `similar`'s unified diff: a
/// `--- a/NAME` / `+++ b/NAME` header (`/dev/null` for a missing side), then the changed lines
/// with up to 3 lines of context. A diff that shows the whole file (small drop-ins, the usual
/// case) has no hunk header; one that leaves lines out gives each hunk its `@@ -l,n +l,n @@`.
/// Linear memory; a diff taking over a second settles for a less minimal (still correct) one.
pub fn diff(name: &str, old: Option<&[u8]>, new: Option<&[u8]>) -> String {
    let a_text = old.map(String::from_utf8_lossy).unwrap_or_default();
    let b_text = new.map(String::from_utf8_lossy).unwrap_or_default();
    let a: Vec<&str> = a_text.lines().collect();
    let b: Vec<&str> = b_text.lines().collect();
    let side = |present: bool, prefix: &str| {
        if present {
            format!("{prefix}/{name}")
        } else {
            "/dev/null".to_string()
        }
    };
    let mut out = format!(
        "--- {}\n+++ {}\n",
        side(old.is_some(), "a"),
        side(new.is_some(), "b")
    );
    let text = similar::TextDiff::configure()
        .algorithm(similar::Algorithm::Myers)
        .timeout(std::time::Duration::from_secs(1))
        .diff_slices(&a, &b);
    let mut unified = text.unified_diff();
    unified.context_radius(DIFF_CONTEXT);
    let hunks: Vec<_> = unified.iter_hunks().collect();
    let whole_file = match hunks.as_slice() {
        [] => true,
        [h] => {
            let (first, last) = (h.ops()[0], h.ops()[h.ops().len() - 1]);
            first.old_range().start == 0
                && first.new_range().start == 0
                && last.old_range().end == a.len()
                && last.new_range().end == b.len()
        }
        _ => false,
    };
    for h in &hunks {
        if !whole_file {
            out.push_str(&format!("{}\n", h.header()));
        }
        for c in h.iter_changes() {
            let sign = match c.tag() {
                similar::ChangeTag::Equal => ' ',
                similar::ChangeTag::Delete => '-',
                similar::ChangeTag::Insert => '+',
            };
            out.push(sign);
            out.push_str(c.value());
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::host::fake::FakeUnitManager;
    use crate::agent::host::systemd::RestartOutcome;
    use std::fs;

    fn outcome(result: &str, state: &str) -> RestartOutcome {
        let status = match state {
            "active" => FakeUnitManager::active(),
            _ => FakeUnitManager::failed(),
        };
        RestartOutcome {
            job_result: result.into(),
            status,
        }
    }
    fn fake(outcomes: Vec<RestartOutcome>) -> FakeUnitManager {
        let f = FakeUnitManager::new().with_unit("crio.service", FakeUnitManager::active());
        for o in outcomes {
            f.push_restart(Ok(o));
        }
        f
    }
    fn cfg(dropins: &[(&str, &str)]) -> CrioConfig {
        CrioConfig {
            dropins: dropins
                .iter()
                .map(|(n, c)| DropIn {
                    name: n.to_string(),
                    content: Some(c.to_string()),
                    settings: None,
                    adopt: false,
                })
                .collect(),
            ..CrioConfig::default()
        }
    }
    fn opts(root: &Path) -> ApplyOptions {
        ApplyOptions {
            root: Some(root.to_path_buf()),
            dry_run: false,
        }
    }
    async fn run(
        c: &CrioConfig,
        root: &Path,
        f: &FakeUnitManager,
    ) -> (ApplyReport, Result<(), ApplyError>) {
        apply(c, &opts(root), || async { Ok(f) }).await
    }
    fn dropin_dir(root: &Path) -> PathBuf {
        root.join("etc/crio/crio.conf.d")
    }
    fn listing(root: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dropin_dir(root))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    impl UnitManager for &FakeUnitManager {
        async fn status(&self, unit: &str) -> Result<UnitStatus, SystemdError> {
            (**self).status(unit).await
        }
        async fn restart(&self, unit: &str, t: Duration) -> Result<RestartOutcome, SystemdError> {
            (**self).restart(unit, t).await
        }
        async fn reset_failed(&self, unit: &str) -> Result<(), SystemdError> {
            (**self).reset_failed(unit).await
        }
    }

    #[tokio::test]
    async fn change_restarts_once_then_no_op() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(dropin_dir(root.path())).unwrap();
        let f = fake(vec![outcome("done", "active")]);
        let c = cfg(&[(
            "11-default.conf",
            "[crio.image]\nshort_name_mode = \"enforcing\"\n",
        )]);
        let (r, res) = run(&c, root.path(), &f).await;
        res.unwrap();
        assert!(r.changed && r.restarted && !r.rolled_back);
        assert_eq!(r.unit_state, "active");
        assert_eq!(
            fs::read_to_string(dropin_dir(root.path()).join("11-default.conf")).unwrap(),
            "[crio.image]\nshort_name_mode = \"enforcing\"\n"
        );
        let (r, res) = run(&c, root.path(), &f).await;
        res.unwrap();
        assert!(!r.changed && !r.restarted);
        assert_eq!(f.restarts("crio.service"), 1);
    }

    #[tokio::test]
    async fn failed_restart_rolls_back_previous_files() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(dropin_dir(root.path())).unwrap();
        let good = fake(vec![outcome("done", "active")]);
        run(&cfg(&[("a.conf", "good = 1\n")]), root.path(), &good)
            .await
            .1
            .unwrap();
        let bad = fake(vec![outcome("failed", "failed"), outcome("done", "active")]);
        let c = cfg(&[("a.conf", "BROKEN\n"), ("b.conf", "new = 1\n")]);
        let (r, res) = run(&c, root.path(), &bad).await;
        let err = res.unwrap_err().to_string();
        assert!(
            err.contains("restart of crio.service failed (job result: failed"),
            "{err}"
        );
        assert!(err.contains("a.conf") && err.contains("b.conf"), "{err}");
        assert!(r.rolled_back && r.restarted && r.unit_state == "active");
        assert_eq!(listing(root.path()), vec!["a.conf"]);
        assert_eq!(
            fs::read_to_string(dropin_dir(root.path()).join("a.conf")).unwrap(),
            "good = 1\n"
        );
        assert_eq!(bad.restarts("crio.service"), 2);
        // Each restart, the change's and the rollback's, resets the start limit first.
        use crate::agent::host::fake::FakeCall;
        let calls: Vec<&str> = bad
            .calls()
            .iter()
            .filter_map(|c| match c {
                FakeCall::ResetFailed { .. } => Some("reset"),
                FakeCall::Restart { .. } => Some("restart"),
                _ => None,
            })
            .collect();
        assert_eq!(
            calls,
            ["reset", "restart", "reset", "restart"],
            "{:?}",
            bad.calls()
        );
        // The state still owns exactly the old file, with no transaction pending.
        let st = StatePaths {
            dir: root.path().join("var/lib/nodekeeper"),
        }
        .load()
        .unwrap();
        assert_eq!(st.owned.keys().collect::<Vec<_>>(), vec!["a.conf"]);
        assert!(st.pending.is_none());
    }

    #[tokio::test]
    async fn foreign_files_are_never_touched() {
        let root = tempfile::tempdir().unwrap();
        let dir = dropin_dir(root.path());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("00-foreign.conf"), "x = 1\n").unwrap();
        fs::write(dir.join("11-default.conf"), "mine? no\n").unwrap();
        let f = fake(vec![outcome("done", "active")]);
        let (_, res) = run(&cfg(&[("11-default.conf", "y = 2\n")]), root.path(), &f).await;
        assert!(matches!(res, Err(ApplyError::NotOwned { .. })));
        assert_eq!(
            fs::read_to_string(dir.join("11-default.conf")).unwrap(),
            "mine? no\n"
        );
        // Declaring and then dropping a file removes only that file.
        run(&cfg(&[("20-x.conf", "z = 3\n")]), root.path(), &f)
            .await
            .1
            .unwrap();
        run(&cfg(&[]), root.path(), &f).await.1.unwrap();
        assert_eq!(
            listing(root.path()),
            vec!["00-foreign.conf", "11-default.conf"]
        );
        assert!(f.restarts("crio.service") == 2);
    }

    #[tokio::test]
    async fn adopt_takes_over_and_rollback_restores_the_original() {
        let root = tempfile::tempdir().unwrap();
        let dir = dropin_dir(root.path());
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("11-default.conf"),
            "[crio.image]\nshort_name_mode = \"disabled\"\n",
        )
        .unwrap();
        let mut c = cfg(&[("11-default.conf", "BROKEN\n")]);
        c.dropins[0].adopt = true;
        let f = fake(vec![outcome("failed", "failed"), outcome("done", "active")]);
        let (r, res) = run(&c, root.path(), &f).await;
        assert!(res.is_err() && r.rolled_back);
        assert_eq!(
            fs::read_to_string(dir.join("11-default.conf")).unwrap(),
            "[crio.image]\nshort_name_mode = \"disabled\"\n"
        );
    }

    /// After an apply CRI-O is asked on its socket (here missing: named), unless no drop-in is
    /// declared (a node without CRI-O config, e.g. containerd) or the unit is not running.
    #[tokio::test]
    async fn the_running_crio_is_asked_only_when_there_is_something_to_check() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(dropin_dir(root.path())).unwrap();
        let f = fake(vec![outcome("done", "active")]);
        let (r, res) = run(&cfg(&[]), root.path(), &f).await;
        res.unwrap();
        assert!(r.runtime.is_none(), "{r:?}");
        let (r, res) = run(&cfg(&[("a.conf", "a = 1\n")]), root.path(), &f).await;
        res.unwrap();
        let rt = r.runtime.unwrap();
        assert_eq!(rt.socket, root.path().join("var/run/crio/crio.sock"));
        assert_eq!(rt.warnings().len(), 1);
        let e = rt.error.unwrap();
        assert!(
            e.contains("cannot connect to CRI-O's socket") && e.contains("crio.sock"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn inactive_unit_is_not_restarted() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(dropin_dir(root.path())).unwrap();
        let inactive = UnitStatus {
            active_state: "inactive".into(),
            sub_state: "dead".into(),
            ..FakeUnitManager::active()
        };
        let f = FakeUnitManager::new().with_unit("crio.service", inactive);
        let (r, res) = run(&cfg(&[("a.conf", "a = 1\n")]), root.path(), &f).await;
        res.unwrap();
        assert!(r.changed && !r.restarted);
        assert_eq!(f.restarts("crio.service"), 0);
    }

    #[tokio::test]
    async fn dry_run_touches_nothing_and_shows_a_diff() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(dropin_dir(root.path())).unwrap();
        let f = fake(vec![]);
        let (r, res) = apply(
            &cfg(&[("a.conf", "a = 1\nb = 2\n")]),
            &ApplyOptions {
                root: Some(root.path().into()),
                dry_run: true,
            },
            || async { Ok(&f) },
        )
        .await;
        res.unwrap();
        assert!(r.changed && r.dry_run);
        assert_eq!(
            r.files[0].diff.as_deref(),
            Some("--- /dev/null\n+++ b/a.conf\n+a = 1\n+b = 2\n")
        );
        assert!(listing(root.path()).is_empty());
        assert!(!root.path().join("var/lib/nodekeeper").exists());
    }

    #[tokio::test]
    async fn interrupted_transaction_is_finished_by_the_next_run() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(dropin_dir(root.path())).unwrap();
        let f = fake(vec![outcome("done", "active")]);
        let c = cfg(&[("a.conf", "a = 1\n")]);
        run(&c, root.path(), &f).await.1.unwrap();
        // Simulate a run killed after writing the new file but before restarting.
        let paths = Paths::new(&c, Some(root.path()));
        let mut st = paths.state.load().unwrap();
        paths.state.save_backup("a.conf", b"a = 1\n").unwrap();
        st.pending = Some(Pending {
            files: [("a.conf".to_string(), true)].into(),
            owned_before: st.owned.clone(),
        });
        paths.state.save(&st).unwrap();
        let c2 = cfg(&[("a.conf", "a = 2\n")]);
        fs::write(dropin_dir(root.path()).join("a.conf"), "a = 2\n").unwrap();
        // The next run sees no file change, but still restarts; a failure rolls back to the last good file.
        let bad = fake(vec![outcome("failed", "failed"), outcome("done", "active")]);
        let (r, res) = run(&c2, root.path(), &bad).await;
        assert!(res.is_err() && r.rolled_back, "{r:?}");
        assert_eq!(
            fs::read_to_string(dropin_dir(root.path()).join("a.conf")).unwrap(),
            "a = 1\n"
        );
    }

    #[test]
    fn diff_shows_changed_lines() {
        assert_eq!(
            diff("x", Some(b"a\nb\nc\n"), Some(b"a\nB\nc\n")),
            "--- a/x\n+++ b/x\n a\n-b\n+B\n c\n"
        );
        assert_eq!(
            diff("x", Some(b"a\n"), None),
            "--- a/x\n+++ /dev/null\n-a\n"
        );
        assert_eq!(diff("x", Some(b"a\n"), Some(b"a\n")), "--- a/x\n+++ b/x\n");
    }

    /// Two 20k-line files differing in one line: quick, linear memory (the former LCS table
    /// needed 20k × 20k cells), and only the changed hunk is shown.
    #[test]
    fn diff_of_large_files_shows_only_the_changed_hunk() {
        let old: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        let new = old.replace("line 10000\n", "line ten thousand\n");
        let started = std::time::Instant::now();
        let d = diff("big.conf", Some(old.as_bytes()), Some(new.as_bytes()));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(
            d,
            "--- a/big.conf\n+++ b/big.conf\n@@ -9998,7 +9998,7 @@\n line 9997\n line 9998\n \
             line 9999\n-line 10000\n+line ten thousand\n line 10001\n line 10002\n line 10003\n"
        );
    }
}
