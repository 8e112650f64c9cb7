//! How a review ended, as one closed set: the `decision` label of
//! `kai_webhook_admission_reviews_total` and of the review log line.

/// How a review ended. Its variants are the list the metrics register up
/// front (`Outcome::iter()`), so a new outcome cannot be counted under a
/// label nobody registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
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
    /// Stable label for metrics and logs: the variant in snake case.
    pub fn label(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use strum::IntoEnumIterator;

    use super::Outcome;

    /// The labels are what dashboards and alerts select on: a renamed
    /// variant must not rename its series unnoticed.
    #[test]
    fn the_decision_labels_stay_what_dashboards_select() {
        let labels: Vec<_> = Outcome::iter().map(Outcome::label).collect();
        assert_eq!(
            labels,
            [
                "injected",
                "already_injected",
                "not_gpu_sharing",
                "opted_out",
                "no_containers",
                "denied",
                "pass_through"
            ]
        );
    }
}
