//! One DRA share held by several containers (docs/isolation.md, "DRA
//! claims"). A ResourceClaim made once and named by `resourceClaimName` in
//! two pods (`status.reservedFor` lists both) gives both the same
//! allocation: each holder's libvgpu gets the whole slice as its cap (the
//! webhook writes the claim's request, the node-decided ConfigMap the
//! allocation's), so each alone is `capped` while together they may take
//! up to twice the slice they share. Only the containers of one assessment
//! side by side show it, so it is judged here, after every container's own
//! verdict.
//!
//! Containers of one pod holding one share at once split the slice evenly
//! (each capped at `consumed / split`), so their caps sum to the slice at
//! most; a sum above it means one raised its cap, `above_grant` on its own
//! grant check, and its siblings within their parts stay `capped`. With
//! holders of two pods or more, every capped holder is warned.
//!
//! A warning, no eviction of its own: when the slice runs out, which
//! holder took another's part cannot be told from the regions or NVML, so
//! each holder is still evicted only on its own evidence above its own
//! grant (module `trust`), which this leaves as it was.

use std::collections::{BTreeMap, BTreeSet};

use kai_proto::v1::IsolationState;

use super::grant::{mib_text, share_text};
use crate::agent::model::{ContainerView, DraShare};

/// One container's verdict: state, reason, NVML's evidence.
pub(super) type Verdict = (IsolationState, String, Option<String>);

/// What names one share whoever holds it: the claim (namespace, name) and
/// the device with its `shareID` (`None`: the device allocated whole, one
/// claim's alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ShareKey<'a> {
    namespace: &'a str,
    claim: &'a str,
    driver: &'a str,
    pool: &'a str,
    device: &'a str,
    share_id: Option<&'a str>,
}

/// One container's region cap on one device, and the shares of its claims
/// on that device.
struct Seat<'a> {
    view: usize,
    /// The device's UUID as the region spells it.
    uuid: &'a str,
    cap: u64,
    shares: Vec<(ShareKey<'a>, &'a DraShare)>,
}

