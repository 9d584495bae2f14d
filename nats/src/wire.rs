//! What producers, nodes and clients agree on: subjects, headers and handles.
//!
//! A timer is one message in the delay stream, on subject
//! `<prefix>.<partition>.<anything>`, with two headers: [`DELIVER_AT`] (epoch
//! milliseconds) and [`TARGET`] (the subject it is published to when due).
//! Its [`TimerHandle`] is the partition and the stream sequence, so any node
//! can find and cancel it.

use std::fmt;
use std::str::FromStr;

use crate::TierError;

/// Header naming when the timer is due, in milliseconds since the Unix epoch.
pub const DELIVER_AT: &str = "Delay-At";
/// Header naming the subject the timer's message is published to when due.
pub const TARGET: &str = "Delay-Target";
/// Header the tier adds to a fired message: the handle it had while pending.
pub const HANDLE: &str = "Delay-Handle";
/// The headers a dead letter adds start with this (see [`DEAD_REASON`]).
pub const DEAD_PREFIX: &str = "Delay-Dead-";
/// Header of a dead letter: why the timer was not fired.
pub const DEAD_REASON: &str = "Delay-Dead-Reason";
/// Header of a dead letter: the target the timer named, if it named one.
pub const DEAD_TARGET: &str = "Delay-Dead-Target";
/// Header of a dead letter: the timer's sequence in the delay stream.
pub const DEAD_SEQUENCE: &str = "Delay-Dead-Sequence";
/// Header of a dead letter whose payload was left out (it would have been
/// too large with the dead letter's headers): why.
pub const DEAD_PAYLOAD: &str = "Delay-Dead-Payload";
/// JetStream's deduplication header: a fired message carries
/// `<stream>-<sequence>`, so a second publish of the same timer inside the
/// target stream's duplicate window is dropped by the server.
pub const MSG_ID: &str = "Nats-Msg-Id";

/// Header of a rescheduled timer's copy: its producer's `Nats-Msg-Id`,
/// under a name of the tier's own (JetStream would take a second
/// `Nats-Msg-Id` for a duplicate of the original's publish).
pub const RESCHEDULED_MSG_ID: &str = "Delay-Msg-Id";
/// Header of a rescheduled timer's copy: the sequence of the timer it
/// replaces, which holds the copy's `Nats-Msg-Id` until it is cancelled.
pub const REPLACES: &str = "Delay-Replaces";

/// Header of a recurring (or one-time) schedule's timer: when it fires, in
/// the forms of NATS's `Nats-Schedule`: `@at <RFC 3339>`, `@every
/// <duration>`, a 6-field cron expression or an alias such as `@daily` (see
/// `nats_schedule.rs`). The schedule intake writes NATS's header under this
/// name: JetStream refuses `Nats-Schedule` on a stream that does not run
/// NATS's own schedules.
pub const SCHEDULE: &str = "Delay-Schedule";
/// Header of a schedule's timer: the IANA time zone of its cron expression.
pub const SCHEDULE_TIME_ZONE: &str = "Delay-Schedule-Time-Zone";
/// Header of a schedule's timer: the `Nats-TTL` each occurrence carries.
pub const SCHEDULE_TTL: &str = "Delay-Schedule-TTL";
/// Header of a schedule's timer: the `Nats-Rollup` each occurrence carries.
pub const SCHEDULE_ROLLUP: &str = "Delay-Schedule-Rollup";
/// Header of a recurring schedule's timers after its first, and of each
/// occurrence it publishes: the handle of its first timer, which names the
/// schedule for as long as it recurs (a cancel of it stops the schedule).
pub const SCHEDULE_HANDLE: &str = "Delay-Schedule-Handle";

