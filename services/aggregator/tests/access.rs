//! Who may see what on the aggregator's HTTP and gRPC ports
//! (docs/security.md, "Access control"), with the API server's review
//! endpoints stood in for (the real API server: kind-tests/apiserver.py).
//! Every guarded route refuses a caller without a token, the open ones
//! carry no tenant's names, and a namespace-scoped caller sees its
//! namespace only, in every API.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::BodyExt;
use kai_access::stand_in::StandIn;
use kai_aggregator::cluster::Cluster;
use kai_aggregator::http::{self, Guard, ROUTES};
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_cluster_client::VgpuClusterClient;
use kai_proto::v1::vgpu_cluster_server::VgpuClusterServer;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const TOKENS: &[(&str, &str)] = &[
    ("admin-token", "admin"),
    ("team-a-token", "alice"),
    ("nobody-token", "nobody"),
    ("prometheus-token", "prometheus"),
];

/// admin: everything; alice: list pods in team-a; prometheus: get /metrics.
fn rule(user: &str, review: &Value) -> bool {
    let resource = &review["spec"]["resourceAttributes"];
    let non_resource = &review["spec"]["nonResourceAttributes"];
    match user {
        "admin" => true,
        "alice" => resource["resource"] == "pods" && resource["namespace"] == "team-a",
        "prometheus" => non_resource["path"] == "/metrics",
        _ => false,
    }
}

/// Names only the cluster view may show (a DRA share's among them: it is
/// part of its container, shown only with it).
const SECRETS: &[&str] = &[
    "team-b",
    "secret-pod",
    "secret-two",
    "miner",
    "secret-claim",
    "secret-share",
];

