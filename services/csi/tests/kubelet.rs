//! The plugin driven over its real sockets as kubelet drives it: publish
//! inline volumes for two pods of different users into kubelet-like target
//! directories, look at what each pod would see, unpublish.
//!
//! Mounting needs root (CAP_SYS_ADMIN), as the plugin's container has on a
//! node; `.ci/run` runs as root. Elsewhere these tests fail and say so, or
//! with `KAI_CSI_MOUNT_TESTS=skip` are skipped with a line on stderr.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use kai_csi::pb::csi;
use kai_csi::pb::csi::node_client::NodeClient;
use kai_csi::pb::registration;
use kai_csi::request::{
    ATTR_CONTAINER, ATTR_RUN_AS_GROUP, ATTR_RUN_AS_USER, CTX_EPHEMERAL, CTX_POD_NAME,
    CTX_POD_NAMESPACE, CTX_POD_UID,
};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;

const LIBRARY: &[u8] = b"stand-in for libvgpu.so\n";
const PRELOAD: &[u8] = b"/usr/local/vgpu/libvgpu.so\n";
const UID_A: &str = "0a0a0a0a-0000-4000-8000-00000000000a";
const UID_B: &str = "0b0b0b0b-0000-4000-8000-00000000000b";

/// Whether this process may mount; `None` means skip (asked for).
fn may_mount() -> Option<()> {
    if rustix::process::geteuid().is_root() {
        return Some(());
    }
    if std::env::var("KAI_CSI_MOUNT_TESTS").as_deref() == Ok("skip") {
        eprintln!("SKIPPED: kai-csi mount tests need root (KAI_CSI_MOUNT_TESTS=skip)");
        return None;
    }
    panic!(
        "kai-csi's mount tests need root (CAP_SYS_ADMIN) to mount, as the plugin has on a node: run them as root (.ci/run does), or set KAI_CSI_MOUNT_TESTS=skip to skip them"
    );
}

/// A node: the host install directory, kubelet's pods directory and the
/// plugin serving on a socket. Unmounts whatever is left when dropped, so
/// a failed assertion leaves no mount behind on the machine.
struct Node {
    dir: tempfile::TempDir,
    shutdown: CancellationToken,
    running: Option<kai_csi::Running>,
}

