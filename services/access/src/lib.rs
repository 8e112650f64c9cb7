//! kai-access: who may see what (docs/security.md, "Access control").
//!
//! A caller is the Kubernetes identity behind its bearer token, as the API
//! server says in a `TokenReview`; what it may see is what the API server
//! allows in `SubjectAccessReview`s, the way kubelet and kube-rbac-proxy
//! decide. Answers are cached for a short while (allowed and denied apart,
//! bounded in size); when the API server cannot answer, the caller is
//! refused with 503, never let through.
//!
//! The rules, one place for every service:
//! - `/metrics`: `get` on the non-resource URL `/metrics`;
//! - the whole cluster (every namespace, nodes, devices): `list` on
//!   `containers` in [`API_GROUP`] at cluster scope;
//! - one namespace: `list` on those `containers`, or on `pods`, in it.

mod cache;
mod review;
#[cfg(any(test, feature = "test-support"))]
pub mod stand_in;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use http::HeaderMap;
use kai_exposition::Recorder;

pub use review::{Attributes, User};

use cache::TtlCache;
use review::Reviewer;

/// The API group of our `containers` resource (RBAC only: there is no
/// such API, rules may name it all the same).
pub const API_GROUP: &str = "vgpu.kai-resource-isolator.io";
/// The resource whose `list` shows containers' GPU use.
pub const RESOURCE: &str = "containers";
/// The header that carries the token through the API server's service
/// proxy, which strips `Authorization` once it has authenticated a request.
pub const PROXY_HEADER: &str = "x-kai-authorization";
/// Reviews the API server must answer within, or the caller gets 503.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Namespace reviews of one caller in flight at once.
const PARALLEL_REVIEWS: usize = 16;

/// Series of [`Access`] (on the service's own recorder).
pub const REVIEWS: &str = "kai_access_reviews_total";
pub const CACHE_HITS: &str = "kai_access_cache_hits_total";

/// Why a caller is refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AccessError {
    #[error(
        "no bearer token: send `Authorization: Bearer <token>` (through the API server's service proxy: `X-Kai-Authorization: Bearer <token>`)"
    )]
    NoToken,
    #[error("the token was not accepted by the Kubernetes API server{}", reason_suffix(.0))]
    Unauthenticated(String),
    #[error("{user} may not {what}")]
    Forbidden { user: String, what: String },
    #[error("cannot check the caller with the Kubernetes API server: {0}")]
    Unavailable(String),
}

fn reason_suffix(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

impl AccessError {
    pub fn status(&self) -> http::StatusCode {
        match self {
            Self::NoToken | Self::Unauthenticated(_) => http::StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } => http::StatusCode::FORBIDDEN,
            Self::Unavailable(_) => http::StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The HTTP answer: the status, a JSON body `{"error": …}`, and the
    /// headers a client acts on (`WWW-Authenticate` on 401, `Retry-After`
    /// on 503).
    pub fn response(&self) -> http::Response<String> {
        let body = serde_json::json!({ "error": self.to_string() }).to_string();
        let mut response = http::Response::new(body);
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        match self {
            Self::NoToken | Self::Unauthenticated(_) => {
                headers.insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer realm=\"kai-resource-isolator\""),
                );
            }
            Self::Unavailable(_) => {
                headers.insert(
                    http::header::RETRY_AFTER,
                    http::HeaderValue::from_static("5"),
                );
            }
            Self::Forbidden { .. } => {}
        }
        response
    }
}

#[cfg(feature = "grpc")]
impl From<AccessError> for tonic::Status {
    fn from(e: AccessError) -> Self {
        match e {
            AccessError::NoToken | AccessError::Unauthenticated(_) => {
                tonic::Status::unauthenticated(e.to_string())
            }
            AccessError::Forbidden { .. } => tonic::Status::permission_denied(e.to_string()),
            AccessError::Unavailable(_) => tonic::Status::unavailable(e.to_string()),
        }
    }
}

