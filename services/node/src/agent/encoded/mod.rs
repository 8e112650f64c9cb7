//! `WatchContainers` written from updates encoded once per revision.
//!
//! Every subscriber of a node (in practice one aggregator, now and then a
//! grpcurl) is sent the same update for a revision, and heartbeats repeat it
//! unchanged. Each revision's unfiltered update is therefore built and
//! encoded by prost once ([`to_pb::update`], `encode_to_vec`), kept with
//! the published [`NodeState`], and its bytes (`Bytes`, shared, not copied)
//! written into every stream and every heartbeat; a filtered stream encodes
//! its own once per revision. The generated server would instead take a
//! `ContainersUpdate` per message: a deep clone of every container's
//! strings per subscriber per heartbeat, or a re-encode.
//!
//! Only `sent_at_unix_ms` differs between messages: the cached bytes never
//! hold it (it is built as 0, which proto3 does not encode), and prost's
//! field encoder appends it. Protobuf parsers accept fields in any order,
//! so the result decodes to exactly the message that would have been built.
//!
//! The codec below passes those bytes through; the generated server still
//! serves every other method, and [`NodeServer`] routes only this path, so
//! reflection and health see one `VgpuNode`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes};
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_node_server::VgpuNodeServer;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Request, Response, Status};

use super::grpc::{self, Service};
use super::state::NodeState;
use super::to_pb;

/// The gRPC path this module serves.
const WATCH_PATH: &str = "/vgpu.v1.VgpuNode/WatchContainers";
/// `ContainersUpdate.sent_at_unix_ms`.
const SENT_AT_FIELD: u32 = 4;

/// One `ContainersUpdate` on the wire: the revision's bytes and the time.
#[derive(Clone, Debug)]
pub struct Encoded {
    body: Bytes,
    sent_at_ms: u64,
}

impl Encoded {
    /// The update of `state` for this filter, as it is sent at `sent_at_ms`.
    /// The unfiltered one comes from the state's cache (encoded at most once).
    pub fn of(state: &NodeState, namespace: &str, pod: &str, sent_at_ms: u64) -> Self {
        let body = if namespace.is_empty() && pod.is_empty() {
            state
                .encoded_update
                .get_or_init(|| encode_body(state, "", ""))
                .clone()
        } else {
            encode_body(state, namespace, pod)
        };
        Self { body, sent_at_ms }
    }

    /// The same update sent again later (a heartbeat).
    pub fn at(&self, sent_at_ms: u64) -> Self {
        Self {
            body: self.body.clone(),
            sent_at_ms,
        }
    }

    /// Writes the message's protobuf encoding.
    pub fn write_to(&self, dst: &mut impl BufMut) {
        dst.put_slice(&self.body);
        if self.sent_at_ms != 0 {
            prost::encoding::uint64::encode(SENT_AT_FIELD, &self.sent_at_ms, dst);
        }
    }

    /// Encoded length in bytes.
    pub fn len(&self) -> usize {
        self.body.len()
            + if self.sent_at_ms == 0 {
                0
            } else {
                prost::encoding::uint64::encoded_len(SENT_AT_FIELD, &self.sent_at_ms)
            }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Everything but the send time, as prost encodes it.
fn encode_body(state: &NodeState, namespace: &str, pod: &str) -> Bytes {
    let update = pb::ContainersUpdate {
        sent_at_unix_ms: 0,
        ..to_pb::update(state, namespace, pod)
    };
    Bytes::from(update.encode_to_vec())
}

/// Decodes requests with prost, writes [`Encoded`] responses as they are.
#[derive(Clone, Copy, Debug, Default)]
struct EncodedCodec;

#[derive(Clone, Copy, Debug, Default)]
struct EncodedEncoder;

impl Encoder for EncodedEncoder {
    type Item = Encoded;
    type Error = Status;

    fn encode(&mut self, item: Encoded, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.write_to(dst);
        Ok(())
    }
}

#[derive(Debug, Default)]
struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = pb::WatchContainersRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        pb::WatchContainersRequest::decode(src)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("bad WatchContainersRequest: {e}")))
    }
}

