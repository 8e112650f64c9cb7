//! Who holds the server's connections, and which one gives way when they
//! are all taken.
//!
//! A connection that finished its TLS handshake and then sends nothing
//! costs its client nothing and, without this, holds one of the server's
//! places until the client closes it. Anyone who can reach the port could
//! hold them all, and every admission review after would be refused. So
//! each connection holds a [`Slot`] that knows whether a request is in
//! flight on it, and when the server is full:
//!
//! - a client at its own bound (`max_per_client`) makes room among its own
//!   connections, or is refused: one client never holds every place;
//! - otherwise the idle connection of the client holding the most
//!   connections gives way (the longest idle among them): a flood from a
//!   few addresses makes room for itself at its own expense, never at that
//!   of the API server's one or two connections;
//! - a connection with a request in flight never gives way; when every
//!   connection is busy the new one is refused.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a new connection was not let in, or what was done to let it in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Shed {
    /// Every connection is busy: the new one is closed at once.
    Connections,
    /// The client holds its bound of connections and all of them are busy.
    ClientConnections,
    /// An idle connection was closed to make room for a new one.
    IdleConnection,
}

impl Shed {
    /// The metric label value for this reason (the variant in snake case;
    /// services list every one up front with `Shed::iter()`).
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What a connection is doing, shared by its serving task (which closes
/// it when told to give way or when it idled too long) and its requests
/// (which mark it busy).
#[derive(Debug)]
pub(crate) struct Activity {
    in_flight: AtomicUsize,
    /// When the last request ended (or the connection was accepted).
    idle_since: Mutex<Instant>,
    /// Cancelled when this connection must make room for another.
    give_way: CancellationToken,
}

impl Activity {
    fn new(now: Instant) -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(now),
            give_way: CancellationToken::new(),
        }
    }

    fn idle_since(&self) -> MutexGuard<'_, Instant> {
        // A panic while holding this lock leaves a valid Instant behind.
        self.idle_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How long the connection has had no request in flight, as of `now`;
    /// `None` while one is.
    pub(crate) fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(now.saturating_duration_since(*self.idle_since()))
    }

    /// Marks a request in flight until the returned guard is dropped (when
    /// the response body has been handed to the connection, or abandoned).
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// Resolves when this connection must give way to a new one.
    pub(crate) async fn told_to_give_way(&self) {
        self.give_way.cancelled().await;
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        // Idle from now on: set the time before the count reaches zero, so
        // nobody sees zero in flight with the old time.
        *self.0.idle_since() = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Open {
    client: IpAddr,
    activity: Arc<Activity>,
}

#[derive(Default)]
struct Held {
    next_id: u64,
    open: HashMap<u64, Open>,
    per_client: HashMap<IpAddr, usize>,
}

impl Held {
    fn remove(&mut self, id: u64) -> Option<Open> {
        let open = self.open.remove(&id)?;
        if let Some(count) = self.per_client.get_mut(&open.client) {
            *count -= 1;
            if *count == 0 {
                self.per_client.remove(&open.client);
            }
        }
        Some(open)
    }

    /// The idle connection that gives way: among those `eligible`, the one
    /// whose client holds the most connections, then the longest idle.
    fn victim(&self, now: Instant, eligible: impl Fn(&Open) -> bool) -> Option<u64> {
        self.open
            .iter()
            .filter(|(_, open)| eligible(open))
            .filter_map(|(id, open)| {
                let idle = open.activity.idle_for(now)?;
                let held = self.per_client.get(&open.client).copied().unwrap_or(0);
                Some(((held, idle), *id))
            })
            .max_by_key(|(rank, _)| *rank)
            .map(|(_, id)| id)
    }
}

/// The server's connection places.
pub(crate) struct Slots {
    max_total: usize,
    max_per_client: usize,
    held: Mutex<Held>,
}

/// A place held by one connection, given back when dropped.
pub(crate) struct Slot {
    id: u64,
    slots: Arc<Slots>,
    pub(crate) activity: Arc<Activity>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.held().remove(self.id);
    }
}