/// Who asks.
#[derive(Debug, Clone)]
pub enum Caller {
    /// Access control is off (`--auth=none`): anyone sees everything.
    Anyone,
    User(Arc<User>),
}

impl Caller {
    /// The name to log and to put in refusals.
    pub fn name(&self) -> &str {
        match self {
            Self::Anyone => "anyone",
            Self::User(user) => &user.name,
        }
    }
}

/// What a caller may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace, the nodes and their devices.
    Cluster,
    /// These namespaces' containers only (and node figures without names).
    Namespaces(BTreeSet<String>),
}

impl Scope {
    pub fn sees(&self, namespace: &str) -> bool {
        match self {
            Self::Cluster => true,
            Self::Namespaces(set) => set.contains(namespace),
        }
    }
}

/// Which callers a server admits to `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsAuth {
    /// `get` on the non-resource URL `/metrics` (Prometheus' own token).
    Rbac,
    /// Anyone who reaches the port (HAMi's anonymous scrapes).
    None,
}

/// Settings of the Kubernetes checks.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `TokenReview` audiences; empty: the API server's own.
    pub audiences: Vec<String>,
    /// How long an answer that lets a caller in is kept.
    pub ttl: Duration,
    /// How long a refusal (unknown token, denied review) is kept.
    pub denied_ttl: Duration,
    /// Answers kept at most, per kind.
    pub entries: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            audiences: Vec::new(),
            ttl: Duration::from_secs(60),
            denied_ttl: Duration::from_secs(10),
            entries: 4096,
        }
    }
}

/// Flags shared by the services that check callers.
#[derive(Debug, Clone, clap::Args)]
pub struct AccessArgs {
    /// Who may read `/metrics`: `rbac` (a token allowed `get` on the
    /// non-resource URL /metrics) or `none` (anyone reaching the port).
    #[arg(long, env = "METRICS_AUTH", value_enum, default_value_t = MetricsAuth::Rbac)]
    pub metrics_auth: MetricsAuth,
    /// Audiences a token must be issued for (comma-separated); empty: the
    /// API server's own.
    #[arg(long, env = "AUTH_AUDIENCES", value_delimiter = ',')]
    pub auth_audiences: Vec<String>,
    /// Seconds an identity or an allowed decision is cached.
    #[arg(long, env = "AUTH_CACHE_TTL_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub auth_cache_ttl_seconds: u64,
    /// Seconds a refused token or a denied decision is cached.
    #[arg(long, env = "AUTH_DENIED_CACHE_TTL_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub auth_denied_cache_ttl_seconds: u64,
    /// Answers cached at most, per kind (identities, decisions).
    #[arg(long, env = "AUTH_CACHE_ENTRIES", default_value_t = 4096,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub auth_cache_entries: u64,
}

impl AccessArgs {
    pub fn settings(&self) -> Settings {
        Settings {
            audiences: self
                .auth_audiences
                .iter()
                .filter(|a| !a.is_empty())
                .cloned()
                .collect(),
            ttl: Duration::from_secs(self.auth_cache_ttl_seconds),
            denied_ttl: Duration::from_secs(self.auth_denied_cache_ttl_seconds),
            // Bounded by clap far below usize::MAX.
            entries: self.auth_cache_entries as usize,
        }
    }
}

/// The bearer token of a request: `X-Kai-Authorization` (set for us, and
/// kept by the API server's service proxy) before `Authorization`.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    [PROXY_HEADER, http::header::AUTHORIZATION.as_str()]
        .into_iter()
        .filter_map(|name| headers.get(name)?.to_str().ok())
        .find_map(|value| {
            let (scheme, token) = value.trim().split_once(' ')?;
            let token = token.trim();
            (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
        })
}

/// The user a verified client certificate names: CN, with each O as a
/// group and `system:authenticated` (the API server's x509 authenticator).
pub fn certificate_user(der: &[u8]) -> Result<User, AccessError> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let refused = |why: String| AccessError::Unauthenticated(format!("client certificate: {why}"));
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| refused(e.to_string()))?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
        .ok_or_else(|| refused("no common name".to_owned()))?
        .to_owned();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    groups.push("system:authenticated".to_owned());
    Ok(User::new(name, String::new(), groups, Default::default()))
}