impl Node {
    async fn start(install: bool, registration: bool) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = dir.path().join("host/vgpu");
        std::fs::create_dir_all(host.join("containers")).expect("host dirs");
        if install {
            std::fs::write(host.join("libvgpu.so"), LIBRARY).expect("library");
            std::fs::write(host.join("ld.so.preload"), PRELOAD).expect("preload");
        }
        std::fs::create_dir_all(dir.path().join("kubelet/pods")).expect("pods dir");
        let args = kai_csi::Args {
            endpoint: format!("unix://{}", dir.path().join("plugin/csi.sock").display()),
            node_id: "gpu-node-1".into(),
            driver: kai_csi::DRIVER.into(),
            host_vgpu_dir: host,
            target_root: dir.path().join("kubelet/pods"),
            registration_dir: registration.then(|| dir.path().join("kubelet/plugins_registry")),
            kubelet_endpoint: "/var/lib/kubelet/plugins/vgpu.kai-resource-isolator.io/csi.sock"
                .into(),
            health_listen: "127.0.0.1:0".parse().expect("addr"),
        };
        let shutdown = CancellationToken::new();
        let running = kai_csi::start(&args, shutdown.clone())
            .await
            .expect("plugin starts");
        Self {
            dir,
            shutdown,
            running: Some(running),
        }
    }

    fn host(&self) -> PathBuf {
        self.dir.path().join("host/vgpu")
    }

    fn running(&self) -> &kai_csi::Running {
        self.running.as_ref().expect("running")
    }

    /// The target kubelet passes for a pod's inline volume; kubelet makes
    /// its parent.
    fn target(&self, pod_uid: &str) -> PathBuf {
        let parent = self.dir.path().join(format!(
            "kubelet/pods/{pod_uid}/volumes/kubernetes.io~csi/kai-resource-isolator-vgpu"
        ));
        std::fs::create_dir_all(&parent).expect("kubelet's volume dir");
        parent.join("mount")
    }

    async fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(channel(&self.running().csi_socket).await)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown.cancel();
        let pods = self.dir.path().join("kubelet/pods");
        if let Ok(points) = kai_csi::mounts::mounted_under(&pods) {
            for p in points.iter().rev() {
                let _ = rustix::mount::unmount(p, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

async fn channel(socket: &Path) -> Channel {
    kai_csi::connect(socket)
        .await
        .expect("connect to the plugin's socket")
}

/// What kubelet sends for a pod's inline volume (podInfoOnMount), with the
/// webhook's attributes.
fn publish_request(
    target: &Path,
    pod_uid: &str,
    run_as: Option<(u32, u32)>,
    fs_group: Option<u32>,
) -> csi::NodePublishVolumeRequest {
    let mut ctx: HashMap<String, String> = [
        (CTX_EPHEMERAL, "true".to_owned()),
        (CTX_POD_UID, pod_uid.to_owned()),
        (CTX_POD_NAME, "trainer-0".to_owned()),
        (CTX_POD_NAMESPACE, "team-a".to_owned()),
        (
            "csi.storage.k8s.io/serviceAccount.name",
            "default".to_owned(),
        ),
        (ATTR_CONTAINER, "trainer".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if let Some((uid, gid)) = run_as {
        ctx.insert(ATTR_RUN_AS_USER.into(), uid.to_string());
        ctx.insert(ATTR_RUN_AS_GROUP.into(), gid.to_string());
    }
    csi::NodePublishVolumeRequest {
        volume_id: format!("csi-{}", &pod_uid[..8]),
        target_path: target.display().to_string(),
        volume_capability: Some(csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Mount(
                csi::volume_capability::MountVolume {
                    volume_mount_group: fs_group.map(|g| g.to_string()).unwrap_or_default(),
                    ..Default::default()
                },
            )),
            access_mode: Some(csi::volume_capability::AccessMode {
                mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter.into(),
            }),
        }),
        readonly: false,
        volume_context: ctx,
        ..Default::default()
    }
}

fn unpublish_request(target: &Path, pod_uid: &str) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: format!("csi-{}", &pod_uid[..8]),
        target_path: target.display().to_string(),
    }
}

/// Runs `sh -c script` as `uid`/`gid` (no supplementary groups); true when
/// it exits 0.
fn as_user(uid: u32, gid: u32, script: &str) -> bool {
    Command::new("sh")
        .args(["-c", script])
        .uid(uid)
        .gid(gid)
        .status()
        .expect("sh runs")
        .success()
}

fn is_read_only(err: &std::io::Error) -> bool {
    err.raw_os_error() == Some(rustix::io::Errno::ROFS.raw_os_error())
}

#[tokio::test]
async fn two_pods_each_get_the_library_read_only_and_only_their_own_region() {
    let Some(()) = may_mount() else { return };
    let node = Node::start(true, false).await;
    let mut client = node.node().await;
    let (ta, tb) = (node.target(UID_A), node.target(UID_B));
    // Pod A: runAsUser 1000, runAsGroup 1000, fsGroup 2000.
    client
        .node_publish_volume(publish_request(&ta, UID_A, Some((1000, 1000)), Some(2000)))
        .await
        .expect("publish A");
    // Pod B: runAsUser 1001, no group but runAsGroup 3000.
    client
        .node_publish_volume(publish_request(&tb, UID_B, Some((1001, 3000)), None))
        .await
        .expect("publish B");

    for (target, uid, gid, other) in [(&ta, UID_A, 2000, UID_B), (&tb, UID_B, 3000, UID_A)] {
        let mine = format!("{uid}_trainer");
        // The library, read-only.
        assert_eq!(
            std::fs::read(target.join("libvgpu.so")).expect("library"),
            LIBRARY
        );
        assert_eq!(
            std::fs::read(target.join("ld.so.preload")).expect("preload"),
            PRELOAD
        );
        let err = std::fs::OpenOptions::new()
            .write(true)
            .open(target.join("libvgpu.so"))
            .expect_err("the library is writable");
        assert!(is_read_only(&err), "{err}");
        // The root: read-only, nothing to add.
        let err = std::fs::write(target.join("planted"), b"x").expect_err("root writable");
        assert!(is_read_only(&err), "{err}");
        let err = std::fs::create_dir(target.join(format!("containers/{other}_trainer")))
            .expect_err("another pod's directory can be made");
        assert!(is_read_only(&err), "{err}");
        // Only this pod's region directory is there.
        let names: Vec<_> = std::fs::read_dir(target.join("containers"))
            .expect("containers")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        assert_eq!(names, std::slice::from_ref(&mine));
        // On the host it is owned by the pod, group-writable, setgid.
        let host_dir = node.host().join("containers").join(&mine);
        let meta = std::fs::metadata(&host_dir).expect("host region dir");
        assert_eq!((meta.uid(), meta.gid()), (uid_of(uid), gid));
        assert_eq!(meta.permissions().mode() & 0o7777, 0o2775);
        // The lock directory is the pod's, not the host's.
        let lock = std::fs::metadata(target.join("vgpulock")).expect("lock dir");
        assert_eq!((lock.uid(), lock.gid()), (uid_of(uid), gid));
        assert_eq!(
            kai_csi::mounts::mounted_under(target)
                .expect("mountinfo")
                .len(),
            5,
            "root, two library files, the region, the lock directory"
        );
    }

    // As the pod's user (without root), the region directory and the lock
    // directory are writable, and what is written lands on the host.
    let region_a = ta.join(format!("containers/{UID_A}_trainer"));
    assert!(as_user(
        1000,
        2000,
        &format!(
            "echo usage > {0}/probe && echo lock > {1}/lock.0",
            region_a.display(),
            ta.join("vgpulock").display()
        )
    ));
    assert_eq!(
        std::fs::read(
            node.host()
                .join(format!("containers/{UID_A}_trainer/probe"))
        )
        .expect("written through the volume"),
        b"usage\n"
    );
    // Pod A's user cannot write pod B's directory even given its path.
    let host_b = node.host().join(format!("containers/{UID_B}_trainer"));
    assert!(!as_user(
        1000,
        2000,
        &format!("echo x > {}/probe", host_b.display())
    ));

    // A region libvgpu would write there is what the agent's reader finds
    // under the host's containers directory.
    kai_region::writer::RegionBuilder::v1()
        .device("GPU-0000", 4 << 30)
        .process(
            4242,
            vec![kai_region::writer::UsageSpec {
                data: 1 << 30,
                ..Default::default()
            }],
        )
        .write(&region_a.join("usage.cache"))
        .expect("region written through the volume");
    let found = kai_region::discovery::scan(&node.host().join("containers")).expect("scan");
    let a = found
        .iter()
        .find(|f| f.key.pod_uid == UID_A)
        .expect("the agent's discovery finds pod A");
    let snapshot = kai_region::Region::new(&a.cache())
        .snapshot()
        .expect("region decodes");
    assert_eq!(snapshot.devices.first().map(|d| d.limit), Some(4 << 30));

    // Unpublish: nothing mounted, the target gone, the region kept for the
    // agent (it cleans up after deleted pods); twice is fine.
    for _ in 0..2 {
        client
            .node_unpublish_volume(unpublish_request(&ta, UID_A))
            .await
            .expect("unpublish A");
    }
    assert!(
        kai_csi::mounts::mounted_under(&ta)
            .expect("mountinfo")
            .is_empty()
    );
    assert!(!ta.exists());
    assert!(
        node.host()
            .join(format!("containers/{UID_A}_trainer/usage.cache"))
            .exists()
    );
    // B is untouched by A's unpublish.
    assert_eq!(
        kai_csi::mounts::mounted_under(&tb)
            .expect("mountinfo")
            .len(),
        5
    );
    client
        .node_unpublish_volume(unpublish_request(&tb, UID_B))
        .await
        .expect("unpublish B");
    assert!(
        kai_csi::mounts::mounted_under(&node.dir.path().join("kubelet"))
            .expect("mountinfo")
            .is_empty()
    );
}

/// The uid the test gave each pod.
fn uid_of(pod_uid: &str) -> u32 {
    if pod_uid == UID_A { 1000 } else { 1001 }
}

#[tokio::test]
async fn a_repeated_publish_mounts_nothing_twice_and_a_partial_one_is_redone() {
    let Some(()) = may_mount() else { return };
    let node = Node::start(true, false).await;
    let mut client = node.node().await;
    let target = node.target(UID_A);
    let req = publish_request(&target, UID_A, None, None);
    for _ in 0..3 {
        client
            .node_publish_volume(req.clone())
            .await
            .expect("publish");
    }
    assert_eq!(
        kai_csi::mounts::mounted_under(&target)
            .expect("mountinfo")
            .len(),
        5
    );
    // Neither user nor group known: the directory is writable by all (only
    // this pod reaches it).
    let dir = node.host().join(format!("containers/{UID_A}_trainer"));
    assert_eq!(
        std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o7777,
        0o777
    );
    // A plugin that stopped half-way: the lock directory never mounted.
    rustix::mount::unmount(
        target.join("vgpulock"),
        rustix::mount::UnmountFlags::empty(),
    )
    .expect("unmount the lock dir");
    client
        .node_publish_volume(req)
        .await
        .expect("publish again");
    assert_eq!(
        kai_csi::mounts::mounted_under(&target)
            .expect("mountinfo")
            .len(),
        5
    );
    client
        .node_unpublish_volume(unpublish_request(&target, UID_A))
        .await
        .expect("unpublish");
    assert!(
        kai_csi::mounts::mounted_under(&target)
            .expect("mountinfo")
            .is_empty()
    );
}

/// A tenant may declare inline volumes of the driver itself, any number of
/// them: past `MAX_VOLUMES_PER_POD` of one pod, publish refuses
/// (RESOURCE_EXHAUSTED), mounting nothing, while other pods and a repeat
/// of a published volume go on; an unpublish makes room again.
#[tokio::test]
async fn a_pods_volumes_of_the_driver_are_bounded() {
    let Some(()) = may_mount() else { return };
    let node = Node::start(true, false).await;
    let mut client = node.node().await;
    let max = kai_csi::mounts::MAX_VOLUMES_PER_POD;
    let target = |pod: &str, v: usize| {
        let parent = node.dir.path().join(format!(
            "kubelet/pods/{pod}/volumes/kubernetes.io~csi/vgpu-{v}"
        ));
        std::fs::create_dir_all(&parent).expect("kubelet's volume dir");
        parent.join("mount")
    };
    let request = |pod: &str, v: usize| {
        let mut req = publish_request(&target(pod, v), pod, None, None);
        req.volume_id = format!("csi-{}-{v}", &pod[..8]);
        req
    };
    for v in 0..max {
        client
            .node_publish_volume(request(UID_A, v))
            .await
            .expect("publish within the bound");
    }
    let refused = client
        .node_publish_volume(request(UID_A, max))
        .await
        .expect_err("one volume too many");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        kai_csi::mounts::mounted_under(&target(UID_A, max))
            .expect("mountinfo")
            .is_empty(),
        "nothing mounted for the refused one"
    );
    client
        .node_publish_volume(request(UID_A, 0))
        .await
        .expect("a repeat of a published volume is still answered");
    client
        .node_publish_volume(request(UID_B, 0))
        .await
        .expect("another pod is not affected");
    client
        .node_unpublish_volume(unpublish_request(&target(UID_A, 0), UID_A))
        .await
        .expect("unpublish");
    client
        .node_publish_volume(request(UID_A, max))
        .await
        .expect("room again after an unpublish");
}