fn cluster() -> Cluster {
    let cluster = Cluster::default();
    cluster.add_endpoint("10.0.0.1:50051");
    let container = |ns: &str, pod: &str, gpu: &str| pb::ContainerUsage {
        namespace: ns.into(),
        pod: pod.into(),
        pod_uid: format!("uid-{pod}"),
        container: "main".into(),
        devices: vec![pb::DeviceUsage {
            uuid: gpu.into(),
            limit_bytes: 1 << 30,
            used_bytes: 1 << 20,
            ..Default::default()
        }],
        ..Default::default()
    };
    let with_share = |mut c: pb::ContainerUsage, claim: &str, share: &str| {
        c.dra_shares = vec![pb::DraShare {
            claim: claim.into(),
            request: "gpu".into(),
            share_id: share.into(),
            gpu_uuid: c.devices[0].uuid.clone(),
            granted_bytes: 1 << 30,
            ..Default::default()
        }];
        c
    };
    cluster.apply_update(
        "10.0.0.1:50051",
        pb::ContainersUpdate {
            node: "gpu-1".into(),
            revision: 1,
            containers: vec![
                with_share(
                    container("team-a", "train-pod", "GPU-a"),
                    "train-claim",
                    "train-share",
                ),
                with_share(
                    container("team-b", "secret-pod", "GPU-b"),
                    "secret-claim",
                    "secret-share",
                ),
                container("team-b", "secret-two", "GPU-a"),
            ],
            escaped_processes: vec![pb::EscapedProcess {
                namespace: "team-b".into(),
                pod: "miner".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    cluster.set_devices(
        "10.0.0.1:50051",
        ["GPU-a", "GPU-b"]
            .map(|uuid| pb::HostDevice {
                uuid: uuid.into(),
                memory_total_bytes: 80 << 30,
                ..Default::default()
            })
            .to_vec(),
    );
    cluster
}

struct Server {
    http: SocketAddr,
    grpc: SocketAddr,
    api: StandIn,
    shutdown: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn serve() -> Server {
    serve_with(None).await
}

async fn serve_with(tls: Option<Arc<rustls::ServerConfig>>) -> Server {
    kai_runtime::install_crypto_provider();
    let api = StandIn::start(TOKENS, rule);
    let cluster = Arc::new(cluster());
    let access = cluster
        .health()
        .access(api.client.clone(), kai_access::Settings::default());
    let shutdown = CancellationToken::new();
    let (listener, http) = kai_runtime::net::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let state = http::State {
        cluster: cluster.clone(),
        access: access.clone(),
        metrics_access: access.clone(),
        tls,
        legacy: false,
        synced: tokio::sync::watch::channel(true).1,
        limits: http::HttpLimits::new(
            cluster.health(),
            &kai_aggregator::AggregatorLimits::default(),
        ),
    };
    tokio::spawn(http::serve(listener, state, shutdown.clone()));
    let (listener, grpc) = kai_runtime::net::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let service = kai_aggregator::grpc::Service { cluster, access };
    type Grpc = VgpuClusterServer<kai_aggregator::grpc::Service>;
    let router = kai_runtime::grpc::router_with::<Grpc>(Default::default(), &[])
        .await
        .expect("router")
        .add_service(Grpc::new(service));
    tokio::spawn(kai_runtime::grpc::serve(
        router,
        listener,
        None,
        shutdown.clone(),
    ));
    Server {
        http,
        grpc,
        api,
        shutdown,
    }
}

/// GET `path` with `token` in `header`; the status and, unless it is the
/// event stream, the body.
async fn get(
    addr: SocketAddr,
    path: &str,
    auth: Option<(&str, &str)>,
) -> (u16, String, ::http::HeaderMap) {
    let url = format!("http://{addr}").parse().expect("url");
    let mut config = kube::Config::new(url);
    // The answer itself, not kube's retries of a 503 after Retry-After.
    config.default_retry = false;
    let client = kube::Client::try_from(config).expect("client");
    let mut request = ::http::Request::get(path);
    if let Some((header, token)) = auth {
        request = request.header(header, format!("Bearer {token}"));
    }
    let request = request
        .body(kube::client::Body::from(Vec::new()))
        .expect("request");
    let response = client.send(request).await.expect("response");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    if path.ends_with("/events") && status == 200 {
        return (status, String::new(), headers);
    }
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned(), headers)
}

#[tokio::test]
async fn no_guarded_route_answers_without_a_token_and_open_ones_carry_no_names() {
    let server = serve().await;
    let mut guarded = 0;
    // Every route there is, and paths nobody routed: under /api/ they are
    // refused before they are found missing.
    let unrouted = [
        ("/api/v2/secrets", Guard::Caller),
        ("/api/v1/containers/x", Guard::Caller),
    ];
    for (path, guard) in ROUTES.iter().copied().chain(unrouted) {
        let (status, body, headers) = get(server.http, path, None).await;
        match guard {
            Guard::Open => {
                assert_eq!(status, 200, "{path}");
                for name in SECRETS.iter().chain(&["train-pod", "team-a"]) {
                    assert!(!body.contains(name), "{path} names {name}");
                }
            }
            Guard::Metrics | Guard::Caller => {
                guarded += 1;
                assert_eq!(status, 401, "{path}: {body}");
                assert!(
                    headers.contains_key(::http::header::WWW_AUTHENTICATE),
                    "{path}"
                );
                assert!(body.contains("no bearer token"), "{path}: {body}");
                // A token the API server does not know: refused too.
                let (status, body, _) =
                    get(server.http, path, Some(("authorization", "forged"))).await;
                assert_eq!(status, 401, "{path}: {body}");
            }
        }
    }
    assert!(guarded >= 7, "the table lists the data routes");
    let (status, _, _) = get(
        server.http,
        "/api/v2/secrets",
        Some(("authorization", "admin-token")),
    )
    .await;
    assert_eq!(status, 404, "known, then not found");
}

#[tokio::test]
async fn a_tenant_sees_its_namespace_in_every_http_api() {
    let server = serve().await;
    let alice = Some(("x-kai-authorization", "team-a-token"));
    for path in [
        "/api/v1/containers",
        "/api/v1/nodes",
        "/api/v1/devices",
        "/api/v1/view",
    ] {
        let (status, body, _) = get(server.http, path, alice).await;
        assert_eq!(status, 200, "{path}: {body}");
        for name in SECRETS.iter().chain(&["GPU-b", "10.0.0.1"]) {
            assert!(!body.contains(name), "{path} shows alice {name}: {body}");
        }
        let (status, admin_body, _) =
            get(server.http, path, Some(("authorization", "admin-token"))).await;
        assert_eq!(status, 200, "{path}");
        let whole = if path == "/api/v1/nodes" {
            "\"containers\":3"
        } else {
            "GPU-b"
        };
        assert!(
            admin_body.contains(whole),
            "{path}: the admin sees the cluster: {admin_body}"
        );
    }
    let (_, body, _) = get(server.http, "/api/v1/containers", alice).await;
    assert!(body.contains("train-pod"), "{body}");
    // Alice's own share, with her container, on both routes that show shares.
    for path in ["/api/v1/containers", "/api/v1/view"] {
        let (_, body, _) = get(server.http, path, alice).await;
        assert!(
            body.contains("train-claim") && body.contains("train-share"),
            "{path}: {body}"
        );
    }
    let (_, body, _) = get(server.http, "/api/v1/devices", alice).await;
    let devices: pb::ClusterDevicesResponse = serde_json::from_str(&body).expect("JSON");
    assert_eq!(devices.devices.len(), 1, "only the GPU alice uses: {body}");
    assert_eq!(devices.devices[0].uuid, "GPU-a");
    let (_, view, _) = get(server.http, "/api/v1/view", alice).await;
    let view: kai_vocab::api::View = serde_json::from_str(&view).expect("JSON");
    let view_gpu = view
        .nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .find(|g| g.uuid == "GPU-a")
        .expect("GPU-a in alice's view");
    assert_eq!(
        devices.devices[0].headroom_bytes, view_gpu.headroom,
        "one headroom for alice on every route"
    );
    assert_eq!(
        devices.devices[0].containers, 1,
        "team-b's container on the same GPU is not counted: {body}"
    );
    assert_eq!(
        devices.devices[0].headroom_bytes,
        (80u64 << 30) - (1 << 30),
        "the headroom of alice's own cap"
    );
    let (_, body, _) = get(server.http, "/api/v1/nodes", alice).await;
    assert!(
        body.contains("\"containers\":1"),
        "node figures of alice's own: {body}"
    );
    let (status, body, _) = get(server.http, "/api/v1/containers?namespace=team-b", alice).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("alice may not list"), "{body}");
    let (status, body, _) = get(
        server.http,
        "/api/v1/containers",
        Some(("authorization", "nobody-token")),
    )
    .await;
    assert_eq!(status, 200);
    let seen: pb::ClusterContainersResponse = serde_json::from_str(&body).expect("JSON");
    assert!(
        seen.containers.is_empty() && seen.escaped_processes.is_empty(),
        "{body}"
    );
    let (status, _, _) = get(server.http, "/api/v1/view/events", alice).await;
    assert_eq!(status, 200, "a known caller follows the change events");

    // /metrics: Prometheus' token, not the tenant's.
    let (status, body, _) = get(server.http, "/metrics", alice).await;
    assert_eq!(status, 403, "{body}");
    let (status, body, _) = get(
        server.http,
        "/metrics",
        Some(("authorization", "prometheus-token")),
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("secret-pod"), "the scrape is whole");
    assert!(
        body.contains("kai_access_reviews_total"),
        "the checks are counted"
    );

    // The API server failing: 503, then back.
    server.api.set_down(true);
    let (status, body, headers) = get(
        server.http,
        "/api/v1/nodes",
        Some(("authorization", "fresh-token")),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(headers.contains_key(::http::header::RETRY_AFTER));
    server.api.set_down(false);
    let (status, _, _) = get(
        server.http,
        "/api/v1/nodes",
        Some(("authorization", "admin-token")),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn grpc_methods_check_the_caller_too() {
    let server = serve().await;
    let mut client = VgpuClusterClient::connect(format!("http://{}", server.grpc))
        .await
        .expect("connect");
    let with = |token: Option<&str>, namespace: &str| {
        let mut request = tonic::Request::new(pb::ClusterContainersRequest {
            namespace: namespace.into(),
            ..Default::default()
        });
        if let Some(token) = token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("metadata"),
            );
        }
        request
    };
    let refused = client
        .list_containers(with(None, ""))
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let mut nodes = tonic::Request::new(pb::ListNodesRequest {});
    nodes
        .metadata_mut()
        .insert("authorization", "Bearer forged".parse().expect("metadata"));
    assert_eq!(
        client.list_nodes(nodes).await.expect_err("forged").code(),
        tonic::Code::Unauthenticated
    );
    let devices = tonic::Request::new(pb::ClusterDevicesRequest::default());
    assert_eq!(
        client
            .list_devices(devices)
            .await
            .expect_err("no token")
            .code(),
        tonic::Code::Unauthenticated
    );

    let seen = client
        .list_containers(with(Some("team-a-token"), ""))
        .await
        .expect("alice")
        .into_inner();
    let pods: Vec<&str> = seen.containers.iter().map(|c| c.pod.as_str()).collect();
    assert_eq!(pods, ["train-pod"]);
    assert!(seen.escaped_processes.is_empty());
    let claims: Vec<&str> = seen
        .containers
        .iter()
        .flat_map(|c| &c.dra_shares)
        .map(|s| s.claim.as_str())
        .collect();
    assert_eq!(
        claims,
        ["train-claim"],
        "team-b's share stays with its container"
    );
    let denied = client
        .list_containers(with(Some("team-a-token"), "team-b"))
        .await
        .expect_err("team-b");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    let all = client
        .list_containers(with(Some("admin-token"), ""))
        .await
        .expect("admin")
        .into_inner();
    assert_eq!(all.containers.len(), 3);
    assert_eq!(all.escaped_processes.len(), 1);
}

/// PEM pairs as rustls wants them.
fn pem_chain(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.expect("certificate PEM"))
        .collect()
}

fn pem_key(pem: &str) -> rustls::pki_types::PrivateKeyDer<'static> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::PrivateKeyDer::from_pem_slice(pem.as_bytes()).expect("key PEM")
}

#[tokio::test]
async fn a_client_certificate_of_the_client_ca_names_its_caller() {
    use kai_runtime::https::Client;
    kai_runtime::install_crypto_provider();
    let server =
        kai_runtime::tls::generate("localhost", &["localhost".to_owned()], 1).expect("server cert");
    // The "cluster CA" and a user's certificate from it (CN alice).
    let users = kai_runtime::tls::generate("alice", &[], 1).expect("client cert");
    let dir = tempfile::tempdir().expect("tempdir");
    server.write_to(dir.path()).expect("write");
    let cert = kai_runtime::tls::ReloadingCert::load(
        &dir.path().join("tls.crt"),
        &dir.path().join("tls.key"),
    )
    .expect("load");
    let tls = kai_runtime::tls::server_config_for(
        cert,
        &[b"http/1.1"],
        kai_runtime::tls::ClientCerts::Optional(users.ca_cert_pem.as_bytes()),
    )
    .expect("server config");
    let server_side = serve_with(Some(Arc::new(tls))).await;

    let roots = {
        let mut roots = rustls::RootCertStore::empty();
        for c in pem_chain(&server.ca_cert_pem) {
            roots.add(c).expect("root");
        }
        Arc::new(roots)
    };
    let builder = || rustls::ClientConfig::builder().with_root_certificates(roots.clone());
    let with_cert = |cert: &str, key: &str| {
        Arc::new(
            builder()
                .with_client_auth_cert(pem_chain(cert), pem_key(key))
                .expect("client config"),
        )
    };
    let addr = server_side.http;
    let get = move |config: Arc<rustls::ClientConfig>, path: &'static str| async move {
        let mut client = Client::connect(addr, "localhost", config).await?;
        client
            .send(::http::Method::GET, path, Default::default())
            .await
    };

    let (status, body) = get(
        with_cert(&users.cert_pem, &users.key_pem),
        "/api/v1/containers",
    )
    .await
    .expect("alice's certificate");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let seen: pb::ClusterContainersResponse = serde_json::from_slice(&body).expect("JSON");
    let pods: Vec<&str> = seen.containers.iter().map(|c| c.pod.as_str()).collect();
    assert_eq!(pods, ["train-pod"], "alice (CN) sees team-a only");

    let plain = Arc::new(builder().with_no_client_auth());
    let (status, _) = get(plain, "/api/v1/containers")
        .await
        .expect("no certificate");
    assert_eq!(status, 401, "neither a certificate nor a token");

    // A certificate of another CA (the server's): the handshake fails.
    let refused = get(
        with_cert(&server.cert_pem, &server.key_pem),
        "/api/v1/containers",
    )
    .await;
    assert!(refused.is_err(), "a foreign client certificate was served");
}