/// Checks callers of one server; cheap to clone.
#[derive(Clone)]
pub struct Access {
    inner: Option<Arc<Checks>>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            None => f.write_str("Access(open)"),
            Some(checks) => f
                .debug_struct("Access")
                .field("settings", &checks.settings)
                .finish_non_exhaustive(),
        }
    }
}

struct Checks {
    reviewer: Reviewer,
    settings: Settings,
    users: TtlCache<[u8; 32], Result<Arc<User>, String>>,
    decisions: TtlCache<(Arc<str>, Attributes), bool>,
    counted: Counted,
}

/// The series [`Access`] counts.
struct Counted {
    token: [metrics::Counter; 3],
    access: [metrics::Counter; 3],
    token_hits: metrics::Counter,
    access_hits: metrics::Counter,
}

impl Counted {
    fn new(recorder: &Recorder) -> Self {
        let review = |review: &'static str| {
            ["allowed", "denied", "error"].map(|result| {
                recorder.counter(
                    REVIEWS,
                    "TokenReviews (review=token) and SubjectAccessReviews (review=access) asked of the API server, by result.",
                    &[("review", review), ("result", result)],
                )
            })
        };
        let hits = |review: &'static str| {
            recorder.counter(
                CACHE_HITS,
                "Callers' identities (review=token) and decisions (review=access) answered from the cache.",
                &[("review", review)],
            )
        };
        Self {
            token: review("token"),
            access: review("access"),
            token_hits: hits("token"),
            access_hits: hits("access"),
        }
    }
}

fn count(counters: &[metrics::Counter; 3], outcome: Result<bool, ()>) {
    let i = match outcome {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(()) => 2,
    };
    counters[i].increment(1);
}

impl Access {
    /// No checks: every caller is [`Caller::Anyone`] and sees everything.
    pub fn open() -> Self {
        Self { inner: None }
    }

    /// Callers checked by the API server `client` talks to; the series go
    /// to `recorder`.
    pub fn kubernetes(client: kube::Client, settings: Settings, recorder: &Recorder) -> Self {
        Self {
            inner: Some(Arc::new(Checks {
                reviewer: Reviewer::new(client, REVIEW_TIMEOUT),
                users: TtlCache::new(settings.entries),
                decisions: TtlCache::new(settings.entries),
                counted: Counted::new(recorder),
                settings,
            })),
        }
    }

    /// Who sent `headers`.
    pub async fn caller(&self, headers: &HeaderMap) -> Result<Caller, AccessError> {
        self.caller_with(headers, None).await
    }

    /// Who sent `headers` over a connection on which the client presented
    /// `certificate` (DER), which the server's verifier accepted as issued
    /// by its client CA: a bearer token first, else the certificate's
    /// subject as the API server reads it (CN the user, each O a group).
    pub async fn caller_with(
        &self,
        headers: &HeaderMap,
        certificate: Option<&[u8]>,
    ) -> Result<Caller, AccessError> {
        let Some(checks) = &self.inner else {
            return Ok(Caller::Anyone);
        };
        match (bearer_token(headers), certificate) {
            (Some(token), _) => checks.user(token).await.map(Caller::User),
            (None, Some(der)) => certificate_user(der).map(|u| Caller::User(Arc::new(u))),
            (None, None) => Err(AccessError::NoToken),
        }
    }

    /// Whether `caller` may do what `attributes` say.
    pub async fn allowed(
        &self,
        caller: &Caller,
        attributes: Attributes,
    ) -> Result<bool, AccessError> {
        match (&self.inner, caller) {
            (None, _) | (_, Caller::Anyone) => Ok(true),
            (Some(checks), Caller::User(user)) => checks.allowed(user, attributes).await,
        }
    }