#[tokio::test]
async fn a_link_planted_under_a_pods_name_is_refused_and_nothing_is_mounted() {
    let Some(()) = may_mount() else { return };
    let node = Node::start(true, false).await;
    let mut client = node.node().await;
    // A hostPath-mode tenant can write containers/: it plants a link where
    // the victim's region directory will be, pointing at its own.
    let elsewhere = node.dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("dir");
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::os::unix::fs::symlink(
        &elsewhere,
        node.host().join(format!("containers/{UID_A}_trainer")),
    )
    .expect("link");
    let target = node.target(UID_A);
    let err = client
        .node_publish_volume(publish_request(&target, UID_A, Some((1000, 1000)), None))
        .await
        .expect_err("published through a link");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("symbolic link"), "{}", err.message());
    assert!(
        kai_csi::mounts::mounted_under(&target)
            .expect("mountinfo")
            .is_empty()
    );
    // What the link named was not handed to the pod.
    let meta = std::fs::metadata(&elsewhere).expect("dir");
    assert_eq!((meta.uid(), meta.permissions().mode() & 0o7777), (0, 0o700));
}

#[tokio::test]
async fn before_libsync_ran_publish_is_unavailable_so_kubelet_retries() {
    let Some(()) = may_mount() else { return };
    let node = Node::start(false, false).await;
    let mut client = node.node().await;
    let target = node.target(UID_A);
    let err = client
        .node_publish_volume(publish_request(&target, UID_A, None, None))
        .await
        .expect_err("published without a library");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("libvgpu.so"), "{}", err.message());
    assert!(
        kai_csi::mounts::mounted_under(&target)
            .expect("mountinfo")
            .is_empty()
    );
    // libsync runs; kubelet's retry succeeds.
    std::fs::write(node.host().join("libvgpu.so"), LIBRARY).expect("library");
    std::fs::write(node.host().join("ld.so.preload"), PRELOAD).expect("preload");
    client
        .node_publish_volume(publish_request(&target, UID_A, None, None))
        .await
        .expect("publish after libsync");
    assert_eq!(
        std::fs::read(target.join("libvgpu.so")).expect("library"),
        LIBRARY
    );
}

