//! Directory watches that wake a loop only when what it reads may have changed.
//!
//! Every watcher in this project re-reads the directory it watches (a scan,
//! a checksum, a certificate reload). A watch that also reports *reads*
//! (`IN_OPEN`, `IN_ACCESS`, `IN_CLOSE_NOWRITE`, which `notify`'s default mask
//! includes) turns that re-read into the next event: a closed loop that kept
//! a core busy on every GPU node. So the mask here names only the events
//! that mean an entry appeared, vanished, was replaced or was rewritten:
//! `IN_CREATE`, `IN_DELETE`, `IN_MOVED_FROM`, `IN_MOVED_TO`, `IN_CLOSE_WRITE`
//! (plus `IN_DELETE_SELF`/`IN_MOVE_SELF` on the watched roots). Reading
//! anything under a watched directory never wakes its owner.
//!
//! Changes arrive in bursts (a container directory and its file, a Secret's
//! `..data` swap: create, rename, delete); [`DirWatch::changed`] returns once
//! per burst, after the directory has been quiet for a moment, so a burst
//! costs one re-read.
//!
//! A root that does not exist yet, or whose watch could not be added, is not
//! an error: the owner keeps its periodic re-read and calls
//! [`DirWatch::rearm`] on each tick, which adds the watch once the directory
//! appears.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use inotify::{EventMask, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};

/// How far below each root changes are seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// Entries of the root itself.
    Root,
    /// Entries of the root and of each directory directly inside it (the
    /// node agent's `<containers>/<pod>_<container>/usage.cache`).
    RootAndChildren,
}

/// After the first event of a burst, wait until no event came for this long…
const QUIET: Duration = Duration::from_millis(50);
/// …but never longer than this, so a directory that never settles still
/// gets re-read regularly.
const MAX_BURST: Duration = Duration::from_millis(500);

/// Entries appeared, vanished, were renamed over or finished being written.
fn entry_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::CLOSE_WRITE
        | WatchMask::ONLYDIR
}

/// A root also reports its own removal or rename.
fn root_mask() -> WatchMask {
    entry_mask() | WatchMask::DELETE_SELF | WatchMask::MOVE_SELF
}

/// What a watch descriptor stands for.
#[derive(Clone, Debug)]
enum Watched {
    Root(usize),
    /// A directory inside a root, by its path.
    Child(PathBuf),
}

/// What may have changed under the roots since the owner last asked
/// ([`DirWatch::changes_since_last_asked`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changes {
    /// Not known: the first ask, the watch not fully armed then or now, a
    /// root (re-)armed in between, or events lost. Re-read everything.
    Unknown,
    /// Only the root entries named here can have changed, as
    /// `root.join(name)`: an entry that appeared, vanished or was renamed,
    /// or (with [`Depth::RootAndChildren`]) a directory whose own entries
    /// changed. Empty when nothing changed.
    Known(BTreeSet<PathBuf>),
}

impl Changes {
    /// Known, and nothing changed.
    pub fn nothing_changed(&self) -> bool {
        matches!(self, Self::Known(entries) if entries.is_empty())
    }
}

/// inotify watches on a set of directories; see the module docs.
pub struct DirWatch {
    roots: Vec<PathBuf>,
    depth: Depth,
    stream: Option<EventStream<Vec<u8>>>,
    watches: Option<Watches>,
    by_wd: HashMap<WatchDescriptor, Watched>,
    /// Roots that currently have a watch.
    armed: Vec<bool>,
    /// Why each root is not watched, logged once per change of reason.
    unarmed_reason: Vec<Option<String>>,
    /// Increases whenever a root gets a (new) watch: changes made before
    /// that were not seen.
    generation: u64,
    /// The generation of the last [`changes_since_last_asked`] that found
    /// the watch fully armed.
    ///
    /// [`changes_since_last_asked`]: Self::changes_since_last_asked
    asked_at: Option<u64>,
    /// The root entries changed since the owner last asked; `None` when
    /// some could not be told (events lost, too many to keep).
    seen: Option<BTreeSet<PathBuf>>,
    /// Subdirectories that exist but could not be watched (out of
    /// `fs.inotify.max_user_watches`, no permission): changes in them may
    /// go unseen.
    child_failures: usize,
}

/// Entries kept between two asks; past this many (an owner that never
/// asks, like libsync and the certificate reload, or a storm) they are
/// dropped and the next ask answers [`Changes::Unknown`].
const MAX_SEEN: usize = 4096;

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatch")
            .field("roots", &self.roots)
            .field("depth", &self.depth)
            .field("armed", &self.armed)
            .field("watches", &self.by_wd.len())
            .finish()
    }
}

