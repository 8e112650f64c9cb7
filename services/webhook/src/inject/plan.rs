//! [`plan`]: what a Pod needs, compared with what it already has. Each
//! step either hands the next what it found or ends the plan with its
//! decision; the last one lists the operations of the patch, in the order
//! they apply.

use std::cmp::Reverse;

use k8s_openapi::api::core::v1::{Volume, VolumeMount};

use super::ask::{Ask, OptOut, asks_to_opt_out, sm_percent};
use super::defences;
use super::denial::Denial;
use super::dra::{self, Claims, MemoryLimit};
use super::env::{EnvRead, Wanted, kai_config_map};
use super::items::{Layout, Slot, Source, csi_attributes, layout};
use super::patch::{Op, Part, Patch};
use super::target;
use super::vars::{Limit, LimitValue, Masked, OurEnv, PerLimit};
use super::{Decision, Target, VOLUME_VGPU};
use crate::config::{InjectConfig, TenantEnv};
use crate::pod::{Container, Pod, RunAs};

/// Plans the mutation of `pod` under `cfg`, with no DRA claim looked up
/// (what [`plan_with`] does for a pod that names none, or with DRA off).
pub fn plan(pod: &Pod, cfg: &InjectConfig, opt_out: OptOut) -> Decision {
    plan_with(pod, cfg, opt_out, &Claims::default())
}

/// Plans the mutation of `pod` under `cfg`, given what the review found of
/// the claims [`super::claims_to_look_up`] listed.
pub fn plan_with(pod: &Pod, cfg: &InjectConfig, opt_out: OptOut, claims: &Claims) -> Decision {
    match steps(pod, cfg, opt_out, claims) {
        Ok(decision) | Err(decision) => decision,
    }
}

/// The steps of [`plan`]; `Err` is a decision that ends it early.
fn steps(
    pod: &Pod,
    cfg: &InjectConfig,
    opt_out: OptOut,
    claims: &Claims,
) -> Result<Decision, Decision> {
    // 1-2. What the pod asks for (or not a sharing pod at all), and the
    // containers that get libvgpu.
    let chosen = choose(pod, cfg, opt_out, claims)?;
    let spec = pod.spec.as_ref().ok_or(Decision::NoContainers)?;
    let layout = layout(cfg.delivery);
    let slots = chosen.len();
    // 3-5. For each target, in order: what the pod may not declare, its
    // env, its part of the patch.
    let parts = chosen
        .into_iter()
        .enumerate()
        .map(|(slot, chosen)| part(pod, spec, cfg, layout, (Slot(slot), slots), chosen))
        .collect::<Result<Vec<_>, _>>()?;
    let target = parts
        .first()
        .map(|part| part.target.clone())
        .ok_or(Decision::NoContainers)?;
    let patch = Patch::new(parts);
    Ok(if patch.is_empty() {
        Decision::AlreadyInjected { target }
    } else {
        Decision::Inject { target, patch }
    })
}

