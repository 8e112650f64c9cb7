//! How a review ended, as one closed set: the `decision` label of
//! `kai_webhook_admission_reviews_total` and of the review log line.

/// How a review ended. [`Outcome::ALL`] is the list the metrics register
/// up front, so a new outcome cannot be counted under a label nobody
/// registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Injected,
    AlreadyInjected,
    NotGpuSharing,
    OptedOut,
    NoContainers,
    Denied,
    /// Not a Pod CREATE (UPDATE, DELETE, a subresource): not ours.
    PassThrough,
}

impl Outcome {
    /// Every outcome, in the order of their discriminants.
    pub const ALL: [Self; 7] = [
        Self::Injected,
        Self::AlreadyInjected,
        Self::NotGpuSharing,
        Self::OptedOut,
        Self::NoContainers,
        Self::Denied,
        Self::PassThrough,
    ];

    /// Stable label for metrics and logs.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Injected => "injected",
            Self::AlreadyInjected => "already_injected",
            Self::NotGpuSharing => "not_gpu_sharing",
            Self::OptedOut => "opted_out",
            Self::NoContainers => "no_containers",
            Self::Denied => "denied",
            Self::PassThrough => "pass_through",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Outcome;

    #[test]
    fn all_lists_each_outcome_at_its_discriminant() {
        for (i, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome as usize, i, "{}", outcome.label());
        }
        let mut labels: Vec<_> = Outcome::ALL.map(Outcome::label).to_vec();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Outcome::ALL.len(), "labels must be distinct");
    }
}
