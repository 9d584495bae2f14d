//! Auto-renewal: a PushConsumer's messages stay invisible while its client lives.
//!
//! Every official PushConsumer receives with `auto_renew` and no invisible
//! duration: it asks the server to keep what it was given invisible for as
//! long as its listener needs, and to let it come back if the client goes
//! away. So a message received that way is **leased** to the client that
//! asked (named by its `x-mq-client-id` header). While the client holds a
//! telemetry stream open, a renewer pushes each lease's invisibility timer
//! [`RenewPolicy::invisible`] further out whenever it is within
//! [`RenewPolicy::ahead`] of coming due, for at most
//! [`RenewPolicy::max_hold`] in all (then the message comes back, as it
//! would from a client whose listener hangs).
//!
//! A lease ends when its message is acked or its invisible duration is
//! changed (a nack: the client took the timer over), when the client sends
//! `NotifyClientTermination`, or when its last telemetry stream closes. Then
//! nothing renews it and the message comes back when its timer fires, at most
//! one invisible duration later. A renewal is a reschedule of the timer, as
//! durable as any; the leases themselves live in memory, so after a restart a
//! leased message comes back when its last renewal ends.
//!
//! A renewal and a change of the same timer must not interleave (the renewal
//! would undo the nack's due time): both hold [`Renewals::exclusive`] around
//! their look at the lease and their reschedule.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use delaywheel::{Clock, Handle, RescheduleOutcome, Store, SystemClock};

/// The header naming the client a request comes from (every official client sends it).
pub const CLIENT_ID: &str = "x-mq-client-id";

/// How leases are renewed.
#[derive(Debug, Clone, Copy)]
pub struct RenewPolicy {
    /// How long a received message stays invisible per renewal, when the
    /// receive names no duration: 60 s, as RocketMQ's proxy.
    pub invisible: Duration,
    /// How close to its due time a lease is renewed.
    pub ahead: Duration,
    /// The longest a message is held by renewals in all.
    pub max_hold: Duration,
}

impl RenewPolicy {
    /// 60 s slices, renewed 10 s ahead, for at most 3 h.
    pub const DEFAULT: Self = Self {
        invisible: Duration::from_secs(60),
        ahead: Duration::from_secs(10),
        max_hold: Duration::from_secs(3 * 3600),
    };

