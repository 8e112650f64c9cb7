//! What the server wraps around the service for each connection: the
//! client's certificate put in every request, and every request marked in
//! flight until its response body is done (so a connection that streams a
//! long response is busy, not idle), and, once the server is draining,
//! `Connection: close` on HTTP/1.1 responses.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::header::{CONNECTION, HeaderValue};
use http::{Request, Response, Version};
use hyper::body::Incoming;

use super::slots::{Activity, InFlight};

/// The certificate a client presented in the TLS handshake, which the
/// server's client-certificate verifier accepted; in the extensions of
/// every request of that connection.
#[derive(Clone, Debug)]
pub struct PeerCertificate(pub Arc<rustls_pki_types::CertificateDer<'static>>);

/// `inner` as one connection sees it.
#[derive(Clone)]
pub(crate) struct PerConnection<S> {
    pub(crate) inner: S,
    pub(crate) certificate: Option<PeerCertificate>,
    /// The connection's activity, where it has a slot.
    pub(crate) activity: Option<Arc<Activity>>,
    /// Cancelled when the server starts draining: HTTP/1.1 requests from
    /// then on are the connection's last.
    pub(crate) draining: Option<tokio_util::sync::CancellationToken>,
}

impl<S, B> tower_service::Service<Request<Incoming>> for PerConnection<S>
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = Tracked<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Incoming>) -> Self::Future {
        if let Some(certificate) = &self.certificate {
            request.extensions_mut().insert(certificate.clone());
        }
        // HTTP/2 has no such header: its connections get a GOAWAY when
        // the server stops, which the client answers without losing a
        // request (streams it did not start are retried elsewhere).
        let last = request.version() < Version::HTTP_2
            && self
                .draining
                .as_ref()
                .is_some_and(tokio_util::sync::CancellationToken::is_cancelled);
        Tracked {
            in_flight: self.activity.as_ref().map(|activity| activity.begin()),
            last,
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// A response future whose request stays in flight; the mark moves to
    /// the response's body.
    pub(crate) struct Tracked<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
        // Answer with `Connection: close` (hyper then closes after it).
        last: bool,
    }
}

impl<F, B, E> Future for Tracked<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        if *this.last {
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        let in_flight = this.in_flight.take();
        Poll::Ready(Ok(response.map(|inner| TrackedBody {
            inner,
            _in_flight: in_flight,
        })))
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request in flight until hyper drops
    /// it, written or abandoned.
    pub(crate) struct TrackedBody<B> {
        #[pin]
        inner: B,
        _in_flight: Option<InFlight>,
    }
}

impl<B: http_body::Body> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
