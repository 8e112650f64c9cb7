//! NodePublishVolume bytes, as kai-csi's gRPC server decodes them, through
//! the request check and the mount plan (no mount is made): never a panic,
//! a refusal says why, and whatever is accepted is a plan that stays in the
//! target and the host's `containers/` directory, for the pod whose
//! directory the target is in, with ids chown(2) takes as they are (issue
//! 38: 4294967295 in a volume attribute once panicked a publish half-way).
#![no_main]

use std::path::{Component, Path};

use kai_csi::pb::csi::NodePublishVolumeRequest;
use kai_csi::plan::{self, LIBRARY_FILES, Step};
use kai_csi::request::{Id, Publish, target_pod};
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// kubelet's pods directory and the host install directory, as the chart
/// passes them.
const ROOT: &str = "/var/lib/kubelet/pods";
const HOST: &str = "/host/vgpu";

/// A path relative to the target: plain names only.
fn is_relative_and_plain(rel: &Path) -> bool {
    rel.components().all(|c| matches!(c, Component::Normal(_)))
}

fuzz_target!(|data: &[u8]| {
    let Ok(req) = NodePublishVolumeRequest::decode(data) else {
        return;
    };
    let publish = match Publish::from_request(&req, Path::new(ROOT)) {
        Ok(publish) => publish,
        Err(invalid) => {
            assert!(!invalid.to_string().is_empty(), "a refusal says why");
            return;
        }
    };
    // The pod is the one whose directory kubelet publishes into.
    assert_eq!(
        target_pod(&publish.target, Path::new(ROOT)),
        Some(publish.pod_uid.as_str())
    );
    assert_eq!(publish.target.to_str(), Some(req.target_path.as_str()));
    for id in [publish.owner.uid, publish.owner.gid].into_iter().flatten() {
        assert!(id.get() <= Id::MAX, "{id} passed the check");
    }
    let region = publish.region_dir();
    assert!(
        !region.contains('/') && region != "." && region != "..",
        "{region:?} is not one name"
    );

    let host = Path::new(HOST);
    let steps = plan::publish(&publish, host);
    assert!(matches!(steps.first(), Some(Step::Root { .. })));
    assert_eq!(steps.last(), Some(&Step::Seal));
    for step in &steps {
        match step {
            Step::Root { options } => assert!(!options.contains('\0')),
            Step::Dir { rel } => assert!(is_relative_and_plain(rel), "{rel:?}"),
            Step::Library { name, source } => {
                assert!(LIBRARY_FILES.contains(name));
                assert_eq!(source, &host.join(name));
            }
            Step::Region {
                host_containers,
                name,
                rel,
                owner,
                ..
            } => {
                assert_eq!(host_containers, &host.join(plan::CONTAINERS));
                assert_eq!(name, &region);
                assert!(is_relative_and_plain(rel), "{rel:?}");
                assert_eq!(owner, &publish.owner);
            }
            Step::Lock { rel, options, .. } => {
                assert!(is_relative_and_plain(rel), "{rel:?}");
                // Only our own tmpfs options: an id cannot smuggle another.
                for option in options.split(',') {
                    let (key, value) = option.split_once('=').expect("key=value");
                    assert!(
                        ["size", "nr_inodes", "mode", "uid", "gid"].contains(&key),
                        "{options}"
                    );
                    assert!(
                        value.bytes().all(|b| b.is_ascii_alphanumeric()),
                        "{options}"
                    );
                }
            }
            Step::Seal => {}
        }
    }
    let points = plan::mount_points(&publish);
    assert!(
        points.iter().all(|p| is_relative_and_plain(p)),
        "{points:?}"
    );
});