#[tokio::test]
async fn requests_that_are_not_a_pods_inline_volume_are_invalid() {
    let Some(()) = may_mount() else { return };
    let node = Node::start(true, false).await;
    let mut client = node.node().await;
    let target = node.target(UID_A);
    let mut persistent = publish_request(&target, UID_A, None, None);
    persistent.volume_context.remove(CTX_EPHEMERAL);
    let mut outside = publish_request(&target, UID_A, None, None);
    outside.target_path = "/etc/kai-test-target".into();
    let mut traversal = publish_request(&target, UID_A, None, None);
    traversal
        .volume_context
        .insert(ATTR_CONTAINER.into(), "../../etc".into());
    for req in [persistent, outside, traversal] {
        let err = client.node_publish_volume(req).await.expect_err("accepted");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    }
    assert!(!Path::new("/etc/kai-test-target").exists());
    assert!(
        kai_csi::mounts::mounted_under(&node.dir.path().join("kubelet"))
            .expect("mountinfo")
            .is_empty()
    );
}

#[tokio::test]
async fn kubelet_registers_the_plugin_over_the_registration_socket() {
    // No mounts here, but the same harness.
    let node = Node::start(true, true).await;
    let socket = node
        .running()
        .registration_socket
        .clone()
        .expect("registration socket");
    assert_eq!(
        socket.file_name().and_then(|n| n.to_str()),
        Some("vgpu.kai-resource-isolator.io-reg.sock")
    );
    let health = node.running().health_addr;
    assert!(
        readyz(health).await.starts_with("HTTP/1.1 503"),
        "ready before kubelet registered it"
    );
    let mut reg =
        registration::registration_client::RegistrationClient::new(channel(&socket).await);
    let info = reg
        .get_info(registration::InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, kai_csi::DRIVER);
    assert_eq!(
        info.endpoint,
        "/var/lib/kubelet/plugins/vgpu.kai-resource-isolator.io/csi.sock"
    );
    assert_eq!(info.supported_versions, ["1.0.0"]);
    reg.notify_registration_status(registration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .expect("notify");
    assert!(readyz(health).await.starts_with("HTTP/1.1 200"));
    // And the identity kubelet then asks for.
    let mut identity =
        csi::identity_client::IdentityClient::new(channel(&node.running().csi_socket).await);
    let info = identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .expect("GetPluginInfo")
        .into_inner();
    assert_eq!(info.name, kai_csi::DRIVER);
    let caps = node
        .node()
        .await
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .expect("caps")
        .into_inner();
    assert_eq!(
        caps.capabilities.len(),
        1,
        "VOLUME_MOUNT_GROUP only: {caps:?}"
    );
}

/// `GET /readyz` over a plain socket; the status line and body. Off the
/// test's runtime thread, which also serves the probe.
async fn readyz(addr: std::net::SocketAddr) -> String {
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out
    })
    .await
    .expect("readyz")
}

