//! Named limits on long-lived responses: watch streams, event streams,
//! metrics pages.
//!
//! Each open stream costs a file descriptor, a task and whatever it pins
//! (a state snapshot, rendered chunks), and a client may open as many as it
//! likes. A [`StreamLimit`] hands out an owned [`StreamPermit`] that the
//! response holds for as long as it lives; when every permit is out, the
//! next request is refused at once, never queued: a queued stream would
//! hold its connection anyway, which is the cost the limit is there to
//! bound. Refusals are counted and the open streams are a gauge, both
//! handed in already registered (on the service's recorder, so they show
//! from the start, at 0).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
#[cfg(feature = "grpc")]
use std::time::Duration;

use futures_util::Stream;
use metrics::{Counter, Gauge};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Seconds a refused HTTP client is asked to wait (`Retry-After`).
pub const RETRY_AFTER_SECONDS: u32 = 5;

/// At most `max` streams of one kind open at a time. Cheap to clone (the
/// clones share the permits).
#[derive(Clone, Debug)]
pub struct StreamLimit {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    stream: &'static str,
    max: usize,
    permits: Arc<Semaphore>,
    refusals: Counter,
    open: Gauge,
}

/// A stream refused because its limit was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("too many open {stream} streams (limit {max}); retry later")]
pub struct Refused {
    /// The limit's name (the `stream` label of its series).
    pub stream: &'static str,
    pub max: usize,
}

impl StreamLimit {
    /// A limit of `max` streams (at least 1) named `stream`, counting its
    /// refusals into `refusals` and its open streams into `open`.
    pub fn new(stream: &'static str, max: usize, refusals: Counter, open: Gauge) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            inner: Arc::new(Inner {
                stream,
                max,
                permits: Arc::new(Semaphore::new(max)),
                refusals,
                open,
            }),
        }
    }

    /// A permit for one more stream, or [`Refused`] (counted) when `max`
    /// are open. Never waits.
    pub fn try_acquire(&self) -> Result<StreamPermit, Refused> {
        match self.inner.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                self.inner.open.increment(1.0);
                Ok(StreamPermit {
                    _permit: permit,
                    open: self.inner.open.clone(),
                })
            }
            Err(_) => {
                self.inner.refusals.increment(1);
                tracing::debug!(
                    stream = self.inner.stream,
                    max = self.inner.max,
                    "stream refused: limit reached"
                );
                Err(Refused {
                    stream: self.inner.stream,
                    max: self.inner.max,
                })
            }
        }
    }

    /// The limit's name.
    pub fn stream(&self) -> &'static str {
        self.inner.stream
    }

    /// Streams allowed at once.
    pub fn max(&self) -> usize {
        self.inner.max
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.inner.max - self.inner.permits.available_permits()
    }
}

/// What a monitoring server (node agent, aggregator) bounds besides its own
/// streams: `/metrics` pages in flight, idle HTTP connections, and HTTP/2
/// streams per gRPC connection.
#[cfg(feature = "grpc")]
#[derive(Clone, Copy, Debug)]
pub struct ServeBounds {
    /// `/metrics` pages in flight at once; the next gets 503.
    pub max_concurrent_scrapes: usize,
    /// An HTTP connection without progress for this long is closed.
    pub http_idle_timeout: Duration,
    /// Per-connection gRPC settings.
    pub grpc: crate::grpc::ServerSettings,
}

#[cfg(feature = "grpc")]
impl ServeBounds {
    /// The defaults, with `max_concurrent_scrapes` scrapes at once.
    pub fn with_scrapes(max_concurrent_scrapes: usize) -> Self {
        Self {
            max_concurrent_scrapes,
            http_idle_timeout: Duration::from_secs(60),
            grpc: crate::grpc::ServerSettings::default(),
        }
    }
}

/// The flags of [`ServeBounds`], flattened into a service's command line;
/// `SCRAPES` is that service's default for `--max-concurrent-scrapes` (an
/// aggregator page is a whole cluster, an agent's one node).
#[cfg(feature = "grpc")]
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct ServeBoundArgs<const SCRAPES: u64> {
    /// /metrics pages served at once; the next gets 503 with Retry-After.
    #[arg(long, env = "MAX_CONCURRENT_SCRAPES", default_value_t = SCRAPES,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub max_concurrent_scrapes: u64,
    /// Seconds an HTTP connection may make no progress (a scraper that
    /// stopped reading, an idle keep-alive) before it is closed.
    #[arg(long, env = "HTTP_IDLE_TIMEOUT_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_seconds: u64,
    /// HTTP/2 streams one gRPC connection may have open at once.
    #[arg(long, env = "GRPC_MAX_CONCURRENT_STREAMS", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_concurrent_streams: u32,
}