/// Calls `above_grant` every `capped` holder of a share whose holders'
/// caps on its device sum to more than the share consumed. `verdicts[i]`
/// is `views[i]`'s own verdict; any other state is left as it is (forged,
/// over the cap, above its own grant, uncapped: each says more about its
/// container than the sum does).
///
/// Holders are grouped per device: containers whose shares there have one
/// in common are one group, and the group's grant is the sum of the
/// distinct shares its members hold there (one share, in practice; a
/// container with two shares of one device has one cap for both). Shares
/// of one device under distinct `shareID`s, held by distinct containers,
/// are distinct grants and never summed: the scheduler fits them into the
/// device, and each holder is held to its own.
///
/// Not counted: a forged region (its figures are someone else's claim), a
/// device without a cap (its `uncapped_no_limit` is reported on its own
/// container, evicted on NVML's word), a region without devices yet, and
/// a share whose `consumedCapacity` is not known (no grant can be told, as
/// for one holder).
pub(super) fn judge(views: &[ContainerView], verdicts: &mut [Verdict]) {
    // UUIDs compare without regard to case (module `grant`).
    let mut by_device: BTreeMap<String, Vec<Seat<'_>>> = BTreeMap::new();
    for (i, (view, verdict)) in views.iter().zip(verdicts.iter()).enumerate() {
        if verdict.0 == IsolationState::Forged {
            continue;
        }
        let Some(pod) = &view.pod else { continue };
        let Some(shares) = view.dra_shares() else {
            continue;
        };
        for d in view.snapshot.devices.iter().filter(|d| d.limit > 0) {
            let here: Vec<(ShareKey<'_>, &DraShare)> = shares
                .iter()
                .filter(|s| s.is_on(&d.uuid))
                .map(|s| (key(&pod.namespace, s), s))
                .collect();
            if here.is_empty() {
                continue; // the allocation gave nothing here: `grant::dra`'s case
            }
            by_device
                .entry(d.uuid.to_ascii_lowercase())
                .or_default()
                .push(Seat {
                    view: i,
                    uuid: &d.uuid,
                    cap: d.limit,
                    shares: here,
                });
        }
    }
    for seats in by_device.values() {
        for group in groups(seats) {
            judge_group(views, verdicts, seats, &group);
        }
    }
}

fn key<'a>(namespace: &'a str, share: &'a DraShare) -> ShareKey<'a> {
    ShareKey {
        namespace,
        claim: &share.claim,
        driver: &share.driver,
        pool: &share.pool,
        device: &share.device,
        share_id: share.share_id.as_deref(),
    }
}

/// The seats of one device, grouped: two seats with a share in common are
/// in one group (and so, transitively, are their groups). Each group's
/// seats in the order of `seats`; groups by their first seat.
fn groups(seats: &[Seat<'_>]) -> Vec<Vec<usize>> {
    let mut group_of: Vec<usize> = (0..seats.len()).collect();
    for a in 0..seats.len() {
        for b in a + 1..seats.len() {
            let common = seats[a]
                .shares
                .iter()
                .any(|(k, _)| seats[b].shares.iter().any(|(l, _)| k == l));
            let (from, to) = (group_of[b], group_of[a]);
            if common && from != to {
                for g in group_of.iter_mut().filter(|g| **g == from) {
                    *g = to;
                }
            }
        }
    }
    let mut out: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (seat, group) in group_of.into_iter().enumerate() {
        out.entry(group).or_default().push(seat);
    }
    out.into_values().collect()
}

fn judge_group(
    views: &[ContainerView],
    verdicts: &mut [Verdict],
    seats: &[Seat<'_>],
    group: &[usize],
) {
    let holders: BTreeSet<usize> = group.iter().map(|&s| seats[s].view).collect();
    if holders.len() < 2 {
        return;
    }
    // Holders of one pod only: the slice is split between those that run
    // at once (counted per ResourceClaim, kai_dra::at_once), each held to
    // its part by its own grant check, so a sum above the slice is the one
    // above its part (`above_grant` on its own); the others, within theirs,
    // did nothing to be warned of. Holders that never run together (a plain
    // init container and the containers after it) have the whole slice in
    // turn, and their regions' caps add up to more without any excess.
    let pods: BTreeSet<&str> = holders
        .iter()
        .map(|&v| views[v].key.pod_uid.as_str())
        .collect();
    if pods.len() < 2 {
        return;
    }
    let mut shares: BTreeMap<ShareKey<'_>, &DraShare> = BTreeMap::new();
    for &s in group {
        for (k, share) in &seats[s].shares {
            shares.entry(*k).or_insert(share);
        }
    }
    let mut granted: u64 = 0;
    for share in shares.values() {
        let Some(consumed) = share.consumed_bytes else {
            return;
        };
        granted = granted.saturating_add(consumed);
    }
    let sum = group
        .iter()
        .fold(0_u64, |sum, &s| sum.saturating_add(seats[s].cap));
    if sum <= granted {
        return;
    }
    let basis: Vec<String> = shares
        .iter()
        .map(|(k, share)| share_text(k.namespace, share))
        .collect();
    let basis = basis.join("; ");
    for &s in group {
        let seat = &seats[s];
        let verdict = &mut verdicts[seat.view];
        if verdict.0 != IsolationState::Capped {
            continue;
        }
        let others: Vec<String> = group
            .iter()
            .filter(|&&o| seats[o].view != seat.view)
            .map(|&o| {
                let other = &views[seats[o].view];
                format!(
                    "{}/{}/{} (cap {})",
                    other.namespace(),
                    other.pod_name(),
                    other.key.container,
                    mib_text(seats[o].cap)
                )
            })
            .collect();
        // The evidence stays the container's own: a `capped` container's
        // NVML figure is within its own grant, or it would be over its cap.
        verdict.0 = IsolationState::AboveGrant;
        verdict.1 = format!(
            "the cap on {} is {}, and the DRA share it sits on is held on this node by {} too: the holders' caps there sum to {}, above the grant of {} they share ({basis}), so together they may take more than the slice; reported, never evicted on this alone (which holder took another's part cannot be told)",
            seat.uuid,
            mib_text(seat.cap),
            others.join(", "),
            mib_text(sum),
            mib_text(granted),
        );
    }
}
