//! The two questions asked of the API server: who is this token
//! (`TokenReview`), and may this user do that (`SubjectAccessReview`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::{API_GROUP, AccessError, RESOURCE};

/// A caller as the API server knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
    /// Everything above in one string: decisions are cached under it.
    pub(crate) key: Arc<str>,
}

impl User {
    pub fn new(
        name: String,
        uid: String,
        groups: Vec<String>,
        extra: BTreeMap<String, Vec<String>>,
    ) -> Self {
        // NUL cannot appear in any of them (the API server's JSON strings
        // could carry one, but then two users differing only there would
        // still differ in the separators' positions: lengths lead).
        let mut key = format!("{}:{name}\0{}:{uid}\0", name.len(), uid.len());
        for group in &groups {
            key.push_str(&format!("g{}:{group}\0", group.len()));
        }
        for (k, values) in &extra {
            for v in values {
                key.push_str(&format!("e{}:{k}={}:{v}\0", k.len(), v.len()));
            }
        }
        Self {
            name,
            uid,
            groups,
            extra,
            key: key.into(),
        }
    }
}

/// What a caller asks to do, as a `SubjectAccessReview` says it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Attributes {
    Resource {
        verb: &'static str,
        group: &'static str,
        resource: &'static str,
        /// Empty: cluster scope.
        namespace: String,
    },
    NonResource {
        verb: &'static str,
        path: &'static str,
    },
}

impl Attributes {
    /// Reading `/metrics`.
    pub fn metrics() -> Self {
        Self::NonResource {
            verb: "get",
            path: "/metrics",
        }
    }

    /// Seeing the whole cluster: `list` our containers at cluster scope.
    pub fn cluster() -> Self {
        Self::Resource {
            verb: "list",
            group: API_GROUP,
            resource: RESOURCE,
            namespace: String::new(),
        }
    }

    /// Seeing one namespace's containers through our resource.
    pub fn namespace(ns: &str) -> Self {
        Self::Resource {
            verb: "list",
            group: API_GROUP,
            resource: RESOURCE,
            namespace: ns.to_owned(),
        }
    }

    /// Listing one namespace's pods, which shows their containers too.
    pub fn pods(ns: &str) -> Self {
        Self::Resource {
            verb: "list",
            group: "",
            resource: "pods",
            namespace: ns.to_owned(),
        }
    }

    /// In the words of a refusal: "may not …".
    pub fn describe(&self) -> String {
        match self {
            Self::Resource {
                verb,
                group,
                resource,
                namespace,
            } => {
                let what = if group.is_empty() {
                    (*resource).to_owned()
                } else {
                    format!("{resource}.{group}")
                };
                if namespace.is_empty() {
                    format!("{verb} {what} at cluster scope")
                } else {
                    format!("{verb} {what} in namespace {namespace:?}")
                }
            }
            Self::NonResource { verb, path } => format!("{verb} {path}"),
        }
    }

    fn spec(&self, user: &User) -> SubjectAccessReviewSpec {
        let mut spec = SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            ..Default::default()
        };
        match self {
            Self::Resource {
                verb,
                group,
                resource,
                namespace,
            } => {
                spec.resource_attributes = Some(ResourceAttributes {
                    verb: Some((*verb).to_owned()),
                    group: Some((*group).to_owned()),
                    resource: Some((*resource).to_owned()),
                    namespace: (!namespace.is_empty()).then(|| namespace.clone()),
                    ..Default::default()
                });
            }
            Self::NonResource { verb, path } => {
                spec.non_resource_attributes = Some(NonResourceAttributes {
                    verb: Some((*verb).to_owned()),
                    path: Some((*path).to_owned()),
                });
            }
        }
        spec
    }
}

/// Asks the API server, within a deadline.
pub(crate) struct Reviewer {
    tokens: Api<TokenReview>,
    access: Api<SubjectAccessReview>,
    timeout: Duration,
}

impl Reviewer {
    pub(crate) fn new(client: kube::Client, timeout: Duration) -> Self {
        Self {
            tokens: Api::all(client.clone()),
            access: Api::all(client),
            timeout,
        }
    }

    /// The user behind `token`, or why the API server refused it (the
    /// inner `Err`); the outer `Err` when it could not be asked.
    pub(crate) async fn token(
        &self,
        token: &str,
        audiences: &[String],
    ) -> Result<Result<User, String>, AccessError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: (!audiences.is_empty()).then(|| audiences.to_vec()),
            },
            ..Default::default()
        };
        let answer = self.create(&self.tokens, "tokenreviews", &review).await?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(Err(status.error.unwrap_or_default()));
        }
        // The API server checks the audiences itself; a token it accepted
        // for none of ours is refused all the same.
        if !audiences.is_empty() {
            let granted = status.audiences.unwrap_or_default();
            if !granted.iter().any(|a| audiences.contains(a)) {
                return Ok(Err(format!(
                    "issued for {granted:?}, not for {audiences:?}"
                )));
            }
        }
        let info = status.user.unwrap_or_default();
        Ok(Ok(User::new(
            info.username.unwrap_or_default(),
            info.uid.unwrap_or_default(),
            info.groups.unwrap_or_default(),
            info.extra.unwrap_or_default(),
        )))
    }

    /// Whether `user` may do what `attributes` say.
    pub(crate) async fn access(
        &self,
        user: &User,
        attributes: &Attributes,
    ) -> Result<bool, AccessError> {
        let review = SubjectAccessReview {
            spec: attributes.spec(user),
            ..Default::default()
        };
        let answer = self
            .create(&self.access, "subjectaccessreviews", &review)
            .await?;
        let status = answer.status.unwrap_or_default();
        if let Some(error) = status.evaluation_error.filter(|e| !e.is_empty()) {
            // RBAC still answers when another authorizer failed; log why.
            tracing::debug!(user = %user.name, %error, "access review evaluation error");
        }
        Ok(status.allowed && status.denied != Some(true))
    }

    /// Creates `review` (a review's answer is its created object, status
    /// filled), within the deadline.
    async fn create<K>(&self, api: &Api<K>, what: &str, review: &K) -> Result<K, AccessError>
    where
        K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    {
        let params = PostParams::default();
        let call = api.create(&params, review);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(kube::Error::Api(status))) if status.code == 401 || status.code == 403 => {
                tracing::error!(%what, reason = %status.message, "the API server refuses our reviews");
                Err(AccessError::Unavailable(format!(
                    "this server may not create {what} ({}); bind its ServiceAccount to the ClusterRole system:auth-delegator",
                    status.message
                )))
            }
            Ok(Err(e)) => {
                tracing::warn!(%what, error = %e, "review failed");
                Err(AccessError::Unavailable(e.to_string()))
            }
            Err(_) => {
                tracing::warn!(%what, timeout = ?self.timeout, "review timed out");
                Err(AccessError::Unavailable(format!(
                    "no answer to {what} within {:?}",
                    self.timeout
                )))
            }
        }
    }
}
