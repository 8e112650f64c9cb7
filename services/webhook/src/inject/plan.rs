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
use super::items::{Layout, Source, csi_attributes, layout};
use super::patch::{Op, Patch};
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
    // container that gets libvgpu: the one a DRA claim gives GPU memory,
    // else the KAI annotations'.
    let Chosen {
        target,
        container,
        memory,
        sm_percent,
        kai_config_map,
        annotate,
    } = match dra::read(pod, cfg, claims)? {
        Some(gpu) => {
            if opt_out == OptOut::Honoured && asks_to_opt_out(pod) {
                return Err(Decision::OptedOut);
            }
            let gpu = gpu.one()?;
            // The claim's memory is the only cap, so it is written whatever
            // `--memory-limit-fallback` says. No KAI reference is ours to
            // keep: KAI does not share this GPU, so an entry that looks
            // like KAI's is the tenant's.
            let (memory, annotate) = match gpu.limit {
                MemoryLimit::Stated { mib } => (LimitValue::Literal(format!("{mib}m")), None),
                MemoryLimit::NodeDecided => {
                    let name = &gpu.target.name;
                    let config_map = dra::limits_config_map(pod, name, claims.suffix())?;
                    let value = LimitValue::ConfigMapKey {
                        config_map: config_map.name.clone(),
                        key: name.clone(),
                    };
                    (value, config_map.annotate.then_some(config_map.name))
                }
            };
            Chosen {
                target: gpu.target,
                container: gpu.container,
                memory: Some(memory),
                sm_percent: sm_percent(pod)?,
                kai_config_map: None,
                annotate,
            }
        }
        None => {
            let ask = Ask::read(pod, cfg, opt_out)?;
            let spec = pod.spec.as_ref().ok_or(Decision::NoContainers)?;
            let (target, container) = target::find(pod, spec)?;
            Chosen {
                kai_config_map: kai_config_map(pod, &target),
                target,
                container,
                memory: ask
                    .memory_mib
                    .map(|mib| LimitValue::Literal(format!("{mib}m"))),
                sm_percent: ask.sm_percent,
                annotate: None,
            }
        }
    };
    let spec = pod.spec.as_ref().ok_or(Decision::NoContainers)?;
    // 3. What the pod may not declare.
    let layout = layout(cfg.delivery);
    let run_as = container.effective_run_as(spec.security_context.as_ref());
    defences::check(spec, container, layout, cfg, run_as)?;
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
            &container.name,
            run_as,
        ))
        .chain(missing_volumes(volumes, layout))
        .chain(missing_mounts(
            container.volume_mounts.as_deref(),
            layout,
            cfg,
        ))
        .chain(missing_env(env))
        .chain(env_from_masks(env_from, env))
        // After our env, so the list exists by then.
        .chain(limits(wanted.limits, env))
        .chain(annotate.map(|name| Op::AnnotateLimitsConfigMap {
            name,
            map_exists: pod.metadata.annotations.is_some(),
        }));
    let patch = Patch::new(run_as, ops);
    Ok(if patch.is_empty() {
        Decision::AlreadyInjected { target }
    } else {
        Decision::Inject { target, patch }
    })
}

/// What steps 1-2 chose: the target, and what its limits are.
struct Chosen<'a> {
    target: Target,
    container: &'a Container,
    /// `CUDA_DEVICE_MEMORY_LIMIT`: `gpu-memory`'s or a stated claim's
    /// literal, or the node-decided limit's reference.
    memory: Option<LimitValue>,
    sm_percent: Option<u8>,
    /// The ConfigMap KAI's references read (KAI pods only).
    kai_config_map: Option<String>,
    /// The limits ConfigMap the pod is to be annotated with.
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
    container: &str,
    run_as: RunAs,
) -> Option<Op> {
    if !layout.volumes.iter().any(|v| v.source == Source::Csi) {
        return None;
    }
    let want = csi_attributes(container, run_as);
    let volume = volumes?.iter().position(|v| {
        v.name == VOLUME_VGPU
            && v.csi
                .as_ref()
                .is_some_and(|csi| csi.volume_attributes.as_ref() != Some(&want))
    })?;
    Some(Op::RewriteCsiAttributes { volume })
}

/// Our volumes the pod lacks. Volumes compare by name: one of ours already
/// there is kept as it is (the defences checked its source).
fn missing_volumes(
    volumes: Option<&[Volume]>,
    layout: &'static Layout,
) -> impl Iterator<Item = Op> {
    missing(
        volumes,
        layout.volumes,
        Op::AddVolumes,
        Op::AppendVolume,
        |have, spec| have.iter().any(|v| v.name == spec.name),
    )
}

/// Our mounts the target lacks (compared as [`super::MountSpec::is`]).
fn missing_mounts<'a>(
    mounts: Option<&'a [VolumeMount]>,
    layout: &'static Layout,
    cfg: &'a InjectConfig,
) -> impl Iterator<Item = Op> + 'a {
    missing(
        mounts,
        layout.mounts,
        Op::AddMounts,
        Op::AppendMount,
        move |have, spec| have.iter().any(|m| spec.is(m, cfg)),
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