// === Hostile requests (issue 38) ===
//
// A tenant reaches the plugin with volume attributes of its own: a second
// inline volume of the driver, which the webhook now denies, or one the
// webhook never saw (an excluded namespace, the webhook down under
// `failurePolicy: Ignore`). Whatever the request says, the plugin answers
// with an error, never panics, leaves nothing mounted and hands no one a
// directory that is not theirs.

/// The mount points left at or under `target`.
fn mounted(target: &Path) -> Vec<PathBuf> {
    kai_csi::mounts::mounted_under(target).expect("mountinfo")
}

/// `4294967295` is `(uid_t)-1`, which chown(2) reads as "leave it
/// unchanged"; it used to panic in the uid conversion inside the publish,
/// past the point where the volume's root and both library binds were
/// mounted, and the error cleanup never ran. Every id field is refused
/// before anything is mounted, as are ids the API server itself refuses
/// (above 2147483647) and anything but a plain decimal.
#[tokio::test]
async fn an_id_chown_reads_as_unchanged_is_refused_and_nothing_stays_mounted() {
    let Some(()) = may_mount() else { return };
    let node = Node::start(true, false).await;
    let mut client = node.node().await;
    let target = node.target(UID_A);
    for (field, value) in [
        (ATTR_RUN_AS_USER, "4294967295"),
        (ATTR_RUN_AS_GROUP, "4294967295"),
        ("volume_mount_group", "4294967295"),
        (ATTR_RUN_AS_USER, "2147483648"),
        (ATTR_RUN_AS_USER, "-1"),
        (ATTR_RUN_AS_USER, "+1000"),
        (ATTR_RUN_AS_GROUP, "01000"),
    ] {
        let mut req = publish_request(&target, UID_A, None, None);
        if field == "volume_mount_group" {
            if let Some(csi::volume_capability::AccessType::Mount(m)) = req
                .volume_capability
                .as_mut()
                .and_then(|c| c.access_type.as_mut())
            {
                m.volume_mount_group = value.into();
            }
        } else {
            req.volume_context.insert(field.into(), value.into());
        }
        let err = client
            .node_publish_volume(req)
            .await
            .expect_err("published with an id chown cannot take");
        assert!(
            mounted(&target).is_empty(),
            "{field}={value}: mounts left: {:?}",
            mounted(&target)
        );
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{field}={value}: {err:?}"
        );
        assert!(err.message().contains(value), "{field}: {}", err.message());
        assert!(
            !node
                .host()
                .join(format!("containers/{UID_A}_trainer"))
                .exists(),
            "{field}={value}: a region directory was made"
        );
    }
    // The largest id the API server accepts still publishes.
    client
        .node_publish_volume(publish_request(
            &target,
            UID_A,
            Some((2_147_483_647, 2_147_483_647)),
            None,
        ))
        .await
        .expect("publish with the largest valid ids");
    let meta = std::fs::metadata(node.host().join(format!("containers/{UID_A}_trainer")))
        .expect("region dir");
    assert_eq!((meta.uid(), meta.gid()), (2_147_483_647, 2_147_483_647));
}

