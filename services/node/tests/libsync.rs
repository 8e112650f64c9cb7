//! libsync into a temp "host root".

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use kai_node::libsync::{self, Config, InstallError, Outcome, install_atomic};

struct Host {
    root: tempfile::TempDir,
}

impl Host {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        for dir in ["artifacts", "host/usr/local/vgpu"] {
            std::fs::create_dir_all(root.path().join(dir)).expect("mkdir");
        }
        std::fs::write(
            root.path().join("artifacts/libvgpu.so"),
            b"\x7fELF version one",
        )
        .expect("lib");
        Self { root }
    }
    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.root.path().join(rel)
    }
    fn config(&self) -> Config {
        Config {
            source_dir: self.path("artifacts"),
            preload_file: None,
            host_vgpu_dir: self.path("host/usr/local/vgpu"),
            host_vgpulock_dir: self.path("host/usr/local/vgpu/vgpulock"),
            container_vgpu_mount: "/usr/local/vgpu".into(),
            check_interval: std::time::Duration::from_secs(60),
            health_listen: "127.0.0.1:0".parse().expect("addr"),
        }
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777
}

#[test]
fn installs_files_and_directories_with_their_modes() {
    let host = Host::new();
    let report = libsync::sync_once(&host.config()).expect("sync");
    assert_eq!(report.written.len(), 2);
    let lib = host.path("host/usr/local/vgpu/libvgpu.so");
    let preload = host.path("host/usr/local/vgpu/ld.so.preload");
    assert_eq!(std::fs::read(&lib).expect("lib"), b"\x7fELF version one");
    assert_eq!(
        std::fs::read_to_string(&preload).expect("preload"),
        "/usr/local/vgpu/libvgpu.so\n"
    );
    assert_eq!((mode(&lib), mode(&preload)), (0o644, 0o644));
    assert_eq!(mode(&host.path("host/usr/local/vgpu/containers")), 0o1777);
    // libvgpu's lock directory: under the install base, created by libsync.
    assert_eq!(mode(&host.path("host/usr/local/vgpu/vgpulock")), 0o1777);
}

#[test]
fn rerun_is_idempotent_and_changes_are_picked_up() {
    let host = Host::new();
    libsync::sync_once(&host.config()).expect("first");
    let lib = host.path("host/usr/local/vgpu/libvgpu.so");
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&lib).expect("stat"));

    let again = libsync::sync_once(&host.config()).expect("second");
    assert!(again.written.is_empty(), "{again:?}");
    assert_eq!(again.unchanged.len(), 2);
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&lib).expect("stat")),
        inode,
        "not rewritten"
    );

    std::fs::write(host.path("artifacts/libvgpu.so"), b"\x7fELF version two").expect("update");
    let third = libsync::sync_once(&host.config()).expect("third");
    assert_eq!(third.written, vec![lib.clone()]);
    assert_eq!(std::fs::read(&lib).expect("lib"), b"\x7fELF version two");

    // Someone loosened the mode on the host: restored.
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    assert_eq!(
        libsync::sync_once(&host.config()).expect("fourth").written,
        vec![lib.clone()]
    );
    assert_eq!(mode(&lib), 0o644);
}

#[test]
fn a_preload_file_from_a_configmap_is_used_verbatim() {
    let host = Host::new();
    std::fs::write(host.path("artifacts/preload"), "/opt/vgpu/libvgpu.so\n").expect("preload");
    let mut config = host.config();
    config.preload_file = Some(host.path("artifacts/preload"));
    libsync::sync_once(&config).expect("sync");
    assert_eq!(
        std::fs::read_to_string(host.path("host/usr/local/vgpu/ld.so.preload")).expect("read"),
        "/opt/vgpu/libvgpu.so\n"
    );
}

/// A reader that fails after some bytes, like a copy cut short.
struct Failing(usize);

impl std::io::Read for Failing {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.0 == 0 {
            return Err(std::io::Error::other("source vanished mid-copy"));
        }
        let n = buf.len().min(self.0);
        buf[..n].fill(b'x');
        self.0 -= n;
        Ok(n)
    }
}

#[test]
fn an_interrupted_install_leaves_the_old_file_intact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dest = dir.path().join("libvgpu.so");
    assert_eq!(
        install_atomic(&dest, &mut &b"old library"[..], 0o644).expect("install"),
        Outcome::Written
    );
    let error = install_atomic(&dest, &mut Failing(100_000), 0o644).expect_err("must fail");
    assert!(error.to_string().contains("source vanished"), "{error}");
    assert_eq!(std::fs::read(&dest).expect("read"), b"old library");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("libvgpu.so")],
        "no temp file left behind"
    );
}

#[test]
fn missing_host_paths_get_a_clear_error() {
    let host = Host::new();
    std::fs::remove_dir_all(host.path("host/usr/local/vgpu")).expect("rm");
    let error = libsync::sync_once(&host.config()).expect_err("must fail");
    assert!(matches!(error, InstallError::Missing { .. }), "{error:?}");
    assert!(error.to_string().contains("hostPath volume"), "{error}");

    let host = Host::new();
    std::fs::remove_file(host.path("artifacts/libvgpu.so")).expect("rm");
    let error = libsync::sync_once(&host.config()).expect_err("must fail");
    assert!(error.to_string().contains("libvgpu.so"), "{error}");
    assert!(!host.path("host/usr/local/vgpu/libvgpu.so").exists());
}

