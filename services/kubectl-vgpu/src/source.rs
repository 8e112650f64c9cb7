//! Where the aggregator's JSON API is reached: through the API server's
//! service proxy with the user's kubeconfig (no port-forward), or at a
//! URL given with `--aggregator`.

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams};
use serde::de::DeserializeOwned;

/// Label selector of the chart's aggregator Service. `part-of` is the one
/// label the chart sets to the same value whatever `nameOverride` or
/// `fullnameOverride` say (`app.kubernetes.io/name` follows `nameOverride`).
/// The chart's tests read this literal and render a `nameOverride` against it.
pub const AGGREGATOR_SELECTOR: &str =
    "app.kubernetes.io/part-of=kai-resource-isolator,app.kubernetes.io/component=aggregator";
/// What releases of the chart from before the `part-of` label carry (without
/// `nameOverride`): tried only when [`AGGREGATOR_SELECTOR`] finds nothing, so
/// a release not yet upgraded is still found.
pub const LEGACY_AGGREGATOR_SELECTOR: &str =
    "app.kubernetes.io/name=kai-resource-isolator,app.kubernetes.io/component=aggregator";
/// Name of the Service port serving `/metrics` and `/api/v1/…`.
pub const AGGREGATOR_PORT: &str = "http-metrics";

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(
        "no kubeconfig or in-cluster config ({0}); pass --aggregator URL to reach the aggregator directly"
    )]
    Config(String),
    #[error("invalid --aggregator URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot list Services to find the aggregator: {0}")]
    Discover(#[source] kube::Error),
    #[error(
        "cannot list Services in all namespaces to find the aggregator ({0}); name its namespace: --aggregator-namespace NS (or KUBECTL_VGPU_AGGREGATOR_NAMESPACE)"
    )]
    DiscoverForbidden(String),
    #[error(
        "no kai-resource-isolator aggregator Service found (selector {AGGREGATOR_SELECTOR}, or {LEGACY_AGGREGATOR_SELECTOR}); is the chart installed with monitor.enabled? Name it with --aggregator-namespace/--aggregator-service"
    )]
    NotInstalled,
    #[error(
        "several aggregator Services found ({0}); pick one with --aggregator-namespace/--aggregator-service"
    )]
    Ambiguous(String),
    #[error("GET {path}: {source}")]
    Request {
        path: String,
        #[source]
        source: kube::Error,
    },
    #[error("the aggregator needs a bearer token ({message}): {hint}")]
    Unauthenticated { message: String, hint: &'static str },
    #[error("not allowed: {message}")]
    Forbidden { message: String },
    #[error("GET {path}: {status} {message}")]
    Status {
        path: String,
        status: u16,
        message: String,
    },
    #[error("GET {path}: the answer is not the aggregator's JSON: {source}")]
    Decode {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The header the aggregator reads a caller's token from when the request
/// came through the API server's service proxy, which strips
/// `Authorization` once it has authenticated the request itself.
pub const TOKEN_HEADER: &str = "x-kai-authorization";

/// The aggregator's HTTP API.
pub struct Aggregator {
    client: kube::Client,
    /// Prepended to `/api/v1/…`: the service-proxy path, or empty.
    prefix: String,
    /// What is shown in errors and `-o wide` headers.
    pub describe: String,
    /// Whether requests carry a bearer token for the aggregator.
    carries_token: bool,
}

/// A client of `config`'s server with `config`'s credentials (token,
/// token file, exec plugin, client certificate) whose requests also carry
/// the bearer token in [`TOKEN_HEADER`]: `token` when given, else the one
/// the credentials put in `Authorization`.
pub fn token_forwarding_client(
    config: &kube::Config,
    token: Option<&str>,
) -> Result<kube::Client, SourceError> {
    use kube::client::ConfigExt;
    let bad = |e: &dyn std::fmt::Display| SourceError::Config(e.to_string());
    let explicit = token
        .map(|t| http::HeaderValue::from_str(&format!("Bearer {}", t.trim())))
        .transpose()
        .map_err(|e| bad(&format!("--token: {e}")))?;
    let https = config.rustls_https_connector().map_err(|e| bad(&e))?;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(|e| bad(&e))?)
        .map_request(move |mut request: http::Request<kube::client::Body>| {
            let bearer = explicit.clone().or_else(|| {
                request
                    .headers()
                    .get(http::header::AUTHORIZATION)
                    .filter(|v| v.as_bytes().starts_with(b"Bearer "))
                    .cloned()
            });
            if let Some(bearer) = bearer {
                request.headers_mut().insert(TOKEN_HEADER, bearer);
            }
            request
        })
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// Whether `config`'s credentials can give a bearer token.
fn has_token(config: &kube::Config) -> bool {
    let auth = &config.auth_info;
    auth.token.is_some()
        || auth.token_file.is_some()
        || auth.exec.is_some()
        || auth.auth_provider.is_some()
}

impl Aggregator {
    /// An aggregator at `url` (`http://host:9394`), without the API server;
    /// with `config`, its credentials' token goes along.
    pub fn direct(
        url: &str,
        config: Option<&kube::Config>,
        token: Option<&str>,
    ) -> Result<Self, SourceError> {
        let bad = |reason: String| SourceError::Url {
            url: url.to_owned(),
            reason,
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
        if uri.scheme().is_none() || uri.host().is_none() {
            return Err(bad("expected http://host:port".into()));
        }
        let mut direct = kube::Config::new(uri);
        if let Some(config) = config {
            direct.auth_info = config.auth_info.clone();
            direct.root_cert = config.root_cert.clone();
        }
        direct.default_retry = false;
        Ok(Self {
            carries_token: token.is_some() || has_token(&direct),
            client: token_forwarding_client(&direct, token)?,
            prefix: String::new(),
            describe: url.to_owned(),
        })
    }

    /// The aggregator Service `namespace/name` through `config`'s API server.
    pub fn proxied(
        config: &kube::Config,
        token: Option<&str>,
        namespace: &str,
        service: &str,
    ) -> Result<Self, SourceError> {
        Ok(Self {
            carries_token: token.is_some() || has_token(config),
            client: token_forwarding_client(config, token)?,
            prefix: format!(
                "/api/v1/namespaces/{namespace}/services/{service}:{AGGREGATOR_PORT}/proxy"
            ),
            describe: format!("service {namespace}/{service} via the API server"),
        })
    }

    /// Finds the chart's aggregator Service (by its labels; in `namespace`
    /// when given, else in all namespaces the user may list).
    pub async fn discover(
        client: kube::Client,
        config: &kube::Config,
        token: Option<&str>,
        namespace: Option<&str>,
        service: Option<&str>,
    ) -> Result<Self, SourceError> {
        if let (Some(ns), Some(svc)) = (namespace, service) {
            return Self::proxied(config, token, ns, svc);
        }
        let api: Api<Service> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let list = |selector: &'static str| {
            let api = api.clone();
            async move {
                let found = api
                    .list(&ListParams::default().labels(selector))
                    .await
                    .map_err(|e| match e {
                        // Tenants may not list Services cluster-wide; the
                        // chart lets every user list them in its own namespace.
                        kube::Error::Api(status) if status.code == 403 && namespace.is_none() => {
                            SourceError::DiscoverForbidden(status.message)
                        }
                        e => SourceError::Discover(e),
                    })?;
                Ok::<Vec<(String, String)>, SourceError>(
                    found
                        .items
                        .into_iter()
                        .filter_map(|s| Some((s.metadata.namespace?, s.metadata.name?)))
                        .filter(|(_, name)| service.is_none_or(|want| want == name))
                        .collect(),
                )
            }
        };
        let mut matches = list(AGGREGATOR_SELECTOR).await?;
        if matches.is_empty() {
            matches = list(LEGACY_AGGREGATOR_SELECTOR).await?;
        }
        match matches.len() {
            0 => Err(SourceError::NotInstalled),
            1 => {
                let (ns, name) = matches.remove(0);
                Self::proxied(config, token, &ns, &name)
            }
            _ => Err(SourceError::Ambiguous(
                matches
                    .iter()
                    .map(|(ns, n)| format!("{ns}/{n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            )),
        }
    }

    /// GETs `path` (`/api/v1/…?…`) and decodes the JSON answer.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, SourceError> {
        let full = format!("{}{path}", self.prefix);
        let request =
            http::Request::get(&full)
                .body(Vec::new())
                .map_err(|e| SourceError::Request {
                    path: full.clone(),
                    source: kube::Error::HttpError(e),
                })?;
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await
            .map_err(|source| SourceError::Request {
                path: full.clone(),
                source,
            })?;
        let status = response.status();
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .map_err(|e| SourceError::Request {
                path: full.clone(),
                source: kube::Error::Service(e.into()),
            })?
            .to_bytes();
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            return Err(self.refusal(&full, status, &text));
        }
        serde_json::from_str(&text).map_err(|source| SourceError::Decode { path: full, source })
    }
}

impl Aggregator {
    /// What a failed request means for the user: the aggregator's own
    /// `{"error": …}`, or the API server's Status (its proxy refused).
    fn refusal(&self, path: &str, status: http::StatusCode, body: &str) -> SourceError {
        let json: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let message = json["error"]
            .as_str()
            .or_else(|| json["message"].as_str())
            .unwrap_or(body.trim())
            .to_owned();
        match status {
            http::StatusCode::UNAUTHORIZED => SourceError::Unauthenticated {
                message,
                hint: if self.carries_token {
                    "the token was refused; get a fresh one (kubectl create token …) and pass --token"
                } else {
                    "your kubeconfig's credentials give no bearer token (a client certificate cannot pass the API server's service proxy); pass --token, e.g. --token=$(kubectl create token <serviceaccount>)"
                },
            },
            http::StatusCode::FORBIDDEN => SourceError::Forbidden { message },
            _ => SourceError::Status {
                path: path.to_owned(),
                status: status.as_u16(),
                message,
            },
        }
    }
}

/// Percent-encodes a query value (names are DNS labels, but be safe).
pub fn query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A kube client whose API server is a mock that answers one request.
    fn mock() -> (
        kube::Client,
        tower_test::mock::Handle<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >,
    ) {
        let (service, handle) = tower_test::mock::pair();
        (kube::Client::new(service, "default"), handle)
    }

    /// A one-request HTTP server on loopback: the request head it got
    /// comes back through the handle; it answers `status` with `body`.
    /// The commands' tests stand it in for the aggregator too.
    pub(crate) async fn one_request(
        status: u16,
        body: &'static str,
    ) -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.expect("accept");
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                tcp.read_exact(&mut byte).await.expect("read");
                head.push(byte[0]);
            }
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            tcp.write_all(reply.as_bytes()).await.expect("write");
            String::from_utf8_lossy(&head).to_lowercase()
        });
        (url, server)
    }

    fn config_with_token(url: &str, token: &str) -> kube::Config {
        let mut config = kube::Config::new(url.parse().expect("url"));
        config.auth_info.token = Some(token.to_owned().into());
        config
    }

    #[tokio::test]
    async fn finds_the_service_and_goes_through_its_proxy_with_the_token_twice() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (client, mut handle) = mock();
        tokio::spawn(async move {
            let (list, send) = handle.next_request().await.expect("a discovery request");
            assert_eq!(list.uri().path(), "/api/v1/services");
            let query = list.uri().query().unwrap_or_default().to_owned();
            assert!(
                query.contains("labelSelector=app.kubernetes.io%2Fpart-of%3Dkai-resource-isolator"),
                "{query}"
            );
            let body = serde_json::json!({"apiVersion":"v1","kind":"ServiceList","metadata":{},
                "items":[{"metadata":{"name":"kai-agg","namespace":"kai-system"}}]});
            send.send_response(http::Response::new(kube::client::Body::from(
                body.to_string().into_bytes(),
            )));
        });
        let (url, server) = one_request(200, r#"{"containers":[{"pod":"p"}]}"#).await;
        let config = config_with_token(&url, "user-token");
        let agg = Aggregator::discover(client, &config, None, None, None)
            .await
            .expect("found");
        let got: kai_proto::v1::ClusterContainersResponse = agg
            .get("/api/v1/containers?namespace=team-a")
            .await
            .expect("answer");
        assert_eq!(got.containers[0].pod, "p");
        let head = server.await.expect("server");
        assert!(
            head.starts_with("get /api/v1/namespaces/kai-system/services/kai-agg:http-metrics/proxy/api/v1/containers?namespace=team-a http/1.1"),
            "{head}"
        );
        // The API server takes `Authorization` and strips it; ours passes.
        assert!(
            head.contains("\r\nauthorization: bearer user-token\r\n"),
            "{head}"
        );
        assert!(
            head.contains("\r\nx-kai-authorization: bearer user-token\r\n"),
            "{head}"
        );
    }

    /// Answers one Service list: its label selector, and `items`.
    async fn answer_list(
        handle: &mut tower_test::mock::Handle<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >,
        items: serde_json::Value,
    ) -> String {
        let (list, send) = handle.next_request().await.expect("a discovery request");
        let query = list.uri().query().unwrap_or_default().to_owned();
        let body = serde_json::json!({"apiVersion":"v1","kind":"ServiceList","metadata":{},
            "items": items});
        send.send_response(http::Response::new(kube::client::Body::from(
            body.to_string().into_bytes(),
        )));
        query
    }

    #[tokio::test]
    async fn a_release_from_before_the_part_of_label_is_still_found() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (client, mut handle) = mock();
        let lists = tokio::spawn(async move {
            let first = answer_list(&mut handle, serde_json::json!([])).await;
            let second = answer_list(
                &mut handle,
                serde_json::json!([{"metadata":{"name":"old-agg","namespace":"gpu"}}]),
            )
            .await;
            (first, second)
        });
        let config = config_with_token("http://127.0.0.1:1", "t");
        let agg = Aggregator::discover(client, &config, None, None, None)
            .await
            .expect("found by the legacy selector");
        assert_eq!(agg.describe, "service gpu/old-agg via the API server");
        let (first, second) = lists.await.expect("lists");
        assert!(
            first.contains("app.kubernetes.io%2Fpart-of%3Dkai-resource-isolator"),
            "{first}"
        );
        assert!(
            second.contains("app.kubernetes.io%2Fname%3Dkai-resource-isolator"),
            "{second}"
        );
    }

    #[tokio::test]
    async fn an_explicit_token_goes_to_the_aggregator_and_refusals_say_what_to_do() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (url, server) = one_request(401, r#"{"error":"no bearer token"}"#).await;
        // A kubeconfig with a client certificate only: no bearer token.
        let config = kube::Config::new(url.parse().expect("url"));
        let agg = Aggregator::proxied(&config, None, "kai-system", "kai-agg").expect("client");
        let err = agg
            .get::<serde_json::Value>("/api/v1/nodes")
            .await
            .expect_err("401");
        assert!(matches!(err, SourceError::Unauthenticated { .. }), "{err}");
        assert!(err.to_string().contains("pass --token"), "{err}");
        let head = server.await.expect("server");
        assert!(
            !head.contains("x-kai-authorization"),
            "nothing to pass: {head}"
        );

        let (url, server) = one_request(
            403,
            r#"{"error":"bob may not list pods in namespace \"team-b\""}"#,
        )
        .await;
        let agg = Aggregator::direct(&url, None, Some("explicit")).expect("client");
        let err = agg
            .get::<serde_json::Value>("/api/v1/containers?namespace=team-b")
            .await
            .expect_err("403");
        assert!(matches!(err, SourceError::Forbidden { .. }), "{err}");
        let head = server.await.expect("server");
        assert!(
            head.contains("\r\nx-kai-authorization: bearer explicit\r\n"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn says_when_the_chart_is_not_installed() {
        let (client, mut handle) = mock();
        // Nothing under the current selector, nor under the legacy one.
        let lists = tokio::spawn(async move {
            let first = answer_list(&mut handle, serde_json::json!([])).await;
            let second = answer_list(&mut handle, serde_json::json!([])).await;
            (first, second)
        });
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
        let err = Aggregator::discover(client, &config, None, None, None)
            .await
            .err()
            .expect("an error");
        assert!(matches!(err, SourceError::NotInstalled), "{err}");
        let (first, second) = lists.await.expect("lists");
        assert!(first.contains("part-of"), "{first}");
        assert!(second.contains("app.kubernetes.io%2Fname"), "{second}");
    }

    #[test]
    fn rejects_a_url_without_scheme() {
        assert!(matches!(
            Aggregator::direct("localhost:9394", None, None),
            Err(SourceError::Url { .. })
        ));
        assert_eq!(query_value("team a/b"), "team%20a%2Fb");
    }
}