    /// How often the renewer looks: often enough that a lease within
    /// `ahead` of its due time is renewed well before it.
    fn tick(&self) -> Duration {
        (self.ahead / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
}

/// One leased message: its timer, when that is due now, and for how long.
#[derive(Debug, Clone, Copy)]
struct Lease {
    due_ms: u64,
    invisible: Duration,
    /// When the client received it: renewals stop [`RenewPolicy::max_hold`] after.
    since_ms: u64,
}

/// A client's telemetry streams open now, and its leases.
#[derive(Default)]
struct Client {
    streams: usize,
    leases: HashMap<Handle, Lease>,
}

/// The leases of every client.
pub(crate) struct Renewals {
    policy: RenewPolicy,
    clients: Mutex<HashMap<String, Client>>,
    exclusive: Mutex<()>,
}

/// A lease to renew now.
pub(crate) struct Due {
    client: String,
    timer: Handle,
    invisible: Duration,
}

impl Renewals {
    pub fn new(policy: RenewPolicy) -> Self {
        Self { policy, clients: Mutex::default(), exclusive: Mutex::default() }
    }

    pub fn policy(&self) -> RenewPolicy {
        self.policy
    }

    fn clients(&self) -> MutexGuard<'_, HashMap<String, Client>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Held around a look at a lease and the reschedule that follows (see the module).
    pub fn exclusive(&self) -> MutexGuard<'_, ()> {
        self.exclusive.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `client` opened a telemetry stream; the returned guard closes it.
    pub fn connect(self: &Arc<Self>, client: &str) -> Connection {
        self.clients().entry(client.to_string()).or_default().streams += 1;
        Connection { renewals: Arc::clone(self), client: client.to_string() }
    }

    fn disconnect(&self, client: &str) {
        let mut clients = self.clients();
        let Some(entry) = clients.get_mut(client) else { return };
        debug_assert!(entry.streams > 0, "a stream closes once");
        entry.streams -= 1;
        if entry.streams == 0 {
            // Its messages come back when their timers fire.
            clients.remove(client);
        }
    }

    /// Leases `timers` (each due when its handle says) to `client`, if it
    /// holds a telemetry stream open: a client without one is not renewed.
    pub fn lease(&self, client: &str, timers: impl IntoIterator<Item = Handle>, invisible: Duration) {
        let now_ms = SystemClock.now_ms();
        let mut clients = self.clients();
        let Some(entry) = clients.get_mut(client) else { return };
        for timer in timers {
            entry.leases.insert(timer, Lease { due_ms: timer.deliver_at_ms, invisible, since_ms: now_ms });
        }
    }

    /// Ends the lease of `timer` (acked or changed), whichever client holds it.
    pub fn release(&self, client: Option<&str>, timer: Handle) {
        let mut clients = self.clients();
        match client.and_then(|c| clients.get_mut(c)) {
            Some(entry) => {
                entry.leases.remove(&timer);
            }
            // Its client did not say who it is: look at all.
            None => clients.values_mut().for_each(|entry| {
                entry.leases.remove(&timer);
            }),
        }
    }

    /// Ends every lease of `client` (it said it is going away).
    pub fn terminate(&self, client: &str) {
        if let Some(entry) = self.clients().get_mut(client) {
            entry.leases.clear();
        }
    }

    /// The leases within [`RenewPolicy::ahead`] of their due time at
    /// `now_ms`; those held [`RenewPolicy::max_hold`] already are ended instead.
    fn due(&self, now_ms: u64) -> Vec<Due> {
        let ahead = self.policy.ahead.as_millis() as u64;
        let max_hold = self.policy.max_hold.as_millis() as u64;
        let mut due = Vec::new();
        for (client, entry) in self.clients().iter_mut() {
            entry.leases.retain(|_, lease| now_ms.saturating_sub(lease.since_ms) < max_hold);
            for (&timer, lease) in &entry.leases {
                if lease.due_ms <= now_ms.saturating_add(ahead) {
                    due.push(Due { client: client.clone(), timer, invisible: lease.invisible });
                }
            }
        }
        due
    }

    /// Renews one lease, unless it ended since [`due`](Self::due) looked:
    /// its timer is rescheduled an invisible duration from now.
    fn renew(&self, store: &Store, due: &Due) -> Result<(), delaywheel::Error> {
        let _exclusive = self.exclusive();
        let leased = |clients: &HashMap<String, Client>| {
            clients.get(&due.client).is_some_and(|c| c.leases.contains_key(&due.timer))
        };
        if !leased(&self.clients()) {
            return Ok(());
        }
        let due_ms = SystemClock.now_ms().saturating_add(due.invisible.as_millis() as u64);
        let outcome = store.reschedule(due.timer, due_ms)?;
        let mut clients = self.clients();
        let Some(entry) = clients.get_mut(&due.client) else { return Ok(()) };
        match outcome {
            RescheduleOutcome::Rescheduled => {
                if let Some(lease) = entry.leases.get_mut(&due.timer) {
                    lease.due_ms = due_ms;
                }
            }
            // Acked, handed out again, or gone: nothing left to renew.
            _ => {
                entry.leases.remove(&due.timer);
            }
        }
        Ok(())
    }

    /// Renews the leases that are due in the store `owner` holds (`store_of`
    /// finds it), until `stop` says the server stops.
    pub async fn run<S: Send + Sync + 'static>(
        self: Arc<Self>,
        owner: Arc<S>,
        store_of: fn(&S) -> &Store,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(self.policy.tick());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|stopping| *stopping) => return,
            }
            let due = self.due(SystemClock.now_ms());
            if due.is_empty() {
                continue;
            }
            let (renewals, owner) = (Arc::clone(&self), Arc::clone(&owner));
            let renewed = tokio::task::spawn_blocking(move || {
                due.iter().try_for_each(|due| renewals.renew(store_of(&owner), due))
            });
            match renewed.await {
                Ok(Ok(())) => {}
                // A full disk or a closing store: the next tick tries again, while there is time.
                Ok(Err(e)) => tracing::warn!("renewing invisibility: {e}"),
                Err(e) => tracing::warn!("the renewer's task failed: {e}"),
            }
        }
    }
}

/// One open telemetry stream of a client; dropped when the stream closes.
pub(crate) struct Connection {
    renewals: Arc<Renewals>,
    client: String,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.renewals.disconnect(&self.client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(offset: u64, due_ms: u64) -> Handle {
        Handle { offset, deliver_at_ms: due_ms }
    }

    #[test]
    fn leases_live_while_their_client_is_connected() {
        let renewals = Arc::new(Renewals::new(RenewPolicy::DEFAULT));
        let now = SystemClock.now_ms();
        renewals.lease("nobody", [handle(1, now)], Duration::from_secs(60));
        assert!(renewals.due(now).is_empty(), "a client without a stream is not renewed");
        let first = renewals.connect("c");
        let second = renewals.connect("c");
        renewals.lease("c", [handle(1, now + 5_000), handle(2, now + 50_000)], Duration::from_secs(60));
        let due: Vec<_> = renewals.due(now).into_iter().map(|d| d.timer.offset).collect();
        assert_eq!(due, [1], "only the one within 10 s of its due time");
        renewals.release(None, handle(1, now + 5_000));
        assert!(renewals.due(now).is_empty());
        drop(first);
        assert_eq!(renewals.due(now + 45_000).len(), 1, "one stream is still open");
        drop(second);
        assert!(renewals.due(now + 45_000).is_empty(), "the last stream closed: leases end");
    }

    #[test]
    fn termination_and_the_longest_hold_end_leases() {
        let renewals = Arc::new(Renewals::new(RenewPolicy::DEFAULT));
        let now = SystemClock.now_ms();
        let _stream = renewals.connect("c");
        renewals.lease("c", [handle(1, now)], Duration::from_secs(60));
        let hold = RenewPolicy::DEFAULT.max_hold.as_millis() as u64;
        assert_eq!(renewals.due(now + hold - 1).len(), 1);
        assert!(renewals.due(now + hold).is_empty(), "held 3 h: it comes back");
        renewals.lease("c", [handle(2, now)], Duration::from_secs(60));
        renewals.terminate("c");
        assert!(renewals.due(now).is_empty());
    }
}
