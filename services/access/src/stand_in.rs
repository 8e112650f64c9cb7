//! A stand-in for the API server's review endpoints, for unit tests of
//! the services that check callers (the real API server answers in
//! kind-tests/apiserver.py). It knows a table of tokens and answers
//! access reviews with a rule.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::{Value, json};

/// Decides a `SubjectAccessReview` of `user` (the review as JSON).
pub type Rule = fn(user: &str, review: &Value) -> bool;

/// Answers reviews until dropped; [`StandIn::client`] talks to it.
pub struct StandIn {
    pub client: kube::Client,
    requests: Arc<AtomicUsize>,
    down: Arc<AtomicBool>,
}

impl StandIn {
    /// Knows `tokens` (token, user name), each issued for the audience
    /// "api" only, and allows what `rule` allows.
    pub fn start(tokens: &[(&str, &str)], rule: Rule) -> Self {
        let tokens: Vec<(String, String)> = tokens
            .iter()
            .map(|(t, u)| ((*t).to_owned(), (*u).to_owned()))
            .collect();
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let requests = Arc::new(AtomicUsize::new(0));
        let down = Arc::new(AtomicBool::new(false));
        let (counted, is_down) = (requests.clone(), down.clone());
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                counted.fetch_add(1, Ordering::SeqCst);
                if is_down.load(Ordering::SeqCst) {
                    let failure = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                         "message": "etcdserver: request timed out", "code": 500});
                    let mut response = Response::new(Body::from(failure.to_string().into_bytes()));
                    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    respond.send_response(response);
                    continue;
                }
                let path = request.uri().path().to_owned();
                let Ok(body) = request.into_body().collect().await else {
                    continue;
                };
                let Ok(mut review) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
                    continue;
                };
                review["status"] = if path.ends_with("/tokenreviews") {
                    token_review(&tokens, &review)
                } else {
                    let user = review["spec"]["user"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    json!({"allowed": rule(&user, &review)})
                };
                respond.send_response(Response::new(Body::from(review.to_string().into_bytes())));
            }
        });
        Self {
            client: kube::Client::new(service, "default"),
            requests,
            down,
        }
    }

    /// Reviews asked so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// From now on every review fails with 500 (`true`), or is answered.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
}

fn token_review(tokens: &[(String, String)], review: &Value) -> Value {
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    let audiences = &review["spec"]["audiences"];
    let for_api = audiences.is_null()
        || audiences
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "api"));
    match tokens.iter().find(|(t, _)| t == token) {
        Some((_, user)) if for_api => json!({
            "authenticated": true, "audiences": ["api"],
            "user": {"username": user, "uid": format!("uid-{user}"), "groups": ["system:authenticated"]}
        }),
        _ => json!({"authenticated": false, "error": "invalid bearer token"}),
    }
}
