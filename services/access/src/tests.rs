//! The decisions against a stand-in API server that answers reviews by a
//! table (the real one is in kind-tests/apiserver.py).

use http::{HeaderValue, StatusCode};
use serde_json::Value;

use super::stand_in::StandIn;
use super::*;

/// Tokens the stand-in knows: token -> (user, groups).
const TOKENS: &[(&str, &str)] = &[
    ("admin-token", "admin"),
    ("team-a-token", "alice"),
    ("nobody-token", "nobody"),
];

/// What each user may do.
fn allowed(user: &str, review: &Value) -> bool {
    let resource = &review["spec"]["resourceAttributes"];
    let non_resource = &review["spec"]["nonResourceAttributes"];
    match user {
        "admin" => true,
        "alice" => {
            resource["resource"] == "pods"
                && resource["namespace"] == "team-a"
                && resource["verb"] == "list"
        }
        "prometheus" => non_resource["path"] == "/metrics" && non_resource["verb"] == "get",
        _ => false,
    }
}

fn stand_in() -> (kube::Client, StandIn) {
    let api = StandIn::start(TOKENS, allowed);
    (api.client.clone(), api)
}

fn access(client: kube::Client, audiences: &[&str]) -> (Access, Recorder) {
    let recorder = Recorder::default();
    let settings = Settings {
        audiences: audiences.iter().map(|a| (*a).to_owned()).collect(),
        ..Settings::default()
    };
    (Access::kubernetes(client, settings, &recorder), recorder)
}

fn bearer(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
    );
    headers
}

#[test]
fn the_token_comes_from_our_header_first_then_authorization() {
    let mut headers = HeaderMap::new();
    assert_eq!(bearer_token(&headers), None);
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_static("Basic dXNlcg=="),
    );
    assert_eq!(bearer_token(&headers), None, "not a bearer token");
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_static("bearer  abc "),
    );
    assert_eq!(bearer_token(&headers), Some("abc"));
    headers.insert(PROXY_HEADER, HeaderValue::from_static("Bearer proxied"));
    assert_eq!(bearer_token(&headers), Some("proxied"));
    headers.insert(PROXY_HEADER, HeaderValue::from_static("Bearer "));
    assert_eq!(
        bearer_token(&headers),
        Some("abc"),
        "an empty one is no token"
    );
}

#[tokio::test]
async fn open_access_lets_anyone_see_everything() {
    let access = Access::open();
    let caller = access.caller(&HeaderMap::new()).await.expect("anyone");
    assert!(matches!(caller, Caller::Anyone));
    assert_eq!(
        access.scope(&caller, ["x"]).await.expect("scope"),
        Scope::Cluster
    );
    access
        .metrics_reader(&HeaderMap::new(), None)
        .await
        .expect("metrics open");
}

#[tokio::test]
async fn no_token_is_refused_without_asking() {
    let (client, api) = stand_in();
    let (access, _) = access(client, &[]);
    let e = access.caller(&HeaderMap::new()).await.expect_err("refused");
    assert!(matches!(e, AccessError::NoToken));
    assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
    assert!(
        e.response()
            .headers()
            .contains_key(http::header::WWW_AUTHENTICATE)
    );
    assert_eq!(api.requests(), 0);
}

#[tokio::test]
async fn an_unknown_token_is_refused_and_the_refusal_cached() {
    let (client, api) = stand_in();
    let (access, recorder) = access(client, &[]);
    for _ in 0..3 {
        let e = access.caller(&bearer("forged")).await.expect_err("refused");
        assert!(
            matches!(&e, AccessError::Unauthenticated(reason) if reason == "invalid bearer token"),
            "{e:?}"
        );
    }
    assert_eq!(api.requests(), 1, "asked once");
    let text = recorder.render();
    assert!(
        text.contains("kai_access_reviews_total{review=\"token\",result=\"denied\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kai_access_cache_hits_total{review=\"token\"} 2"),
        "{text}"
    );
}

#[tokio::test]
async fn a_token_for_another_audience_is_refused() {
    let (client, _api) = stand_in();
    let (access, _) = access(client, &["kai-aggregator"]);
    let e = access
        .caller(&bearer("admin-token"))
        .await
        .expect_err("refused");
    assert!(matches!(e, AccessError::Unauthenticated(_)), "{e:?}");
    let (client, _api) = stand_in();
    let (access, _) = super::tests::access(client, &["kai-aggregator", "api"]);
    access
        .caller(&bearer("admin-token"))
        .await
        .expect("one audience in common");
}

#[tokio::test]
async fn scopes_follow_the_api_servers_decisions() {
    let (client, api) = stand_in();
    let (access, _) = access(client, &[]);
    let namespaces = ["team-a", "team-b", "kube-system"];

    let admin = access.caller(&bearer("admin-token")).await.expect("admin");
    assert_eq!(admin.name(), "admin");
    assert_eq!(
        access.scope(&admin, namespaces).await.expect("scope"),
        Scope::Cluster
    );

    let alice = access.caller(&bearer("team-a-token")).await.expect("alice");
    let scope = access.scope(&alice, namespaces).await.expect("scope");
    assert_eq!(scope, Scope::Namespaces(["team-a".to_owned()].into()));
    assert!(scope.sees("team-a") && !scope.sees("team-b"));
    let e = access
        .require(&alice, Attributes::cluster())
        .await
        .expect_err("not cluster-wide");
    assert_eq!(
        e.to_string(),
        "alice may not list containers.vgpu.kai-resource-isolator.io at cluster scope"
    );
    assert_eq!(e.status(), StatusCode::FORBIDDEN);
    let e = access
        .metrics_reader(&bearer("team-a-token"), None)
        .await
        .expect_err("no metrics");
    assert!(matches!(e, AccessError::Forbidden { .. }));

    let nobody = access
        .caller(&bearer("nobody-token"))
        .await
        .expect("nobody");
    assert_eq!(
        access.scope(&nobody, namespaces).await.expect("scope"),
        Scope::Namespaces(BTreeSet::new())
    );

    // The same questions again: all from the cache.
    let asked = api.requests();
    access.scope(&alice, namespaces).await.expect("scope");
    access.scope(&nobody, namespaces).await.expect("scope");
    assert_eq!(api.requests(), asked);
}

#[tokio::test]
async fn the_api_server_failing_refuses_with_503_and_is_not_cached() {
    let (client, api) = stand_in();
    let (access, recorder) = access(client, &[]);
    api.set_down(true);
    let e = access
        .caller(&bearer("admin-token"))
        .await
        .expect_err("unavailable");
    assert!(matches!(e, AccessError::Unavailable(_)), "{e:?}");
    assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        e.response().headers().get(http::header::RETRY_AFTER),
        Some(&HeaderValue::from_static("5"))
    );
    api.set_down(false);
    let admin = access.caller(&bearer("admin-token")).await.expect("back");
    assert_eq!(admin.name(), "admin");
    assert!(
        recorder
            .render()
            .contains("kai_access_reviews_total{review=\"token\",result=\"error\"} 1")
    );
}
