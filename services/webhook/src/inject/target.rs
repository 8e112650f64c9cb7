//! Which container gets libvgpu: the one `gpu-fraction-container-name`
//! names (init containers first, as KAI looks), else the first container.
//! Only that one is touched: preloading libvgpu where there are no driver
//! libraries kills the process.

use super::denial::Denial;
use super::{ANNOTATION_CONTAINER_NAME, ContainerList, Decision, Target};
use crate::pod::{Container, Pod, Spec};

/// The target of `pod` and the container itself, or the decision that
/// ends the plan here: the named container is missing (denied), or there
/// is none at all (the API server rejects the pod on its own).
pub fn find<'a>(pod: &Pod, spec: &'a Spec) -> Result<(Target, &'a Container), Decision> {
    let Some(name) = pod.annotation(ANNOTATION_CONTAINER_NAME) else {
        let first = spec.containers.first().ok_or(Decision::NoContainers)?;
        return Ok((target(ContainerList::Regular, 0, first), first));
    };
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let named = |list, containers: &'a [Container]| {
        let (index, container) = containers
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == name)?;
        Some((target(list, index, container), container))
    };
    named(ContainerList::Init, init)
        .or_else(|| named(ContainerList::Regular, &spec.containers))
        .ok_or_else(|| Denial::NoSuchContainer { name }.into())
}

fn target(list: ContainerList, index: usize, container: &Container) -> Target {
    Target {
        list,
        index,
        name: container.name.clone(),
    }
}
