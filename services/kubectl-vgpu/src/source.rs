//! Where the aggregator's JSON API is reached: through the API server's
//! service proxy with the user's kubeconfig (no port-forward), or at a
//! URL given with `--aggregator`.

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams};
use serde::de::DeserializeOwned;

/// Label selector of the chart's aggregator Service.
pub const AGGREGATOR_SELECTOR: &str =
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
        "no kai-resource-isolator aggregator Service found (selector {AGGREGATOR_SELECTOR}); is the chart installed with monitor.enabled? Name it with --aggregator-namespace/--aggregator-service"
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
    #[error("GET {path}: the answer is not the aggregator's JSON: {source}")]
    Decode {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The aggregator's HTTP API.
pub struct Aggregator {
    client: kube::Client,
    /// Prepended to `/api/v1/…`: the service-proxy path, or empty.
    prefix: String,
    /// What is shown in errors and `-o wide` headers.
    pub describe: String,
}

impl Aggregator {
    /// An aggregator at `url` (`http://host:9394`), without the API server.
    pub fn direct(url: &str) -> Result<Self, SourceError> {
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
        let config = kube::Config::new(uri);
        let client = kube::Client::try_from(config).map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            client,
            prefix: String::new(),
            describe: url.to_owned(),
        })
    }

    /// The aggregator Service `namespace/name` through `client`'s API server.
    pub fn proxied(client: kube::Client, namespace: &str, service: &str) -> Self {
        Self {
            client,
            prefix: format!(
                "/api/v1/namespaces/{namespace}/services/{service}:{AGGREGATOR_PORT}/proxy"
            ),
            describe: format!("service {namespace}/{service} via the API server"),
        }
    }

    /// Finds the chart's aggregator Service (by its labels; in `namespace`
    /// when given, else in all namespaces the user may list).
    pub async fn discover(
        client: kube::Client,
        namespace: Option<&str>,
        service: Option<&str>,
    ) -> Result<Self, SourceError> {
        if let (Some(ns), Some(svc)) = (namespace, service) {
            return Ok(Self::proxied(client, ns, svc));
        }
        let api: Api<Service> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let found = api
            .list(&ListParams::default().labels(AGGREGATOR_SELECTOR))
            .await
            .map_err(SourceError::Discover)?;
        let mut matches: Vec<(String, String)> = found
            .items
            .into_iter()
            .filter_map(|s| Some((s.metadata.namespace?, s.metadata.name?)))
            .filter(|(_, name)| service.is_none_or(|want| want == name))
            .collect();
        match matches.len() {
            0 => Err(SourceError::NotInstalled),
            1 => {
                let (ns, name) = matches.remove(0);
                Ok(Self::proxied(client, &ns, &name))
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
        let text =
            self.client
                .request_text(request)
                .await
                .map_err(|source| SourceError::Request {
                    path: full.clone(),
                    source,
                })?;
        serde_json::from_str(&text).map_err(|source| SourceError::Decode { path: full, source })
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
mod tests {
    use super::*;
    use http_body_util::BodyExt;

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

    #[tokio::test]
    async fn reaches_the_aggregator_through_the_service_proxy() {
        let (client, mut handle) = mock();
        let server = tokio::spawn(async move {
            let (list, send) = handle.next_request().await.expect("a discovery request");
            assert_eq!(list.uri().path(), "/api/v1/services");
            let query = list.uri().query().unwrap_or_default().to_owned();
            assert!(
                query.contains("labelSelector=app.kubernetes.io%2Fname%3Dkai-resource-isolator"),
                "{query}"
            );
            let body = serde_json::json!({"apiVersion":"v1","kind":"ServiceList","metadata":{},
                "items":[{"metadata":{"name":"kai-agg","namespace":"kai-system"}}]});
            send.send_response(http::Response::new(kube::client::Body::from(
                body.to_string().into_bytes(),
            )));
            let (get, send) = handle.next_request().await.expect("a proxied GET");
            assert_eq!(
                get.uri().to_string(),
                "/api/v1/namespaces/kai-system/services/kai-agg:http-metrics/proxy/api/v1/containers?namespace=team-a"
            );
            let _ = get.into_body().collect().await;
            send.send_response(http::Response::new(kube::client::Body::from(
                br#"{"containers":[{"pod":"p"}]}"#.to_vec(),
            )));
        });
        let agg = Aggregator::discover(client, None, None)
            .await
            .expect("found");
        let got: kai_proto::v1::ClusterContainersResponse = agg
            .get("/api/v1/containers?namespace=team-a")
            .await
            .expect("answer");
        assert_eq!(got.containers[0].pod, "p");
        server.await.expect("mock server");
    }

    #[tokio::test]
    async fn says_when_the_chart_is_not_installed() {
        let (client, mut handle) = mock();
        tokio::spawn(async move {
            let (_, send) = handle.next_request().await.expect("a discovery request");
            let body = r#"{"apiVersion":"v1","kind":"ServiceList","metadata":{},"items":[]}"#;
            send.send_response(http::Response::new(kube::client::Body::from(
                body.as_bytes().to_vec(),
            )));
        });
        let err = Aggregator::discover(client, None, None)
            .await
            .err()
            .expect("an error");
        assert!(matches!(err, SourceError::NotInstalled), "{err}");
    }

    #[test]
    fn rejects_a_url_without_scheme() {
        assert!(matches!(
            Aggregator::direct("localhost:9394"),
            Err(SourceError::Url { .. })
        ));
        assert_eq!(query_value("team a/b"), "team%20a%2Fb");
    }
}