/// NATS's schedule header (nats-server 2.12+), taken by the schedule intake.
pub const NATS_SCHEDULE: &str = "Nats-Schedule";
/// NATS's header for the time zone of a `Nats-Schedule` cron expression.
pub const NATS_SCHEDULE_TIME_ZONE: &str = "Nats-Schedule-Time-Zone";
/// NATS's header for where a schedule's occurrences are published.
pub const NATS_SCHEDULE_TARGET: &str = "Nats-Schedule-Target";
/// NATS's header for the `Nats-TTL` of a schedule's occurrences.
pub const NATS_SCHEDULE_TTL: &str = "Nats-Schedule-TTL";
/// NATS's header for the `Nats-Rollup` of a schedule's occurrences.
pub const NATS_SCHEDULE_ROLLUP: &str = "Nats-Schedule-Rollup";
/// NATS's header that makes an occurrence the last message of another
/// subject of the stream: the tier has no such stream, and refuses it.
pub const NATS_SCHEDULE_SOURCE: &str = "Nats-Schedule-Source";
/// Header of an occurrence: the subject the schedule was published to
/// (NATS's own occurrences carry it as `Nats-Scheduler`, a name nats-server
/// refuses on a client's publish).
pub const SCHEDULER: &str = "Delay-Scheduler";
/// Header of an occurrence: when the schedule fires next (RFC 3339, UTC),
/// or `purge` after its last (NATS's `Nats-Schedule-Next`, which nats-server
/// refuses on a client's publish unless it is `purge`, and then purges the
/// schedule's subject).
pub const SCHEDULE_NEXT: &str = "Delay-Schedule-Next";
/// JetStream's per-message TTL header.
pub const MESSAGE_TTL: &str = "Nats-TTL";
/// JetStream's rollup header.
pub const ROLLUP: &str = "Nats-Rollup";

/// The partition a key belongs to: CRC-32C of its bytes, modulo the
/// partition count, so every producer in every language picks the same one
/// and one key's timers stay on one partition.
pub fn partition_of(key: &[u8], partitions: u32) -> u32 {
    debug_assert!(partitions > 0);
    crc32c::crc32c(key) % partitions
}

/// The subject a producer publishes a timer of `partition` to.
pub fn timer_subject(prefix: &str, partition: u32, suffix: &str) -> String {
    format!("{prefix}.{partition}.{suffix}")
}

/// The subjects of one partition, for a consumer's filter.
pub fn partition_filter(prefix: &str, partition: u32) -> String {
    format!("{prefix}.{partition}.>")
}

/// Where a tier keeps its timers: `partitions` partitions, on subjects
/// `<prefix>.<partition>.>`, held by `streams` delay streams. Partition `p`
/// is in stream `p % streams`, so each stream is a Raft group of its own,
/// whose leader the cluster places on a server of its choosing: the
/// streams spread the replicated work of puts, fires and acknowledgements
/// over the servers, where one stream put all of it on one leader.
///
/// Producers publish to the partition's subject and never name a stream:
/// the stream that captures the subject takes the timer. Every node and
/// client of one tier must agree on the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The delay stream's name, or the streams' common base name.
    pub stream: String,
    /// The partitions' subjects are `<prefix>.<partition>.>`.
    pub prefix: String,
    /// How many partitions.
    pub partitions: u32,
    /// How many delay streams hold them (1 ..= `partitions`).
    pub streams: u32,
}

impl Layout {
    /// One stream, `stream`, holding every partition (the layout of tiers
    /// before streams could be several).
    pub fn new(stream: &str, prefix: &str, partitions: u32) -> Self {
        Layout { stream: stream.into(), prefix: prefix.into(), partitions, streams: 1 }
    }

    /// The same partitions spread over `streams` delay streams.
    pub fn with_streams(mut self, streams: u32) -> Self {
        self.streams = streams;
        self
    }

    /// The index of the delay stream that holds `partition`'s timers.
    /// (A layout of no streams, which `TierConfig::validate` and
    /// `TierClient::with_layout` refuse, puts every partition in stream 0.)
    pub fn stream_index(&self, partition: u32) -> u32 {
        partition.checked_rem(self.streams).unwrap_or(0)
    }

    /// The name of delay stream `index`: the base name where there is one
    /// stream, else `<stream>-<index>`.
    pub fn stream_name(&self, index: u32) -> String {
        match self.streams {
            1 => self.stream.clone(),
            _ => format!("{}-{index}", self.stream),
        }
    }

    /// The name of the delay stream that holds `partition`'s timers.
    pub fn stream_of(&self, partition: u32) -> String {
        self.stream_name(self.stream_index(partition))
    }

    /// The subjects of delay stream `index`: its partitions' own, so it
    /// refuses a timer that no partition would read.
    pub fn stream_subjects(&self, index: u32) -> Vec<String> {
        (0..self.partitions)
            .filter(|&p| self.stream_index(p) == index)
            .map(|p| partition_filter(&self.prefix, p))
            .collect()
    }

    /// Where the schedule intake puts a schedule published to `subject`:
    /// `<prefix>.<partition>.<subject>`, its partition picked by the
    /// subject (as [`partition_of`] picks by key).
    pub fn schedule_subject(&self, subject: &str) -> String {
        format!("{}.{}.{subject}", self.prefix, partition_of(subject.as_bytes(), self.partitions))
    }