/// kubelet creates a missing subPath (`ld.so.preload`) as an empty
/// directory on the host when a pod mounts it before libsync ran.
#[test]
fn an_empty_directory_at_a_files_path_is_replaced_by_the_file() {
    let host = Host::new();
    let preload = host.path("host/usr/local/vgpu/ld.so.preload");
    std::fs::create_dir(&preload).expect("kubelet's directory");
    let report = libsync::sync_once(&host.config()).expect("sync recovers");
    assert_eq!(report.replaced_directories, std::slice::from_ref(&preload));
    assert!(std::fs::symlink_metadata(&preload).expect("stat").is_file());
    assert_eq!(
        std::fs::read_to_string(&preload).expect("preload"),
        "/usr/local/vgpu/libvgpu.so\n"
    );
    assert_eq!(mode(&preload), 0o644);
    let again = libsync::sync_once(&host.config()).expect("sync");
    assert!(again.replaced_directories.is_empty() && again.written.is_empty());
}

#[test]
fn a_directory_with_content_at_a_files_path_is_left_with_a_clear_error() {
    let host = Host::new();
    let preload = host.path("host/usr/local/vgpu/ld.so.preload");
    std::fs::create_dir(&preload).expect("mkdir");
    std::fs::write(preload.join("keep"), b"someone's data").expect("file");
    let error = libsync::sync_once(&host.config()).expect_err("must not remove data");
    assert!(
        matches!(error, InstallError::DirectoryInPlace { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("ld.so.preload"), "{error}");
    assert_eq!(
        std::fs::read(preload.join("keep")).expect("kept"),
        b"someone's data"
    );
}

#[test]
fn read_only_filesystems_are_named_as_such() {
    let error = InstallError::io(
        Path::new("/host/usr/local/vgpu"),
        std::io::Error::from_raw_os_error(30),
    );
    assert!(
        error.to_string().contains("read-only filesystem"),
        "{error}"
    );
}

/// The loop re-reads (checksums) the files it watches; reading must not wake
/// it, and its own install must cause at most one confirming re-sync.
#[tokio::test]
async fn the_loop_follows_changes_and_stays_quiet_otherwise() {
    let host = Host::new();
    let config = Config {
        // Far beyond the test: every sync after the first is the watch's.
        check_interval: std::time::Duration::from_secs(3600),
        ..host.config()
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = libsync::start(config, shutdown.clone())
        .await
        .expect("start");
    let mut syncs = running.syncs.clone();
    let within = std::time::Duration::from_secs(10);
    tokio::time::timeout(within, syncs.wait_for(|n| *n >= 1))
        .await
        .expect("first sync in time")
        .expect("loop alive");

    std::fs::write(host.path("artifacts/libvgpu.so"), b"\x7fELF version two").expect("lib");
    let installed = host.path("host/usr/local/vgpu/libvgpu.so");
    while std::fs::read(&installed).expect("installed") != b"\x7fELF version two" {
        tokio::time::timeout(within, syncs.changed())
            .await
            .expect("a sync follows the change")
            .expect("loop alive");
    }
    let after_update = *syncs.borrow();

    // Nothing changes for a second: a confirming re-sync per burst of our
    // own writes may come (at most one per file installed, when an fsync
    // splits them), nothing driven by reading the files (a loop did ~20).
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let idle = *syncs.borrow() - after_update;
    assert!(idle <= 2, "{idle} syncs while nothing changed");

    shutdown.cancel();
    running.wait().await.expect("clean stop");
}

/// A link planted where libsync makes a world-writable directory (the lock
/// directory, `containers/`) would have made its target mode 1777 (with
/// every sharing pod mounting it read-write). It is refused, not followed.
#[test]
fn a_link_where_a_world_writable_directory_belongs_is_refused_and_its_target_untouched() {
    for name in ["vgpulock", "containers"] {
        let host = Host::new();
        let target = host.path("etc");
        std::fs::create_dir(&target).expect("mkdir");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let link = host.path("host/usr/local/vgpu").join(name);
        std::os::unix::fs::symlink(&target, &link).expect("symlink");

        let error = libsync::sync_once(&host.config()).expect_err("must refuse the link");
        assert!(
            matches!(error, InstallError::Symlink { .. }),
            "{name}: {error:?}"
        );
        assert!(error.to_string().contains(name), "{error}");
        assert_eq!(
            mode(&target),
            0o755,
            "{name}: the link's target was changed"
        );
        assert!(
            std::fs::symlink_metadata(&link)
                .expect("stat")
                .file_type()
                .is_symlink(),
            "left for a person to look at"
        );
    }
}

#[test]
fn a_file_where_the_lock_directory_belongs_is_refused() {
    let host = Host::new();
    std::fs::write(host.path("host/usr/local/vgpu/vgpulock"), b"").expect("file");
    let error = libsync::sync_once(&host.config()).expect_err("must fail");
    assert!(
        matches!(error, InstallError::NotADirectory { .. }),
        "{error:?}"
    );
}

/// A directory someone else made (another uid than root or libsync's) is
/// not made world-writable. Needs root to hand a directory to another uid;
/// elsewhere there is no one else to be, and the test returns early.
#[test]
fn a_directory_owned_by_another_user_is_left_alone() {
    let host = Host::new();
    let lock = host.path("host/usr/local/vgpu/vgpulock");
    std::fs::create_dir(&lock).expect("mkdir");
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    if let Err(error) = std::os::unix::fs::chown(&lock, Some(54_321), None) {
        eprintln!("not root ({error}): nothing to check here");
        return;
    }
    let error = libsync::sync_once(&host.config()).expect_err("must refuse");
    assert!(
        matches!(error, InstallError::ForeignOwner { owner: 54_321, .. }),
        "{error:?}"
    );
    assert_eq!(mode(&lock), 0o755);
}