impl Codec for EncodedCodec {
    type Encode = Encoded;
    type Decode = pb::WatchContainersRequest;
    type Encoder = EncodedEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> EncodedEncoder {
        EncodedEncoder
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder
    }
}

/// The `WatchContainers` method over [`Encoded`] updates.
struct WatchSvc(Service);

impl tonic::server::ServerStreamingService<pb::WatchContainersRequest> for WatchSvc {
    type Response = Encoded;
    type ResponseStream = grpc::Updates<Encoded>;
    type Future =
        Pin<Box<dyn Future<Output = Result<Response<Self::ResponseStream>, Status>> + Send>>;

    fn call(&mut self, request: Request<pb::WatchContainersRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            let req = request.into_inner();
            let mut last: Option<Encoded> = None;
            Ok(Response::new(service.follow(
                req.interval_ms,
                move |state, fresh, now| {
                    let encoded = match (&last, fresh) {
                        (Some(previous), false) => previous.at(now),
                        _ => Encoded::of(state, &req.namespace, &req.pod, now),
                    };
                    last = Some(encoded.clone());
                    encoded
                },
            )?))
        })
    }
}

/// `vgpu.v1.VgpuNode`: `WatchContainers` from [`Encoded`] updates, every
/// other method through the generated server.
#[derive(Clone)]
pub(crate) struct NodeServer {
    service: Service,
    generated: VgpuNodeServer<Service>,
}

impl NodeServer {
    pub(crate) fn new(service: Service) -> Self {
        Self {
            generated: VgpuNodeServer::new(service.clone()),
            service,
        }
    }
}

impl tonic::server::NamedService for NodeServer {
    const NAME: &'static str = <VgpuNodeServer<Service> as tonic::server::NamedService>::NAME;
}

impl<B> tonic::codegen::Service<http::Request<B>> for NodeServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != WATCH_PATH {
            return self.generated.call(req);
        }
        let method = WatchSvc(self.service.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(EncodedCodec);
            Ok(grpc.server_streaming(method, req).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoded_update_decodes_to_the_built_one() {
        let state = crate::agent::grpc::tests::sample_state(12);
        for (namespace, pod) in [("", ""), ("team-3", ""), ("", "job-5-0")] {
            let encoded = Encoded::of(&state, namespace, pod, 1_796_000_123_456);
            let mut bytes = Vec::new();
            encoded.write_to(&mut bytes);
            assert_eq!(bytes.len(), encoded.len());
            let decoded = pb::ContainersUpdate::decode(bytes.as_slice()).expect("decodes");
            let built = pb::ContainersUpdate {
                sent_at_unix_ms: 1_796_000_123_456,
                ..grpc::update(&state, namespace, pod)
            };
            assert_eq!(decoded, built, "filter {namespace:?} {pod:?}");
            let unsent = pb::ContainersUpdate {
                sent_at_unix_ms: 0,
                ..built
            };
            assert_eq!(encoded.body, unsent.encode_to_vec(), "prost's bytes");
            assert!(!decoded.containers.is_empty());
        }
    }

    #[test]
    fn a_revision_is_encoded_once_and_heartbeats_only_change_the_time() {
        let state = crate::agent::grpc::tests::sample_state(3);
        let first = Encoded::of(&state, "", "", 1);
        let again = Encoded::of(&state, "", "", 2);
        assert!(
            first.body.as_ptr() == again.body.as_ptr(),
            "the cached bytes are shared"
        );
        let later = first.at(3);
        let decoded = pb::ContainersUpdate::decode(later.body.clone()).expect("decodes");
        assert_eq!(decoded.sent_at_unix_ms, 0, "the cached part has no time");
        let mut bytes = Vec::new();
        later.write_to(&mut bytes);
        let decoded = pb::ContainersUpdate::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(decoded.sent_at_unix_ms, 3);

        // A new revision is a new state; a copy never carries the cache.
        let next = NodeState {
            revision: state.revision + 1,
            ..state.clone()
        };
        let encoded = Encoded::of(&next, "", "", 4);
        let decoded = pb::ContainersUpdate::decode(encoded.body.clone()).expect("decodes");
        assert_eq!(decoded.revision, state.revision + 1);
    }
}