    /// Refuses `caller` unless it may do what `attributes` say.
    pub async fn require(
        &self,
        caller: &Caller,
        attributes: Attributes,
    ) -> Result<(), AccessError> {
        if self.allowed(caller, attributes.clone()).await? {
            Ok(())
        } else {
            Err(AccessError::Forbidden {
                user: caller.name().to_owned(),
                what: attributes.describe(),
            })
        }
    }

    /// The caller of `headers` (and of a verified client `certificate`), if
    /// it may read `/metrics`.
    pub async fn metrics_reader(
        &self,
        headers: &HeaderMap,
        certificate: Option<&[u8]>,
    ) -> Result<Caller, AccessError> {
        let caller = self.caller_with(headers, certificate).await?;
        self.require(&caller, Attributes::metrics()).await?;
        Ok(caller)
    }

    /// What `caller` may see of the containers in `namespaces` (the ones
    /// there are): the whole cluster, or those of the namespaces it may
    /// list containers or pods in.
    pub async fn scope<'a>(
        &self,
        caller: &Caller,
        namespaces: impl IntoIterator<Item = &'a str>,
    ) -> Result<Scope, AccessError> {
        let (Some(checks), Caller::User(user)) = (&self.inner, caller) else {
            return Ok(Scope::Cluster);
        };
        if checks.allowed(user, Attributes::cluster()).await? {
            return Ok(Scope::Cluster);
        }
        // Owned names: the futures below must not hold borrowed `&str`s of
        // a caller's lifetime (they are polled inside Send futures).
        let wanted: BTreeSet<String> = namespaces.into_iter().map(str::to_owned).collect();
        let checks: Arc<Checks> = checks.clone();
        let answers: Vec<Result<Option<String>, AccessError>> =
            futures_util::stream::iter(wanted.into_iter().map(|ns| {
                let (checks, user) = (checks.clone(), user.clone());
                async move { Ok(checks.namespace_visible(&user, &ns).await?.then_some(ns)) }
            }))
            .buffer_unordered(PARALLEL_REVIEWS)
            .collect()
            .await;
        let mut seen = BTreeSet::new();
        for answer in answers {
            seen.extend(answer?);
        }
        Ok(Scope::Namespaces(seen))
    }
}

impl Checks {
    async fn user(&self, token: &str) -> Result<Arc<User>, AccessError> {
        use sha2::Digest;
        let key: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        if let Some(known) = self.users.get(&key) {
            self.counted.token_hits.increment(1);
            return known.map_err(AccessError::Unauthenticated);
        }
        let answer = self
            .reviewer
            .token(token, &self.settings.audiences)
            .await
            .inspect_err(|_| count(&self.counted.token, Err(())))?;
        count(&self.counted.token, Ok(answer.is_ok()));
        let ttl = if answer.is_ok() {
            self.settings.ttl
        } else {
            self.settings.denied_ttl
        };
        let answer = answer.map(Arc::new);
        self.users.insert(key, answer.clone(), ttl);
        answer.map_err(AccessError::Unauthenticated)
    }

    async fn allowed(&self, user: &Arc<User>, attributes: Attributes) -> Result<bool, AccessError> {
        let key = (user.key.clone(), attributes);
        if let Some(known) = self.decisions.get(&key) {
            self.counted.access_hits.increment(1);
            return Ok(known);
        }
        let allowed = self
            .reviewer
            .access(user, &key.1)
            .await
            .inspect_err(|_| count(&self.counted.access, Err(())))?;
        count(&self.counted.access, Ok(allowed));
        let ttl = if allowed {
            self.settings.ttl
        } else {
            self.settings.denied_ttl
        };
        self.decisions.insert(key, allowed, ttl);
        Ok(allowed)
    }

    async fn namespace_visible(&self, user: &Arc<User>, ns: &str) -> Result<bool, AccessError> {
        Ok(self.allowed(user, Attributes::namespace(ns)).await?
            || self.allowed(user, Attributes::pods(ns)).await?)
    }
}

#[cfg(test)]
mod tests;