    /// The subject an occurrence names as its scheduler (`Delay-Scheduler`):
    /// what follows `<prefix>.<partition>.` in its timer's subject, that is
    /// the subject the schedule was published to at the intake.
    pub fn scheduler_of<'a>(&self, subject: &'a str) -> &'a str {
        let rest = subject.strip_prefix(self.prefix.as_str()).and_then(|r| r.strip_prefix('.'));
        rest.and_then(|r| r.split_once('.')).map_or(subject, |(_, scheduler)| scheduler)
    }

    /// Whether the consumer of a partition held by stream `index` reads
    /// `subject`: `<prefix>.<p>.<more>` with `p` written as the partition's
    /// filter writes it, below `partitions`, in that stream.
    pub fn read_in_stream(&self, index: u32, subject: &str) -> bool {
        let Some(rest) = subject.strip_prefix(self.prefix.as_str()).and_then(|r| r.strip_prefix('.')) else {
            return false;
        };
        let Some((token, more)) = rest.split_once('.') else {
            return false; // `delay.7` is not under `delay.7.>`
        };
        let partition = token.parse::<u32>().ok().filter(|p| *p < self.partitions && p.to_string() == token);
        !more.is_empty() && partition.is_some_and(|p| self.stream_index(p) == index)
    }
}

/// The partition a timer subject names, if it is one of `prefix`'s.
pub fn partition_of_subject(prefix: &str, subject: &str) -> Option<u32> {
    let rest = subject.strip_prefix(prefix)?.strip_prefix('.')?;
    rest.split('.').next()?.parse().ok()
}

/// The subject a partition's owner answers cancels on.
pub fn cancel_subject(stream: &str, partition: u32) -> String {
    format!("$DELAYTIER.{stream}.cancel.{partition}")
}

/// The subject that acknowledges the message at `sequence` of `stream` that
/// its consumer `consumer` handed out, built from the sequence alone (the
/// server reads the stream sequence from it; the delivery count, consumer
/// sequence, time and pending count are informative). Checked against the
/// server by `tools/nats/ack-by-sequence.sh`, on one server and on R3.
pub fn ack_subject(stream: &str, consumer: &str, sequence: u64) -> async_nats::Subject {
    format!("$JS.ACK.{stream}.{consumer}.1.{sequence}.1.0.0").into()
}

/// The deduplication id of a fired timer (see [`MSG_ID`]).
pub fn msg_id(stream: &str, sequence: u64) -> String {
    format!("{stream}-{sequence}")
}

/// Names one pending timer: its partition and its sequence in the delay
/// stream. Text form `partition:sequence`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerHandle {
    /// The partition whose owner fires it.
    pub partition: u32,
    /// Its sequence in the delay stream.
    pub sequence: u64,
}

impl fmt::Display for TimerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.partition, self.sequence)
    }
}

impl FromStr for TimerHandle {
    type Err = TierError;

    fn from_str(text: &str) -> Result<Self, TierError> {
        let bad = || TierError::BadHandle(text.to_string());
        let (partition, sequence) = text.split_once(':').ok_or_else(bad)?;
        Ok(TimerHandle {
            partition: partition.parse().map_err(|_| bad())?,
            sequence: sequence.parse().map_err(|_| bad())?,
        })
    }
}

/// What a partition's owner answers a cancel with (the request's payload is
/// the sequence in decimal; the answer is one of these words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelAnswer {
    /// The timer will never fire: cancelled now, or by this owner within
    /// the last minute.
    Cancelled,
    /// Too late: it has fired, or is being published now.
    AlreadyFired,
    /// The stream holds no such timer (fired and removed, cancelled before:
    /// more than a minute before, or by another owner, or never there).
    NotFound,
}