impl DirWatch {
    /// Watches `roots` (deduplicated). Fails only when inotify itself is
    /// unavailable; roots that cannot be watched yet are logged and retried
    /// by [`rearm`](Self::rearm). Must be called inside a Tokio runtime.
    pub fn new(roots: impl IntoIterator<Item = PathBuf>, depth: Depth) -> io::Result<Self> {
        let mut unique: Vec<PathBuf> = Vec::new();
        for root in roots {
            if !unique.contains(&root) {
                unique.push(root);
            }
        }
        let inotify = Inotify::init()?;
        let watches = inotify.watches();
        let stream = inotify.into_event_stream(vec![0u8; 16 * 1024])?;
        let mut this = Self::unarmed(unique, depth);
        this.stream = Some(stream);
        this.watches = Some(watches);
        this.rearm();
        Ok(this)
    }

    /// A watch that never fires: for owners whose inotify set-up failed and
    /// who carry on with periodic re-reads.
    pub fn disabled() -> Self {
        Self::unarmed(Vec::new(), Depth::Root)
    }

    /// `roots`, none of them watched yet, and no inotify instance.
    fn unarmed(roots: Vec<PathBuf>, depth: Depth) -> Self {
        let n = roots.len();
        Self {
            roots,
            depth,
            stream: None,
            watches: None,
            by_wd: HashMap::new(),
            armed: vec![false; n],
            unarmed_reason: vec![None; n],
            generation: 0,
            asked_at: None,
            seen: Some(BTreeSet::new()),
            child_failures: 0,
        }
    }

    /// Whether every root (and, with [`Depth::RootAndChildren`], every
    /// subdirectory seen) is watched right now.
    pub fn fully_armed(&self) -> bool {
        self.stream.is_some()
            && !self.roots.is_empty()
            && self.armed.iter().all(|a| *a)
            && self.child_failures == 0
    }

    /// What may have changed under the roots since the last call: known
    /// only when the watch was fully armed then and is now, no root was
    /// re-armed in between (changes before a re-arm go unseen) and no event
    /// was lost. Includes changes whose burst a timer cut short in
    /// [`changed`](Self::changed). [`Changes::Unknown`] on the first call.
    /// An owner asks this right before each re-read and may skip what only
    /// a change could make stale.
    pub fn changes_since_last_asked(&mut self) -> Changes {
        let seen = self.seen.replace(BTreeSet::new());
        let armed_at = self.fully_armed().then_some(self.generation);
        let continuous = armed_at.is_some() && armed_at == self.asked_at;
        self.asked_at = armed_at;
        match seen {
            Some(seen) if continuous => Changes::Known(seen),
            _ => Changes::Unknown,
        }
    }

    /// Adds the watch of every root that has none yet (it may have appeared
    /// since). Cheap when all are armed; call it on each periodic tick.
    pub fn rearm(&mut self) {
        let Some(watches) = self.watches.as_mut() else {
            return;
        };
        for (i, root) in self.roots.iter().enumerate() {
            if self.armed[i] {
                continue;
            }
            match watches.add(root, root_mask()) {
                Ok(wd) => {
                    self.by_wd.insert(wd, Watched::Root(i));
                    self.armed[i] = true;
                    self.generation += 1;
                    if self.unarmed_reason[i].take().is_some() {
                        tracing::info!(dir = %root.display(), "directory watched again");
                    }
                    if self.depth == Depth::RootAndChildren {
                        self.child_failures += watch_children(watches, &mut self.by_wd, root);
                    }
                }
                Err(error) => {
                    let reason = error.to_string();
                    if self.unarmed_reason[i].as_ref() != Some(&reason) {
                        tracing::warn!(dir = %root.display(), %error, "cannot watch directory; relying on periodic re-reads");
                        self.unarmed_reason[i] = Some(reason);
                    }
                }
            }
        }
    }

    /// Waits for the next change under the roots, then for the burst it
    /// belongs to to end. Pending forever when nothing can be watched.
    /// Cancel-safe: a change consumed before the future is dropped is kept
    /// for [`changes_since_last_asked`](Self::changes_since_last_asked).
    pub async fn changed(&mut self) {
        if !self.next_relevant().await {
            return std::future::pending().await;
        }
        let deadline = tokio::time::Instant::now() + MAX_BURST;
        loop {
            let quiet = (tokio::time::Instant::now() + QUIET).min(deadline);
            match tokio::time::timeout_at(quiet, self.next_relevant()).await {
                Ok(true) => continue,
                Ok(false) | Err(_) => return,
            }
        }
    }

