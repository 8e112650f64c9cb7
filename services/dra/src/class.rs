//! Which device classes hand out GPU memory in slices, and the name of the
//! capacity that is the memory. The administrator declares them: a class
//! name says nothing about what its devices are, and a driver that isolates
//! its own shares (HAMi's DRA driver) must not be declared at all.

use std::fmt;
use std::str::FromStr;

/// The NVIDIA DRA driver's GPUs with consumable shares
/// (`--consumable-shares=memory`): class `gpu.nvidia.com`, capacity `memory`.
pub const DEFAULT_MEMORY_CLASS: &str = "gpu.nvidia.com=memory";

/// One declared class: `<class>=<capacity>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryClass {
    /// The DeviceClass a request names (`deviceClassName`).
    pub class: String,
    /// The device capacity that is GPU memory (a ResourceSlice's
    /// `capacity` key, and the key of `capacity.requests` and of
    /// `consumedCapacity`).
    pub capacity: String,
}

/// Why a `<class>=<capacity>` declaration was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "DRA memory class {given:?}: {why} (expected <device class>=<memory capacity>, e.g. {DEFAULT_MEMORY_CLASS})"
)]
pub struct ParseClassError {
    given: String,
    why: &'static str,
}

impl FromStr for MemoryClass {
    type Err = ParseClassError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| ParseClassError {
            given: s.to_owned(),
            why,
        };
        let (class, capacity) = s.split_once('=').ok_or_else(|| err("no '='"))?;
        let (class, capacity) = (class.trim(), capacity.trim());
        if class.is_empty() || capacity.is_empty() {
            return Err(err("an empty name"));
        }
        // Both are Kubernetes names: a DNS subdomain, a (qualified) name.
        let fits = |name: &str, extra: &[char]| {
            name.chars().all(|c| {
                c.is_ascii_lowercase()
                    || c.is_ascii_digit()
                    || c == '-'
                    || c == '.'
                    || extra.contains(&c)
            })
        };
        if !fits(class, &[]) || !fits(capacity, &['/', '_']) {
            return Err(err("not a Kubernetes name"));
        }
        Ok(Self {
            class: class.to_owned(),
            capacity: capacity.to_owned(),
        })
    }
}

impl fmt::Display for MemoryClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.class, self.capacity)
    }
}

/// Every declared class; empty turns DRA reading off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryClasses(Vec<MemoryClass>);

impl MemoryClasses {
    pub fn new(classes: Vec<MemoryClass>) -> Self {
        Self(classes)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The memory capacity of `class`, when it is declared.
    pub fn capacity_of(&self, class: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|c| c.class == class)
            .map(|c| c.capacity.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = &MemoryClass> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_parse_and_bad_ones_say_why() {
        let class: MemoryClass = DEFAULT_MEMORY_CLASS.parse().expect("the default parses");
        assert_eq!(class.class, "gpu.nvidia.com");
        assert_eq!(class.capacity, "memory");
        assert_eq!(class.to_string(), DEFAULT_MEMORY_CLASS);
        let spaced: MemoryClass = " gpu.example.com = memory ".parse().expect("trimmed");
        assert_eq!(spaced.class, "gpu.example.com");
        for bad in [
            "gpu.nvidia.com",
            "=memory",
            "gpu.nvidia.com=",
            "GPU=memory",
            "a b=memory",
        ] {
            let err = bad.parse::<MemoryClass>().expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn only_declared_classes_have_a_capacity() {
        let classes = MemoryClasses::new(vec![
            "gpu.example.com=memory".parse().expect("parses"),
            "vgpu.example.com=example.com/mem".parse().expect("parses"),
        ]);
        assert_eq!(classes.capacity_of("gpu.example.com"), Some("memory"));
        assert_eq!(
            classes.capacity_of("vgpu.example.com"),
            Some("example.com/mem")
        );
        assert_eq!(classes.capacity_of("net.example.com"), None);
        assert!(MemoryClasses::default().is_empty());
    }
}
