//! Request bodies read whole under three bounds: a size limit per body, a
//! byte budget shared by every request of the process, and a deadline.
//!
//! A server that collects bodies before acting on them (the webhook's
//! reviews) holds each body's bytes until it answers; a client that sends
//! many large bodies, or stalls mid-body, would otherwise hold as much
//! memory as it likes. The budget hands out one permit per byte, never
//! waits (a request that finds no room is refused at once, as a
//! [`crate::limit::StreamLimit`] refuses a stream), and shows what is held
//! on a gauge handed in already registered.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use futures_util::{Stream, StreamExt};
use metrics::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes that all requests of a server may hold at once. Cheap to clone
/// (the clones share the bytes).
#[derive(Clone, Debug)]
pub struct ByteBudget {
    inner: Arc<Budget>,
}

#[derive(Debug)]
struct Budget {
    max: usize,
    permits: Arc<Semaphore>,
    held: Gauge,
}

impl ByteBudget {
    /// A budget of `max` bytes, showing the bytes held on `held`.
    pub fn new(max: usize, held: Gauge) -> Self {
        let max = max.min(Semaphore::MAX_PERMITS);
        Self {
            inner: Arc::new(Budget {
                max,
                permits: Arc::new(Semaphore::new(max)),
                held,
            }),
        }
    }

    /// The budget's size.
    pub fn max(&self) -> usize {
        self.inner.max
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.inner.max - self.inner.permits.available_permits()
    }

    /// `bytes` of the budget, now or never: waiting would let stalled
    /// requests hold everyone else up.
    pub fn try_acquire(&self, bytes: usize) -> Option<BytePermit> {
        let mut permit = BytePermit {
            permit: self.inner.permits.clone().try_acquire_many_owned(0).ok()?,
            budget: self.inner.clone(),
        };
        permit.grow_to(bytes).then_some(permit)
    }
}

/// Bytes held of a [`ByteBudget`]; given back (and the gauge lowered) on
/// drop.
#[derive(Debug)]
pub struct BytePermit {
    permit: OwnedSemaphorePermit,
    budget: Arc<Budget>,
}