    /// The next event that means a change; `false` when the stream ended.
    async fn next_relevant(&mut self) -> bool {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return false;
            };
            let event = match stream.next().await {
                Some(Ok(event)) => event,
                Some(Err(error)) => {
                    tracing::warn!(%error, "inotify read failed; relying on periodic re-reads");
                    self.stream = None;
                    self.watches = None;
                    return false;
                }
                None => {
                    self.stream = None;
                    self.watches = None;
                    return false;
                }
            };
            if self.apply(event.wd, event.mask, event.name.as_deref()) {
                return true;
            }
        }
    }

    /// Keeps the watch set in step with one event and records what it
    /// changed; `true` when it is a change.
    fn apply(&mut self, wd: WatchDescriptor, mask: EventMask, name: Option<&OsStr>) -> bool {
        if mask.contains(EventMask::Q_OVERFLOW) {
            // Events were lost: whatever they were, re-read, and watch the
            // directories whose creation was among them (adding a watch
            // that exists is harmless).
            self.seen = None;
            if self.depth == Depth::RootAndChildren
                && let Some(watches) = self.watches.as_mut()
            {
                for (root, _) in self.roots.iter().zip(&self.armed).filter(|(_, a)| **a) {
                    self.child_failures += watch_children(watches, &mut self.by_wd, root);
                }
            }
            return true;
        }
        let watched = self.by_wd.get(&wd).cloned();
        if mask.contains(EventMask::IGNORED) {
            // The kernel dropped this watch (its directory is gone).
            self.by_wd.remove(&wd);
            if let Some(Watched::Root(i)) = watched {
                self.armed[i] = false;
            }
            return false;
        }
        match watched {
            Some(Watched::Root(i)) => {
                if mask.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF) {
                    // Re-added by `rearm` once a directory is there again.
                    self.armed[i] = false;
                    if let Some(watches) = self.watches.as_mut() {
                        let _ = watches.remove(wd.clone());
                    }
                    self.by_wd.remove(&wd);
                    self.seen = None;
                    return true;
                }
                let entry = name.map(|name| self.roots[i].join(name));
                match &entry {
                    Some(entry) => self.record(entry.clone()),
                    // An event on a root without a name: not attributable.
                    None => self.seen = None,
                }
                let new_dir = mask.contains(EventMask::ISDIR)
                    && mask.intersects(EventMask::CREATE | EventMask::MOVED_TO);
                if new_dir
                    && self.depth == Depth::RootAndChildren
                    && let (Some(child), Some(watches)) = (entry, self.watches.as_mut())
                    && !add_child(watches, &mut self.by_wd, child)
                {
                    self.child_failures += 1;
                }
                true
            }
            Some(Watched::Child(dir)) => {
                self.record(dir);
                true
            }
            // An event queued before its watch was removed.
            None => false,
        }
    }

    /// Remembers a changed root entry for the next ask, within bounds.
    fn record(&mut self, entry: PathBuf) {
        if let Some(seen) = &mut self.seen {
            seen.insert(entry);
            if seen.len() > MAX_SEEN {
                self.seen = None;
            }
        }
    }
}

/// Watches every subdirectory of `root`; returns how many could not be
/// (1 when `root` cannot be listed: its subdirectories are unknown).
fn watch_children(
    watches: &mut Watches,
    by_wd: &mut HashMap<WatchDescriptor, Watched>,
    root: &Path,
) -> usize {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(error) => {
            tracing::warn!(dir = %root.display(), %error, "cannot list directory to watch its subdirectories; relying on full re-reads");
            return 1;
        }
    };
    entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|entry| !add_child(watches, by_wd, entry.path()))
        .count()
}

/// `false` when the directory could not be watched: gone again already, or
/// out of watches (`fs.inotify.max_user_watches`). The owner's periodic
/// re-read still covers it, and [`DirWatch::fully_armed`] stays false.
fn add_child(
    watches: &mut Watches,
    by_wd: &mut HashMap<WatchDescriptor, Watched>,
    dir: PathBuf,
) -> bool {
    match watches.add(&dir, entry_mask()) {
        Ok(wd) => {
            by_wd.insert(wd, Watched::Child(dir));
            true
        }
        // Removed before we got to it: nothing left to watch.
        Err(error) if error.kind() == io::ErrorKind::NotFound => true,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot watch subdirectory; its changes are seen by periodic re-reads");
            false
        }
    }
}

#[cfg(test)]
mod tests;
