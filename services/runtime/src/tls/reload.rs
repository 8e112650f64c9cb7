//! A certificate resolver that follows its files.
//!
//! Kubernetes rotates a mounted Secret by writing a new timestamped directory
//! and swapping the `..data` symlink, so a watch on the files themselves
//! misses it: we watch the *directories* holding them. A periodic re-read is
//! the fallback for filesystems without inotify. A pair that fails to parse
//! or does not match is logged and the previous certificate stays in service,
//! so a half-written rotation never takes the server down.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{PemPair, TlsError};
use crate::watch::{Depth, DirWatch};

struct Loaded {
    pem: PemPair,
    key: Arc<CertifiedKey>,
}

/// Serves the certificate currently on disk at `cert_path`/`key_path`.
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    loaded: RwLock<Loaded>,
    generation: watch::Sender<u64>,
    /// Times the files were re-read (changed or not).
    checks: AtomicU64,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .field("generation", &*self.generation.borrow())
            .finish()
    }
}

impl ReloadingCert {
    /// Loads the pair once; fails fast so a broken Secret stops start-up
    /// with a clear message instead of serving handshake errors.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, TlsError> {
        let pem = PemPair::read(cert_path, key_path)?;
        let key = pem.certified_key(cert_path, key_path)?;
        Ok(Arc::new(Self {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            loaded: RwLock::new(Loaded { pem, key }),
            generation: watch::channel(0).0,
            checks: AtomicU64::new(0),
        }))
    }

    /// The certificate served right now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.loaded.read() {
            Ok(guard) => guard.key.clone(),
            Err(poisoned) => poisoned.into_inner().key.clone(),
        }
    }

    /// A receiver whose value increases by one on every successful change of
    /// certificate; tests and the admin endpoint wait on it.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// How many times the files were re-read since load: a watch that stays
    /// quiet while nothing changes keeps this still.
    pub fn checks(&self) -> u64 {
        self.checks.load(Ordering::Relaxed)
    }

    /// Re-reads the files. `Ok(true)` when a new certificate is now served,
    /// `Ok(false)` when the files are unchanged, `Err` (old one kept) when the
    /// new files are unreadable or inconsistent.
    pub fn reload(&self) -> Result<bool, TlsError> {
        self.checks.fetch_add(1, Ordering::Relaxed);
        let pem = PemPair::read(&self.cert_path, &self.key_path)?;
        if self.loaded.read().map(|l| l.pem == pem).unwrap_or(false) {
            return Ok(false);
        }
        let key = pem.certified_key(&self.cert_path, &self.key_path)?;
        match self.loaded.write() {
            Ok(mut guard) => *guard = Loaded { pem, key },
            Err(poisoned) => *poisoned.into_inner() = Loaded { pem, key },
        }
        self.generation.send_modify(|g| *g += 1);
        Ok(true)
    }

    /// Watches the directories of both files and reloads on any change there,
    /// and every `fallback` regardless. Runs until `shutdown`.
    pub fn watch(
        self: &Arc<Self>,
        shutdown: CancellationToken,
        fallback: Duration,
    ) -> Result<JoinHandle<()>, TlsError> {
        let dirs: BTreeSet<PathBuf> = [&self.cert_path, &self.key_path]
            .into_iter()
            .map(|p| match p.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
                _ => PathBuf::from("."),
            })
            .collect();
        // Any change in these directories may be the `..data` swap; reloading
        // is cheap and a no-op when the bytes are unchanged. Our own reads of
        // the files are not changes (see `crate::watch`).
        let mut watch = DirWatch::new(dirs, Depth::Root).map_err(|source| TlsError::Watch {
            path: self.cert_path.clone(),
            source,
        })?;

        let this = self.clone();
        Ok(tokio::spawn(async move {
            let mut tick = tokio::time::interval(fallback);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = watch.changed() => {}
                    _ = tick.tick() => watch.rearm(),
                }
                match this.reload() {
                    Ok(true) => {
                        tracing::info!(cert = %this.cert_path.display(), "serving certificate reloaded")
                    }
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(%error, "certificate reload failed; keeping the previous certificate")
                    }
                }
            }
        }))
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::generate;

    fn names() -> Vec<String> {
        vec!["localhost".to_owned()]
    }

    #[test]
    fn reload_swaps_only_on_a_valid_new_pair() -> Result<(), Box<dyn std::error::Error>> {
        crate::install_crypto_provider();
        let dir = tempfile::tempdir()?;
        generate("first", &names(), 1)?.write_to(dir.path())?;
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let resolver = ReloadingCert::load(&cert, &key)?;
        let first = resolver.current().cert[0].clone();
        let generation = resolver.subscribe();

        assert!(
            !resolver.reload()?,
            "unchanged files must not count as a reload"
        );

        // A new key without its certificate is a half-done rotation: keep serving.
        let second = generate("second", &names(), 1)?;
        std::fs::write(&key, &second.key_pem)?;
        assert!(matches!(resolver.reload(), Err(TlsError::Mismatch { .. })));
        assert_eq!(resolver.current().cert[0], first);

        std::fs::write(&cert, &second.cert_pem)?;
        assert!(resolver.reload()?);
        assert_ne!(resolver.current().cert[0], first);
        assert_eq!(*generation.borrow(), 1);
        Ok(())
    }

    /// The reload loop re-reads the files it watches; those reads must not
    /// wake it again (they did with a mask that reported opens: a busy loop).
    #[tokio::test]
    async fn the_watch_reloads_on_rotation_and_stays_quiet_otherwise()
    -> Result<(), Box<dyn std::error::Error>> {
        crate::install_crypto_provider();
        let dir = tempfile::tempdir()?;
        generate("first", &names(), 1)?.write_to(dir.path())?;
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let resolver = ReloadingCert::load(&cert, &key)?;
        let mut generation = resolver.subscribe();
        let shutdown = CancellationToken::new();
        // A fallback far beyond the test: every reload here is the watch's.
        let task = resolver.watch(shutdown.clone(), Duration::from_secs(3600))?;

        generate("second", &names(), 1)?.write_to(dir.path())?;
        tokio::time::timeout(Duration::from_secs(10), generation.wait_for(|g| *g >= 1)).await??;
        let after_rotation = resolver.checks();
        assert!(after_rotation >= 1);

        // Nothing changes for a second: the tail of the rotation may still
        // arrive (at most one burst per file written), nothing driven by the
        // reloads' own reads (a loop did ~20).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle = resolver.checks() - after_rotation;
        assert!(idle <= 3, "{idle} reloads while nothing changed");
        shutdown.cancel();
        task.await?;
        Ok(())
    }

    #[test]
    fn load_fails_fast_on_garbage() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, "not a certificate")?;
        std::fs::write(&key, "not a key")?;
        assert!(matches!(
            ReloadingCert::load(&cert, &key),
            Err(TlsError::NoCertificate { .. })
        ));
        assert!(matches!(
            ReloadingCert::load(&dir.path().join("absent.crt"), &key),
            Err(TlsError::Read { .. })
        ));
        Ok(())
    }
}