/// Steps 1-2: the targets, the first first, and their limits: each
/// container a DRA claim gives GPU memory, else the KAI annotations' one.
fn choose<'a>(
    pod: &'a Pod,
    cfg: &InjectConfig,
    opt_out: OptOut,
    claims: &'a Claims,
) -> Result<Vec<Chosen<'a>>, Decision> {
    let Some(gpu) = dra::read(pod, cfg, claims)? else {
        let ask = Ask::read(pod, cfg, opt_out)?;
        let spec = pod.spec.as_ref().ok_or(Decision::NoContainers)?;
        let (target, container) = target::find(pod, spec)?;
        return Ok(vec![Chosen {
            kai_config_map: kai_config_map(pod, &target),
            target,
            container,
            memory: ask
                .memory_mib
                .map(|mib| LimitValue::Literal(format!("{mib}m"))),
            sm_percent: ask.sm_percent,
            annotate: None,
        }]);
    };
    if opt_out == OptOut::Honoured && asks_to_opt_out(pod) {
        return Err(Decision::OptedOut);
    }
    let each = gpu.each()?;
    // One limits ConfigMap for the pod, a key per container, when any
    // container's limit is decided on the node.
    let config_map = each
        .iter()
        .find(|gpu| gpu.limit == MemoryLimit::NodeDecided)
        .map(|gpu| dra::limits_config_map(pod, &gpu.target.name, claims.suffix()))
        .transpose()?;
    let sm_percent = sm_percent(pod)?;
    let mut annotate = config_map
        .as_ref()
        .and_then(|map| map.annotate.then(|| map.name.clone()));
    Ok(each
        .into_iter()
        .map(|gpu| {
            // The claim's memory is the only cap, so it is written whatever
            // `--memory-limit-fallback` says. No KAI reference is ours to
            // keep: KAI does not share this GPU, so an entry that looks
            // like KAI's is the tenant's.
            let memory = match (gpu.limit, &config_map) {
                (MemoryLimit::Stated { mib }, _) => LimitValue::Literal(format!("{mib}m")),
                (MemoryLimit::NodeDecided, Some(map)) => LimitValue::ConfigMapKey {
                    config_map: map.name.clone(),
                    key: gpu.target.name.clone(),
                },
                // `config_map` is Some whenever a limit is node-decided;
                // the literal of nothing would never pass the agent's check.
                (MemoryLimit::NodeDecided, None) => LimitValue::Literal(String::new()),
            };
            Chosen {
                target: gpu.target,
                container: gpu.container,
                memory: Some(memory),
                sm_percent,
                kai_config_map: None,
                // The pod's annotation, with the first target's part.
                annotate: annotate.take(),
            }
        })
        .collect())
}

/// Steps 3-5 for one target: what the pod may not declare, the target's
/// env, and its part of the patch.
fn part(
    pod: &Pod,
    spec: &crate::pod::Spec,
    cfg: &InjectConfig,
    layout: &'static Layout,
    (slot, slots): (Slot, usize),
    chosen: Chosen<'_>,
) -> Result<Part, Decision> {
    let Chosen {
        target,
        container,
        memory,
        sm_percent,
        kai_config_map,
        annotate,
    } = chosen;
    // 3. What the pod may not declare.
    let run_as = container.effective_run_as(spec.security_context.as_ref());
    defences::check(spec, container, (slot, slots), layout, cfg, run_as)?;
    // 4. The target's env: ours, KAI's, the tenant's.
    // `envFrom` (a ConfigMap or Secret whose keys we cannot see) may set
    // any of libvgpu's variables; an explicit `env` entry wins over it, so
    // with `envFrom` every variable we cannot leave to chance gets one.
    let env_from = container.env_from.as_ref().is_some_and(|e| !e.is_empty());
    let wanted = Wanted {
        target: &target,
        cfg,
        limits: our_limits(memory, sm_percent, env_from),
        kai_config_map,
    };
    let env = container
        .env
        .as_deref()
        .map(|env| EnvRead::scan(env, &wanted));
    if cfg.tenant_env == TenantEnv::Deny
        && let (Some(read), Some(entries)) = (&env, container.env.as_deref())
        && !read.tenant.is_empty()
    {
        return Err(Denial::TenantEnv {
            container: &container.name,
            names: read.tenant_names(entries),
        }
        .into());
    }
    // 5. The patch: what is missing, in the order it applies.
    let env = env.as_ref();
    let volumes = spec.volumes.as_deref();
    let tenant_env = env.into_iter().flat_map(|read| read.tenant.iter());
    let ops = tenant_env
        // The last first, so each index still points at its entry.
        .rev()
        .map(|&index| Op::RemoveTenantEnv { index })
        .chain(stale_csi_attributes(
            volumes,
            layout,
            slot,
            &container.name,
            run_as,
        ))
        .chain(missing_volumes(volumes, layout, slot))
        .chain(missing_mounts(
            container.volume_mounts.as_deref(),
            layout,
            slot,
            cfg,
        ))
        .chain(missing_env(env))
        .chain(env_from_masks(env_from, env))
        // After our env, so the list exists by then.
        .chain(limits(wanted.limits, env))
        .chain(annotate.map(|name| Op::AnnotateLimitsConfigMap {
            name,
            map_exists: pod.metadata.annotations.is_some(),
        }))
        .collect();
    Ok(Part {
        target,
        slot,
        run_as,
        ops,
    })
}