/// Kubelet publishes a pod's inline volume under that pod's own directory,
/// `<pods>/<pod uid>/volumes/kubernetes.io~csi/<volume>/mount`. A request
/// naming another pod's UID than its target's (pod A's UID at pod B's
/// target) used to bind A's region directory into B's volume and chown it
/// to B's user: refused, and A's directory is left as it was.
#[tokio::test]
async fn a_pod_uid_that_is_not_the_targets_pod_is_refused() {
    let Some(()) = may_mount() else { return };
    let node = Node::start(true, false).await;
    let mut client = node.node().await;
    let (ta, tb) = (node.target(UID_A), node.target(UID_B));
    client
        .node_publish_volume(publish_request(&ta, UID_A, Some((1000, 1000)), Some(2000)))
        .await
        .expect("publish A");
    let err = client
        .node_publish_volume(publish_request(&tb, UID_A, Some((0, 0)), None))
        .await
        .expect_err("A's UID published at B's target");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains(UID_A), "{}", err.message());
    assert!(mounted(&tb).is_empty(), "B's target: {:?}", mounted(&tb));
    let meta = std::fs::metadata(node.host().join(format!("containers/{UID_A}_trainer")))
        .expect("A's region dir");
    assert_eq!((meta.uid(), meta.gid()), (1000, 2000));
    // A target that is not at kubelet's depth under a pod's directory
    // (the pod's directory itself, or deeper) is not a volume's either.
    for bad in [
        node.dir.path().join(format!("kubelet/pods/{UID_A}/mount")),
        ta.join("nested/mount"),
    ] {
        let err = client
            .node_publish_volume(publish_request(&bad, UID_A, None, None))
            .await
            .expect_err("published off kubelet's layout");
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}: {err:?}");
    }
}