#[cfg(feature = "grpc")]
impl<const SCRAPES: u64> ServeBoundArgs<SCRAPES> {
    /// The parsed bounds. clap has checked the ranges, far below
    /// `usize::MAX`.
    pub fn bounds(&self) -> ServeBounds {
        ServeBounds {
            max_concurrent_scrapes: usize::try_from(self.max_concurrent_scrapes)
                .unwrap_or(usize::MAX),
            http_idle_timeout: Duration::from_secs(self.http_idle_timeout_seconds),
            grpc: crate::grpc::ServerSettings {
                max_concurrent_streams: self.grpc_max_concurrent_streams,
            },
        }
    }
}

/// One open stream's place; given back (and the gauge lowered) on drop.
#[derive(Debug)]
pub struct StreamPermit {
    _permit: OwnedSemaphorePermit,
    open: Gauge,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        self.open.decrement(1.0);
    }
}

/// `stream`, holding `permit` until it is dropped: a response body that
/// keeps its place for as long as the server holds the body.
pub fn hold<S: Stream>(stream: S, permit: StreamPermit) -> Held<S> {
    Held {
        stream: Box::pin(stream),
        _permit: permit,
    }
}

/// A stream and the permit it holds (see [`hold`]).
pub struct Held<S> {
    stream: Pin<Box<S>>,
    _permit: StreamPermit,
}

impl<S: Stream> Stream for Held<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        self.stream.as_mut().poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.stream.size_hint()
    }
}

/// HTTP: 503 with `Retry-After`, and the reason as the body.
impl warp::Reply for Refused {
    fn into_response(self) -> warp::reply::Response {
        let reply =
            warp::reply::with_status(format!("{self}\n"), http::StatusCode::SERVICE_UNAVAILABLE);
        warp::reply::with_header(reply, http::header::RETRY_AFTER, RETRY_AFTER_SECONDS)
            .into_response()
    }
}

/// gRPC: `RESOURCE_EXHAUSTED`, which clients treat as "retry later".
#[cfg(feature = "grpc")]
impl From<Refused> for tonic::Status {
    fn from(refused: Refused) -> Self {
        tonic::Status::resource_exhausted(refused.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(max: usize) -> (metrics_util_free::Handles, StreamLimit) {
        let handles = metrics_util_free::Handles::default();
        let limit = StreamLimit::new(
            "test",
            max,
            Counter::from_arc(handles.refusals.clone()),
            Gauge::from_arc(handles.open.clone()),
        );
        (handles, limit)
    }

    /// Counter and gauge cells without a recorder.
    mod metrics_util_free {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};

        #[derive(Default)]
        pub struct Handles {
            pub refusals: Arc<AtomicU64>,
            pub open: Arc<AtomicU64>,
        }

        impl Handles {
            pub fn refusals(&self) -> u64 {
                self.refusals.load(Ordering::Relaxed)
            }

            pub fn open(&self) -> f64 {
                f64::from_bits(self.open.load(Ordering::Relaxed))
            }
        }
    }

    #[test]
    fn the_next_stream_past_the_limit_is_refused_and_counted_until_one_closes() {
        let (handles, limit) = limit(2);
        let a = limit.try_acquire().expect("first");
        let _b = limit.try_acquire().expect("second");
        assert_eq!(handles.open(), 2.0);
        assert_eq!(
            limit.try_acquire().map(drop),
            Err(Refused {
                stream: "test",
                max: 2
            })
        );
        assert_eq!(handles.refusals(), 1);
        assert_eq!(limit.open(), 2);
        drop(a);
        assert_eq!(handles.open(), 1.0);
        let _c = limit.try_acquire().expect("a closed stream makes room");
        assert_eq!(handles.refusals(), 1);
    }

    #[test]
    fn a_held_stream_keeps_its_permit_until_dropped() {
        let (handles, limit) = limit(1);
        let permit = limit.try_acquire().expect("first");
        let held = hold(futures_util::stream::iter([1, 2]), permit);
        assert!(limit.try_acquire().is_err());
        drop(held);
        assert_eq!(handles.open(), 0.0);
        assert!(limit.try_acquire().is_ok());
    }
}