impl Slots {
    pub(crate) fn new(max_total: usize, max_per_client: usize) -> Arc<Self> {
        Arc::new(Self {
            max_total: max_total.max(1),
            max_per_client: max_per_client.max(1),
            held: Mutex::default(),
        })
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // Every update leaves the maps consistent before anything can
        // panic, so a poisoned lock still holds a valid state.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a new connection from `client`, making room by telling
    /// an idle connection to give way if needed (reported as
    /// [`Shed::IdleConnection`] beside the slot), or why there is none.
    pub(crate) fn admit(self: &Arc<Self>, client: IpAddr) -> Result<(Slot, Option<Shed>), Shed> {
        let now = Instant::now();
        let mut held = self.held();
        let mine = held.per_client.get(&client).copied().unwrap_or(0);
        let room = if mine >= self.max_per_client {
            Some(
                held.victim(now, |open| open.client == client)
                    .ok_or(Shed::ClientConnections)?,
            )
        } else if held.open.len() >= self.max_total {
            Some(held.victim(now, |_| true).ok_or(Shed::Connections)?)
        } else {
            None
        };
        let gave_way = room.and_then(|id| held.remove(id)).map(|open| {
            // Its task closes it; its place is already free.
            open.activity.give_way.cancel();
            Shed::IdleConnection
        });
        let id = held.next_id;
        held.next_id += 1;
        let activity = Arc::new(Activity::new(now));
        held.open.insert(
            id,
            Open {
                client,
                activity: activity.clone(),
            },
        );
        *held.per_client.entry(client).or_default() += 1;
        Ok((
            Slot {
                id,
                slots: self.clone(),
                activity,
            },
            gave_way,
        ))
    }

    #[cfg(test)]
    fn count(&self) -> (usize, usize) {
        let held = self.held();
        (held.open.len(), held.per_client.values().sum())
    }
}

#[cfg(test)]
mod tests {
    use strum::IntoEnumIterator;

    use super::*;

    /// The `reason` values of the services' `shed_total` series.
    #[test]
    fn shed_labels_stay_what_dashboards_select() {
        let labels: Vec<_> = Shed::iter().map(Shed::as_str).collect();
        assert_eq!(
            labels,
            ["connections", "client_connections", "idle_connection"]
        );
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[tokio::test(start_paused = true)]
    async fn under_the_bounds_everyone_is_let_in() {
        let slots = Slots::new(3, 2);
        let (_a, shed) = slots.admit(ip(1)).expect("room");
        assert_eq!(shed, None);
        let (_b, shed) = slots.admit(ip(1)).expect("room");
        assert_eq!(shed, None);
        let (_c, shed) = slots.admit(ip(2)).expect("room");
        assert_eq!(shed, None);
        assert_eq!(slots.count(), (3, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_server_refuses_and_a_dropped_slot_frees_its_place() {
        let slots = Slots::new(2, 2);
        let (a, _) = slots.admit(ip(1)).expect("room");
        let (b, _) = slots.admit(ip(2)).expect("room");
        let _busy_a = a.activity.begin();
        let _busy_b = b.activity.begin();
        assert_eq!(slots.admit(ip(3)).err(), Some(Shed::Connections));
        drop(a);
        assert_eq!(slots.count(), (1, 1));
        let (_c, shed) = slots.admit(ip(3)).expect("room after a close");
        assert_eq!(shed, None);
    }

    #[tokio::test(start_paused = true)]
    async fn one_client_at_its_bound_makes_room_among_its_own_or_is_refused() {
        let slots = Slots::new(10, 2);
        let (a, _) = slots.admit(ip(1)).expect("room");
        let (b, _) = slots.admit(ip(1)).expect("room");
        let (other, _) = slots.admit(ip(2)).expect("room");
        let busy_a = a.activity.begin();
        let busy_b = b.activity.begin();
        assert_eq!(slots.admit(ip(1)).err(), Some(Shed::ClientConnections));
        // The other client's idle connection is not the one to give way.
        assert!(!other.activity.give_way.is_cancelled());
        drop(busy_b);
        let (_c, shed) = slots.admit(ip(1)).expect("its own idle one gave way");
        assert_eq!(shed, Some(Shed::IdleConnection));
        assert!(b.activity.give_way.is_cancelled());
        assert!(!a.activity.give_way.is_cancelled());
        assert!(!other.activity.give_way.is_cancelled());
        drop(busy_a);
        // The slot that gave way no longer counts, nor does its drop later.
        assert_eq!(slots.count(), (3, 3));
        drop(b);
        assert_eq!(slots.count(), (3, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn when_full_the_biggest_holders_idle_connection_gives_way() {
        let slots = Slots::new(4, 4);
        let (apiserver, _) = slots.admit(ip(1)).expect("room");
        let mut flood = Vec::new();
        for _ in 0..3 {
            flood.push(slots.admit(ip(9)).expect("room").0);
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // The API server's connection is the longest idle, but its client
        // holds one place against the flood's three.
        let (_new, shed) = slots.admit(ip(2)).expect("room");
        assert_eq!(shed, Some(Shed::IdleConnection));
        assert!(!apiserver.activity.give_way.is_cancelled());
        // Of the flood's, the longest idle went.
        assert!(flood[0].activity.give_way.is_cancelled());
        assert!(!flood[1].activity.give_way.is_cancelled());
        assert_eq!(slots.count(), (4, 4));
    }

    #[tokio::test(start_paused = true)]
    async fn idleness_counts_from_the_end_of_the_last_request() {
        let slots = Slots::new(4, 4);
        let (slot, _) = slots.admit(ip(1)).expect("room");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            slot.activity.idle_for(Instant::now()),
            Some(Duration::from_secs(5))
        );
        let request = slot.activity.begin();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(slot.activity.idle_for(Instant::now()), None);
        drop(request);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            slot.activity.idle_for(Instant::now()),
            Some(Duration::from_secs(1))
        );
    }
}