impl CancelAnswer {
    /// The word on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            CancelAnswer::Cancelled => "cancelled",
            CancelAnswer::AlreadyFired => "already_fired",
            CancelAnswer::NotFound => "not_found",
        }
    }

    /// Reads an answer; anything else is the owner's error text.
    pub fn parse(word: &[u8]) -> Result<Self, TierError> {
        match word {
            b"cancelled" => Ok(CancelAnswer::Cancelled),
            b"already_fired" => Ok(CancelAnswer::AlreadyFired),
            b"not_found" => Ok(CancelAnswer::NotFound),
            other => Err(TierError::Owner(String::from_utf8_lossy(other).into_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_from_the_intake_keeps_its_subject_in_its_timers_subject() {
        let layout = Layout::new("DELAY", "delay", 8);
        let stored = layout.schedule_subject("schedules.orders.daily");
        let partition = partition_of(b"schedules.orders.daily", 8);
        assert_eq!(stored, format!("delay.{partition}.schedules.orders.daily"));
        assert_eq!(partition_of_subject("delay", &stored), Some(partition));
        assert_eq!(layout.scheduler_of(&stored), "schedules.orders.daily");
        assert_eq!(layout.scheduler_of("delay.3.timer"), "timer");
    }

    #[test]
    fn a_handle_reads_back_what_it_writes_and_refuses_garbage() {
        let handle = TimerHandle { partition: 7, sequence: 123_456 };
        assert_eq!(handle.to_string(), "7:123456");
        assert_eq!("7:123456".parse::<TimerHandle>().unwrap(), handle);
        for bad in ["", "7", "7:", ":5", "x:5", "7:-1", "7:5:1"] {
            let err = bad.parse::<TimerHandle>().unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }

    #[test]
    fn a_key_always_lands_on_the_same_partition_and_keys_spread() {
        assert_eq!(partition_of(b"order-1", 8), partition_of(b"order-1", 8));
        // CRC-32C("123456789") is the standard check value 0xE3069283.
        assert_eq!(partition_of(b"123456789", 1 << 31), 0xE306_9283 % (1 << 31));
        let mut seen = [0u32; 8];
        for i in 0..8_000 {
            seen[partition_of(format!("order-{i}").as_bytes(), 8) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1_200).contains(&n)), "{seen:?}");
    }

    #[test]
    fn subjects_name_their_partition() {
        let subject = timer_subject("delay", 3, "order-9");
        assert_eq!(subject, "delay.3.order-9");
        assert_eq!(partition_of_subject("delay", &subject), Some(3));
        assert_eq!(partition_of_subject("delay", "delayx.3.a"), None);
        assert_eq!(partition_of_subject("delay", "delay.x.a"), None);
        assert_eq!(partition_filter("delay", 3), "delay.3.>");
        assert_eq!(
            Layout::new("DELAY", "delay", 3).stream_subjects(0),
            ["delay.0.>", "delay.1.>", "delay.2.>"]
        );
    }

    #[test]
    fn streams_hold_every_partition_once_and_one_stream_keeps_its_name() {
        let one = Layout::new("DELAY", "delay", 8);
        assert_eq!((one.stream_name(0), one.stream_of(7)), ("DELAY".into(), "DELAY".into()));
        let three = one.clone().with_streams(3);
        assert_eq!(three.stream_of(4), "DELAY-1");
        assert_eq!(three.stream_subjects(1), ["delay.1.>", "delay.4.>", "delay.7.>"]);
        let mut held: Vec<String> = (0..3).flat_map(|i| three.stream_subjects(i)).collect();
        held.sort();
        let mut all = one.stream_subjects(0);
        all.sort();
        assert_eq!(held, all, "each partition in exactly one stream");
        for p in 0..8 {
            let subjects = three.stream_subjects(three.stream_index(p));
            assert!(subjects.contains(&partition_filter("delay", p)), "{p}");
        }
    }

    #[test]
    fn only_a_streams_own_partitions_subjects_are_read_in_it() {
        let one = Layout::new("DELAY", "delay", 8);
        for read in ["delay.0.timer", "delay.7.a.b", "delay.3.x"] {
            assert!(one.read_in_stream(0, read), "{read}");
        }
        for stray in [
            "delay.8.timer",
            "delay.99.x",
            "delay.x.timer",
            "delay.07.timer",
            "delay.7",
            "delay.7.",
            "delay",
            "delayed.1.x",
            "delay.-1.x",
            "delay.+1.x",
        ] {
            assert!(!one.read_in_stream(0, stray), "{stray}");
        }
        let two = one.with_streams(2);
        assert!(two.read_in_stream(1, "delay.3.x") && !two.read_in_stream(0, "delay.3.x"));
    }

    #[test]
    fn cancel_answers_round_trip_and_errors_carry_the_owners_text() {
        for answer in [CancelAnswer::Cancelled, CancelAnswer::AlreadyFired, CancelAnswer::NotFound] {
            assert_eq!(CancelAnswer::parse(answer.as_str().as_bytes()).unwrap(), answer);
        }
        let err = CancelAnswer::parse(b"error: store closed").unwrap_err();
        assert!(err.to_string().contains("store closed"), "{err}");
    }
}