/// What steps 1-2 chose for one target: the container, and what its
/// limits are.
struct Chosen<'a> {
    target: Target,
    container: &'a Container,
    /// `CUDA_DEVICE_MEMORY_LIMIT`: `gpu-memory`'s or a stated claim's
    /// literal, or the node-decided limit's reference.
    memory: Option<LimitValue>,
    sm_percent: Option<u8>,
    /// The ConfigMap KAI's references read (KAI pods only).
    kai_config_map: Option<String>,
    /// The limits ConfigMap the pod is to be annotated with (the first
    /// target's part writes it).
    annotate: Option<String>,
}

/// Our value of each limit: `memory` (`<MiB>m` for `gpu-memory` or a
/// stated claim, or the node-decided limit's reference), the percentage of
/// `gpu-cores`, or (with `envFrom`) an empty literal that masks `envFrom`'s.
fn our_limits(
    memory: Option<LimitValue>,
    sm_percent: Option<u8>,
    env_from: bool,
) -> PerLimit<Option<LimitValue>> {
    let or_mask = |value: Option<LimitValue>| {
        value.or_else(|| env_from.then(|| LimitValue::Literal(String::new())))
    };
    PerLimit {
        memory: or_mask(memory),
        sm: or_mask(sm_percent.map(|percent| LimitValue::Literal(percent.to_string()))),
    }
}

/// Our CSI volume, when its attributes are not those of the target as it
/// is now. Under `reinvocationPolicy: IfNeeded` a later mutating webhook
/// that sets the user (a default `securityContext` policy) has the API
/// server call us again with our volume in place: its run-as attributes
/// are then rewritten, or the plugin would make the region directory the
/// old user's, one libvgpu, running as the new one, might not write. The
/// defences have checked that the volume is ours.
fn stale_csi_attributes(
    volumes: Option<&[Volume]>,
    layout: &Layout,
    slot: Slot,
    container: &str,
    run_as: RunAs,
) -> Option<Op> {
    if !layout.volumes.iter().any(|v| v.source == Source::Csi) {
        return None;
    }
    let want = csi_attributes(container, run_as);
    let name = layout.volume_name(VOLUME_VGPU, slot);
    let volume = volumes?.iter().position(|v| {
        v.name == name
            && v.csi
                .as_ref()
                .is_some_and(|csi| csi.volume_attributes.as_ref() != Some(&want))
    })?;
    Some(Op::RewriteCsiAttributes { volume })
}

/// Our volumes the pod lacks. Volumes compare by name: one of ours already
/// there is kept as it is (the defences checked its source). The first
/// target's part adds the layout's volumes (and the list, when the pod has
/// none); a later target's only a library volume of its own (CSI), to the
/// list the first made sure of: hostPath delivery's are everyone's.
fn missing_volumes(
    volumes: Option<&[Volume]>,
    layout: &'static Layout,
    slot: Slot,
) -> impl Iterator<Item = Op> {
    let (volumes, specs) = match slot {
        Slot(0) => (volumes, layout.volumes),
        _ if layout.per_target() => (Some(volumes.unwrap_or_default()), layout.volumes),
        _ => (Some(volumes.unwrap_or_default()), &[][..]),
    };
    missing(
        volumes,
        specs,
        Op::AddVolumes,
        Op::AppendVolume,
        move |have, spec| {
            let name = layout.volume_name(spec.name, slot);
            have.iter().any(|v| v.name == name)
        },
    )
}