/// A second volume of the driver for the same container, with run-as 0,
/// used to chown the pod's own region directory to root (0755): libvgpu,
/// running as the pod's user, could then not create its region, and the
/// node agent saw nothing. A region directory that exists is kept only when
/// it is already what this publish would make it.
#[tokio::test]
async fn an_extra_volume_cannot_take_the_pods_region_directory_from_its_user() {
    let Some(()) = may_mount() else { return };
    let node = Node::start(true, false).await;
    let mut client = node.node().await;
    let first = node.target(UID_A);
    client
        .node_publish_volume(publish_request(
            &first,
            UID_A,
            Some((1000, 1000)),
            Some(2000),
        ))
        .await
        .expect("the webhook's volume");
    let parent = node.dir.path().join(format!(
        "kubelet/pods/{UID_A}/volumes/kubernetes.io~csi/extra"
    ));
    std::fs::create_dir_all(&parent).expect("kubelet's volume dir");
    let extra = parent.join("mount");
    let mut req = publish_request(&extra, UID_A, Some((0, 0)), None);
    req.volume_id = "csi-extra".into();
    let err = client
        .node_publish_volume(req)
        .await
        .expect_err("the extra volume took the region directory");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(mounted(&extra).is_empty(), "{:?}", mounted(&extra));
    let dir = node.host().join(format!("containers/{UID_A}_trainer"));
    let meta = std::fs::metadata(&dir).expect("region dir");
    assert_eq!(
        (meta.uid(), meta.gid(), meta.permissions().mode() & 0o7777),
        (1000, 2000, 0o2775)
    );
    // The same owner again (kubelet republishing after a node restart, or
    // a second volume that asks for nothing else) keeps the directory and
    // what libvgpu wrote in it.
    std::fs::write(dir.join("usage.cache"), b"region").expect("a region");
    client
        .node_unpublish_volume(unpublish_request(&first, UID_A))
        .await
        .expect("unpublish");
    client
        .node_publish_volume(publish_request(
            &first,
            UID_A,
            Some((1000, 1000)),
            Some(2000),
        ))
        .await
        .expect("republished with the same owner");
    assert_eq!(
        std::fs::read(first.join(format!("containers/{UID_A}_trainer/usage.cache"))).expect("kept"),
        b"region"
    );
}

/// A directory someone else made under this pod's name before the pod's
/// first publish (a hostPath-mode pod can write `containers/`), with its
/// own files in it, used to be handed to the pod, contents, group and all:
/// refused, and left as it was.
#[tokio::test]
async fn a_region_directory_someone_else_made_is_not_taken_over() {
    let Some(()) = may_mount() else { return };
    let node = Node::start(true, false).await;
    let mut client = node.node().await;
    let dir = node.host().join(format!("containers/{UID_A}_trainer"));
    std::fs::create_dir(&dir).expect("planted dir");
    std::fs::write(dir.join("usage.cache"), b"planted").expect("planted file");
    std::os::unix::fs::chown(&dir, Some(666), Some(666)).expect("chown");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o2777)).expect("chmod");
    let target = node.target(UID_A);
    let err = client
        .node_publish_volume(publish_request(
            &target,
            UID_A,
            Some((1000, 1000)),
            Some(2000),
        ))
        .await
        .expect_err("a planted directory was taken over");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("666"), "{}", err.message());
    assert!(mounted(&target).is_empty(), "{:?}", mounted(&target));
    let meta = std::fs::metadata(&dir).expect("dir");
    assert_eq!(
        (meta.uid(), meta.gid(), meta.permissions().mode() & 0o7777),
        (666, 666, 0o2777)
    );
    // A directory of the plugin's own (root's) that holds nothing, as a
    // publish that stopped between mkdir and chown leaves it, is taken.
    let other = node.host().join(format!("containers/{UID_B}_trainer"));
    std::fs::create_dir(&other).expect("half-made dir");
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    client
        .node_publish_volume(publish_request(
            &node.target(UID_B),
            UID_B,
            Some((1001, 3000)),
            None,
        ))
        .await
        .expect("a half-made directory of ours is finished");
    let meta = std::fs::metadata(&other).expect("dir");
    assert_eq!(
        (meta.uid(), meta.gid(), meta.permissions().mode() & 0o7777),
        (1001, 3000, 0o2775)
    );
}