impl BytePermit {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.permit.num_permits()
    }

    /// Holds at least `bytes` in all, taking what is missing from the
    /// budget; `false` (holding what it held) when that does not fit now.
    pub fn grow_to(&mut self, bytes: usize) -> bool {
        let more = bytes.saturating_sub(self.bytes());
        let Ok(n) = u32::try_from(more) else {
            return false;
        };
        match self.budget.permits.clone().try_acquire_many_owned(n) {
            Ok(permit) => {
                self.permit.merge(permit);
                self.budget.held.increment(more as f64);
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for BytePermit {
    fn drop(&mut self) {
        self.budget.held.decrement(self.bytes() as f64);
    }
}

/// How a request body is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyLimits {
    /// Largest body read whole.
    pub max_bytes: usize,
    /// Time to receive the whole body.
    pub timeout: Duration,
    /// First bytes a body over `max_bytes` keeps ([`Refusal::TooLarge`]),
    /// for a server that can still answer from them.
    pub keep_prefix: usize,
}

/// Why a body was not read whole.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Bigger than [`BodyLimits::max_bytes`]; its first bytes.
    TooLarge { prefix: Vec<u8> },
    /// No room left in the [`ByteBudget`].
    Overloaded,
    /// Not received within [`BodyLimits::timeout`].
    TimedOut,
    /// The connection failed mid-body.
    Broken(String),
}

/// Collects `body` within `limits`, holding a permit of `budget` per byte
/// read; returns the body and the permit, which the caller holds for as
/// long as it works on the body (and may grow: [`BytePermit::grow_to`]).
///
/// A body over the limit is read on (and discarded) up to twice the limit,
/// so the client gets its answer on a connection that stays usable, as
/// Go's net/http does; beyond that the connection is left to close.
pub async fn read<B: Buf, E: Display>(
    body: impl Stream<Item = Result<B, E>>,
    limits: &BodyLimits,
    budget: &ByteBudget,
) -> Result<(Vec<u8>, BytePermit), Refusal> {
    tokio::time::timeout(limits.timeout, collect(body, limits, budget))
        .await
        .unwrap_or(Err(Refusal::TimedOut))
}

async fn collect<B: Buf, E: Display>(
    body: impl Stream<Item = Result<B, E>>,
    limits: &BodyLimits,
    budget: &ByteBudget,
) -> Result<(Vec<u8>, BytePermit), Refusal> {
    let max = limits.max_bytes;
    let mut body = std::pin::pin!(body);
    let mut collected = Vec::new();
    let mut permit = budget.try_acquire(0).ok_or(Refusal::Overloaded)?;
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk.map_err(|e| Refusal::Broken(format!("cannot read body: {e}")))?;
        if collected.len() + chunk.remaining() > max {
            // The prefix may still be in this chunk when it is the first.
            let mut prefix = collected[..collected.len().min(limits.keep_prefix)].to_vec();
            let part = chunk.chunk();
            let want = limits.keep_prefix - prefix.len();
            prefix.extend_from_slice(&part[..part.len().min(want)]);
            drop((collected, permit));
            let mut read = max;
            while read <= max.saturating_mul(2) {
                match body.next().await {
                    Some(Ok(chunk)) => read += chunk.remaining(),
                    _ => break,
                }
            }
            return Err(Refusal::TooLarge { prefix });
        }
        if !permit.grow_to(collected.len() + chunk.remaining()) {
            return Err(Refusal::Overloaded);
        }
        while chunk.has_remaining() {
            let part = chunk.chunk();
            collected.extend_from_slice(part);
            let n = part.len();
            chunk.advance(n);
        }
    }
    Ok((collected, permit))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use bytes::Bytes;
    use futures_util::stream;

    use super::*;

    fn budget(max: usize) -> (Arc<AtomicU64>, ByteBudget) {
        let held = Arc::new(AtomicU64::new(0));
        (held.clone(), ByteBudget::new(max, Gauge::from_arc(held)))
    }

    fn gauge(cell: &AtomicU64) -> f64 {
        f64::from_bits(cell.load(Ordering::Relaxed))
    }

    const LIMITS: BodyLimits = BodyLimits {
        max_bytes: 10,
        timeout: Duration::from_secs(5),
        keep_prefix: 4,
    };

    fn chunks(parts: &[&'static str]) -> impl Stream<Item = Result<Bytes, String>> {
        stream::iter(parts.iter().map(|p| Ok(Bytes::from_static(p.as_bytes()))))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_and_holds_its_bytes_until_dropped() {
        let (held, budget) = budget(100);
        let (bytes, mut permit) = read(chunks(&["abc", "defg"]), &LIMITS, &budget)
            .await
            .expect("read");
        assert_eq!((bytes.as_slice(), permit.bytes()), (&b"abcdefg"[..], 7));
        assert_eq!((budget.held(), gauge(&held)), (7, 7.0));
        assert!(permit.grow_to(50), "room for 43 more");
        assert!(permit.grow_to(20), "already holds that much");
        assert!(!permit.grow_to(101), "more than the budget");
        assert_eq!(
            (permit.bytes(), budget.held(), gauge(&held)),
            (50, 50, 50.0)
        );
        drop(permit);
        assert_eq!((budget.held(), gauge(&held)), (0, 0.0));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_keeps_its_prefix_and_nothing_else() {
        let (held, budget) = budget(100);
        let refused = read(chunks(&["ab", "cdefghijk", "more"]), &LIMITS, &budget).await;
        assert_eq!(
            refused.map(|(bytes, _)| bytes),
            Err(Refusal::TooLarge {
                prefix: b"abcd".to_vec()
            })
        );
        let refused = read(chunks(&["abcdefghijk"]), &LIMITS, &budget).await;
        assert_eq!(
            refused.map(|(bytes, _)| bytes),
            Err(Refusal::TooLarge {
                prefix: b"abcd".to_vec()
            }),
            "a first chunk over the limit still gives its prefix"
        );
        assert_eq!((budget.held(), gauge(&held)), (0, 0.0));
    }

    #[tokio::test]
    async fn a_spent_budget_refuses_at_once_and_a_stalled_body_times_out() {
        let (_, budget) = budget(8);
        let (_, holding) = read(chunks(&["abcdef"]), &LIMITS, &budget)
            .await
            .expect("fits");
        let refused = read(chunks(&["abc"]), &LIMITS, &budget).await;
        assert_eq!(refused.map(|(bytes, _)| bytes), Err(Refusal::Overloaded));
        drop(holding);
        let broken = stream::iter([Ok(Bytes::from_static(b"a")), Err("reset")]);
        let refused = read(broken, &LIMITS, &budget).await;
        assert_eq!(
            refused.map(|(bytes, _)| bytes),
            Err(Refusal::Broken("cannot read body: reset".into()))
        );
        let stalled = chunks(&["ab"]).chain(stream::pending());
        let quick = BodyLimits {
            timeout: Duration::from_millis(20),
            ..LIMITS
        };
        let refused = read(stalled, &quick, &budget).await;
        assert_eq!(refused.map(|(bytes, _)| bytes), Err(Refusal::TimedOut));
        assert_eq!(budget.held(), 0);
    }
}