/// Our mounts the target lacks (compared as [`super::MountSpec::is`]).
fn missing_mounts<'a>(
    mounts: Option<&'a [VolumeMount]>,
    layout: &'static Layout,
    slot: Slot,
    cfg: &'a InjectConfig,
) -> impl Iterator<Item = Op> + 'a {
    missing(
        mounts,
        layout.mounts,
        Op::AddMounts,
        Op::AppendMount,
        move |have, spec| {
            let volume = layout.volume_name(spec.volume, slot);
            have.iter().any(|m| spec.is(m, &volume, cfg))
        },
    )
}

/// Our env vars the target lacks (an entry of the name that is not
/// exactly ours is the tenant's, removed above).
fn missing_env(env: Option<&EnvRead>) -> impl Iterator<Item = Op> {
    missing(
        env,
        &OurEnv::ALL,
        |_| Op::AddEnv,
        |&var| Op::AppendEnv(var),
        |read, &var| read.has(var),
    )
}

/// Our items of a list: when the pod has no such list, one `add` of all of
/// them (an `add` to `…/-` needs the list to exist); otherwise an append
/// of each one `has` does not find.
fn missing<'a, L: Copy + 'a, T>(
    list: Option<L>,
    ours: &'static [T],
    whole: impl FnOnce(&'static [T]) -> Op,
    append: impl Fn(&'static T) -> Op + 'a,
    has: impl Fn(L, &T) -> bool + 'a,
) -> impl Iterator<Item = Op> + 'a {
    let whole = list.is_none().then(|| whole(ours));
    let each = ours
        .iter()
        .filter(move |item| list.is_some_and(|list| !has(list, item)))
        .map(append);
    whole.into_iter().chain(each)
}

/// With `envFrom`, an empty entry of each masked variable the target's env
/// does not have one of already.
fn env_from_masks(env_from: bool, env: Option<&EnvRead>) -> impl Iterator<Item = Op> {
    Masked::all()
        .filter(move |&masked| env_from && env.is_none_or(|read| !read.masked.contains(masked)))
        .map(Op::MaskEnvFrom)
}

/// Our literal of each limit, unless it is there already, placed before
/// KAI's reference. The appends come first (they land after every entry,
/// whatever the inserts do), then the inserts from the highest index down,
/// so one insert does not move the other's place.
fn limits(wanted: PerLimit<Option<LimitValue>>, env: Option<&EnvRead>) -> impl Iterator<Item = Op> {
    let mut wanted = wanted;
    let mut ops = Limit::ALL.map(|limit| {
        let have = env.map(|read| *read.limits.get(limit)).unwrap_or_default();
        let value = wanted.get_mut(limit).take().filter(|_| !have.ours)?;
        Some((have.kai_at, limit, value))
    });
    ops.sort_by_key(|op| {
        op.as_ref()
            .map(|(before, ..)| Reverse(before.unwrap_or(usize::MAX)))
    });
    ops.into_iter()
        .flatten()
        .map(|(before, limit, value)| Op::AddLimit {
            limit,
            value,
            before,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The appends before the inserts, and the inserts from the highest
    /// index down, whatever the limits' order.
    #[test]
    fn limits_never_move_each_others_place() {
        let both = PerLimit {
            memory: Some(LimitValue::Literal("1m".to_owned())),
            sm: Some(LimitValue::Literal("2".to_owned())),
        };
        let order = |memory_at, sm_at| {
            let mut read = EnvRead::default();
            read.limits.memory.kai_at = memory_at;
            read.limits.sm.kai_at = sm_at;
            limits(both.clone(), Some(&read))
                .map(|op| match op {
                    Op::AddLimit { limit, before, .. } => (limit, before),
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            order(Some(1), Some(4)),
            [(Limit::Sm, Some(4)), (Limit::Memory, Some(1))]
        );
        assert_eq!(
            order(Some(1), None),
            [(Limit::Sm, None), (Limit::Memory, Some(1))]
        );
        assert_eq!(
            order(None, None),
            [(Limit::Memory, None), (Limit::Sm, None)]
        );
    }
}
