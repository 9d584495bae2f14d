//! Reading the commit log (the truth) record by record, read-only.
//!
//! The scan follows the store's own rules: a record starts after a segment
//! header, padding sends the scan to the next segment, and the log ends at
//! the first all-zero header or the first record that does not check out.
//! Whether such a record is a torn tail (normal, e.g. one being written by a
//! live store) or damage in the middle is the caller's call: the store calls
//! it damage when it lies below the checkpoint's `log durable`.

use std::borrow::Cow;
use std::path::PathBuf;

use delaywheel::CorruptionKind;
use delaywheel::internals::record::{
    self, Frame, FrameError, MessageView, Record, RelocationView, RescheduleView,
};
use delaywheel::internals::{self, SPEC_PROPERTY, queue_entry, validate_topic};

use crate::error::Result;
use crate::store_files::{ChunkReader, FileKind, SequenceFile, StoreFiles, open_sequence};

/// The frame header at the start of `header` (`room` bytes to the end of its
/// segment), as the store checks it: `Ok(None)` for an all-zero header, the
/// end of the log.
pub fn frame_at(header: &[u8], room: usize) -> Result<Option<Frame>, CorruptionKind> {
    match record::check_header_in(header, room) {
        Ok(frame) => Ok(Some(frame)),
        Err(FrameError::Empty) => Ok(None),
        Err(FrameError::Invalid(kind)) => Err(kind),
    }
}

/// Checks and decodes the record at log `offset` as the store reads it: its
/// CRC, its fields, and (a message) a topic `put` could have written, since
/// the topic names a directory.
pub fn decode_record(bytes: &[u8], offset: u64, frame: Frame) -> Result<Record<'_>, CorruptionKind> {
    let record = Record::decode(bytes, offset, frame)?;
    if let Record::Message(m) = &record
        && validate_topic(m.topic).is_err()
    {
        return Err(CorruptionKind::BadFrame(format!("message record names topic {:?}", m.topic)));
    }
    Ok(record)
}

/// The commit log's segments, headers checked.
pub struct CommitLog {
    segments: Vec<SequenceFile>,
    pub segment_size: u64,
    /// The checkpoint's `log durable` (0: no checkpoint), which tells damage from a torn tail.
    durable: u64,
}

/// Where and why a scan stopped.
#[derive(Debug)]
pub enum LogEnd {
    /// An all-zero record header, or past the last segment: the normal end.
    Clean { offset: u64 },
    /// A record that does not check out: a torn tail or damage, see the module docs.
    Invalid { offset: u64, file: PathBuf, position: u64, kind: CorruptionKind },
}

impl LogEnd {
    pub fn offset(&self) -> u64 {
        match self {
            Self::Clean { offset } | Self::Invalid { offset, .. } => *offset,
        }
    }
}

/// What a scan found.
#[derive(Debug, Default, Clone, Copy)]
pub struct RecordCounts {
    pub messages: u64,
    pub timed: u64,
    /// Timers delivered, by delivery and deliveries records.
    pub deliveries: u64,
    /// Delivery and deliveries records.
    pub delivery_records: u64,
    pub cancels: u64,
    pub relocations: u64,
    pub reschedules: u64,
    /// Stretches of damaged bytes lenient recovery left in place (`Skipped` records).
    pub skipped: u64,
}

impl CommitLog {
    pub fn open(files: &StoreFiles) -> Result<Self> {
        let (segments, size) = open_sequence(&files.segments, FileKind::CommitLog, |a| a, |a| a)?;
        Ok(Self { segments, segment_size: size.unwrap_or(0), durable: 0 })
    }

    /// The log as the store judges it against a checkpoint's `log durable`.
    pub fn with_durable(mut self, durable: u64) -> Self {
        self.durable = durable;
        self
    }

    pub fn segments(&self) -> impl Iterator<Item = &SequenceFile> {
        self.segments.iter()
    }

    /// The start offset of the oldest segment (`0` if there is none):
    /// retention deleted every record below it.
    pub fn start(&self) -> u64 {
        self.segments.first().map_or(0, |s| s.first)
    }

    /// The segment file and byte position of log offset `offset`.
    pub fn locate(&self, offset: u64) -> (PathBuf, u64) {
        let size = self.segment_size.max(1);
        let base = offset - offset % size;
        let path = match self.segments.iter().find(|s| s.first == base) {
            Some(s) => s.file.path.clone(),
            None => self
                .segments
                .first()
                .map_or_else(PathBuf::new, |s| s.file.path.with_file_name(format!("{base:020}"))),
        };
        (path, offset - base)
    }

    /// Where the log's files end, by the library's rule.
    pub fn files_end(&self) -> u64 {
        internals::walk::files_end(self.segments.last().map(|s| s.first), self.segment_size)
    }

    /// Whether the records from `from` lead exactly to `to`: the library's
    /// walk ([`internals::walk::leads_to`]) over these segments, lenient
    /// as a store opens by default.
    pub fn leads_to(&self, from: u64, to: u64) -> Result<bool> {
        if self.segment_size == 0 {
            return Ok(false);
        }
        let lead = internals::walk::leads_to(&mut Reads(self), self.segment_size, from, to, false)?;
        Ok(lead == internals::walk::Lead::Reached)
    }

    /// Visits every record (padding excluded) in log order, from the first
    /// segment to the end of the log, stepping over damaged stretches by the
    /// store's rule (see [`Self::damage_ends_at`]); returns where the log
    /// ends and the stretches stepped over.
    pub fn scan(
        &self,
        mut visit: impl FnMut(u64, usize, Record<'_>) -> Result<()>,
    ) -> Result<(LogEnd, Vec<Damaged>)> {
        let header_len = internals::FILE_HEADER_LEN as u64;
        let mut damaged = Vec::new();
        let mut end = self.segments.first().map_or(header_len, |s| s.first + header_len);
        // `end` is where the next record would start: after the last segment
        // read, the start of the one that would follow it.
        for (i, segment) in self.segments.iter().enumerate() {
            let mut reader = ChunkReader::new(&segment.file);
            let mut local = header_len;
            loop {
                let offset = segment.first + local;
                let room = (self.segment_size - local) as usize;
                if room < record::RECORD_HEADER_LEN {
                    break;
                }
                let header = reader.get(local, record::RECORD_HEADER_LEN)?;
                let checked = match frame_at(header, room) {
                    Ok(Some(frame)) => {
                        let read_len =
                            if frame.kind.is_filler() { record::RECORD_HEADER_LEN } else { frame.len };
                        decode_record(reader.get(local, read_len)?, offset, frame)
                            .map(|r| (frame, r))
                            .map_err(Some)
                    }
                    Ok(None) => Err(None),
                    Err(kind) => Err(Some(kind)),
                };
                let problem = match checked {
                    Ok((_, Record::Padding)) => break,
                    Ok((frame, record)) => {
                        visit(offset, frame.len, record)?;
                        local += frame.len as u64;
                        continue;
                    }
                    Err(problem) => problem,
                };
                let is_last = i + 1 == self.segments.len();
                match self.damage_ends_at(segment, local, problem.is_none(), is_last)? {
                    Some(next) => {
                        let kind = problem.unwrap_or_else(|| {
                            CorruptionKind::BadFrame("zeros where a durable record should be".into())
                        });
                        let (file, position) = (segment.file.path.clone(), local);
                        damaged.push(Damaged { offset, len: next - local, file, position, kind });
                        local = next;
                    }
                    None => {
                        let file = segment.file.path.clone();
                        let end = match problem {
                            None => LogEnd::Clean { offset },
                            Some(kind) => LogEnd::Invalid { offset, file, position: local, kind },
                        };
                        return Ok((end, damaged));
                    }
                }
            }
            // The next record starts the next segment.
            end = segment.first + self.segment_size + header_len;
        }
        Ok((LogEnd::Clean { offset: end }, damaged))
    }

    /// Where a damaged stretch starting at byte `local` of `segment` ends, by
    /// the store's rule; `None` if the log ends there instead. Below the
    /// checkpoint's `log durable` a record that does not check out (zeros
    /// included) is damage; with no checkpoint, one that is not zeros is
    /// damage if a record that checks out follows. Past the durable mark
    /// it is a torn tail. The stretch runs to the next record that checks
    /// out (the library's own search), else to the end of its segment, if
    /// another segment follows.
    fn damage_ends_at(
        &self,
        segment: &SequenceFile,
        local: u64,
        zeros: bool,
        is_last: bool,
    ) -> Result<Option<u64>> {
        let offset = segment.first + local;
        let damage = if self.durable > 0 { offset < self.durable } else { !zeros };
        if !damage {
            return Ok(None);
        }
        // Only damage reads this far: the rest of the segment, once per stretch.
        let rest = segment.file.read(local, (self.segment_size - local) as usize)?;
        match record::next_valid_record(&rest, offset, 1) {
            Some(next) => Ok(Some(local + next as u64)),
            None if !is_last => Ok(Some(self.segment_size)),
            None => Ok(None),
        }
    }
}

/// A damaged stretch the scan stepped over: its records are unreadable.
#[derive(Debug, Clone)]
pub struct Damaged {
    /// Its log offset.
    pub offset: u64,
    pub len: u64,
    pub file: PathBuf,
    /// Its byte position in `file`.
    pub position: u64,
    /// Why its first bytes are not a record.
    pub kind: CorruptionKind,
}

/// Facts about the log that several commands need, from one scan.
pub struct LogFacts {
    /// Every message record by offset.
    pub messages: std::collections::HashMap<u64, MessageFacts>,
    /// Deliveries in log order, one per timer: (record offset, delivered at,
    /// timer record offset). The timers of a deliveries record share its
    /// offset; a schedule's occurrence record delivers the timer it replaces.
    pub deliveries: Vec<(u64, u64, u64)>,
    /// Deliveries records (kind 7) by offset.
    pub runs: std::collections::HashMap<u64, DeliveryRun>,
    /// Occurrences records (kind 8) by offset; each entry is also in
    /// `deliveries` (at the record's offset) and in `reschedules` (at its name).
    pub occurrence_runs: std::collections::HashMap<u64, OccurrenceRun>,
    /// Cancel records in log order: (record offset, message offset, deliver at).
    pub cancels: Vec<(u64, u64, u64)>,
    /// Relocation records in log order: (record offset, record).
    pub relocations: Vec<(u64, RelocationView)>,
    /// Reschedule records (relocated copies too) by record offset.
    pub reschedules: std::collections::BTreeMap<u64, RescheduleView>,
    /// Skipped records (damaged stretches lenient recovery left): (offset, length).
    pub skipped: Vec<(u64, u64)>,
    /// Damaged stretches the scan stepped over, as the store does: their records are unreadable.
    pub damaged: Vec<Damaged>,
    pub topics: Vec<String>,
    topic_ids: std::collections::HashMap<String, u32>,
    pub counts: RecordCounts,
    pub end: LogEnd,
    /// The latest time written in the log (store, delivery and cancel times), epoch ms.
    pub newest_time_ms: u64,
    /// The time of the first record of the oldest segment, epoch ms.
    pub oldest_time_ms: Option<u64>,
    /// The keys of timed messages by offset, if asked for ([`LogFacts::gather_with_keys`]).
    pub keys: Option<std::collections::HashMap<u64, String>>,
    /// The spec (`dw.schedule` property) of each schedule record by offset,
    /// if the keys were asked for; `Err` says why it does not read.
    pub schedule_specs: std::collections::HashMap<u64, std::result::Result<String, String>>,
}

/// A deliveries record: the queue it names and its timers.
#[derive(Debug, Clone)]
pub struct DeliveryRun {
    pub len: u32,
    pub delivered_at_ms: u64,
    pub topic: String,
    pub queue_id: u32,
    /// (timer record offset, tag hash), in the record's order.
    pub timers: Vec<(u64, u32)>,
}

/// An occurrences record: each entry delivers the timer it replaced.
#[derive(Debug, Clone)]
pub struct OccurrenceRun {
    pub len: u32,
    pub delivered_at_ms: u64,
    /// The timer each entry delivers (its record's offset, or an entry's name), in order.
    pub fired: Vec<u64>,
}

/// What the indexes need to know about one message record.
#[derive(Debug, Clone, Copy)]
pub struct MessageFacts {
    pub len: u32,
    pub store_time_ms: u64,
    pub deliver_at_ms: u64,
    pub delay_level: u16,
    pub queue_id: u32,
    /// Index into [`LogFacts::topics`].
    pub topic: u32,
    pub tag_hash: u32,
    /// A recurring schedule's record: each of its timers delivers an occurrence.
    pub schedule: bool,
}

impl LogFacts {
    /// Scans the whole log.
    pub fn gather(log: &CommitLog) -> Result<Self> {
        Self::gather_keeping_keys(log, false)
    }

    /// [`gather`](Self::gather), also keeping the key of every timed message.
    pub fn gather_with_keys(log: &CommitLog) -> Result<Self> {
        Self::gather_keeping_keys(log, true)
    }

    fn gather_keeping_keys(log: &CommitLog, keep_keys: bool) -> Result<Self> {
        let mut facts = Self {
            messages: Default::default(),
            deliveries: Vec::new(),
            runs: Default::default(),
            occurrence_runs: Default::default(),
            cancels: Vec::new(),
            relocations: Vec::new(),
            reschedules: Default::default(),
            skipped: Vec::new(),
            damaged: Vec::new(),
            topics: Vec::new(),
            topic_ids: Default::default(),
            counts: RecordCounts::default(),
            end: LogEnd::Clean { offset: 0 },
            newest_time_ms: 0,
            oldest_time_ms: None,
            keys: keep_keys.then(Default::default),
            schedule_specs: Default::default(),
        };
        (facts.end, facts.damaged) = log.scan(|offset, len, record| {
            facts.note(offset, len, record);
            Ok(())
        })?;
        Ok(facts)
    }

    /// Adds the relocated copy of the timer message whose original record
    /// (deleted by retention) was at `offset`: it is known as a timed message
    /// like the others, but not counted as a record of the retained log.
    pub fn add_relocated_timer(&mut self, offset: u64, len: usize, m: &MessageView<'_>) {
        let facts = self.message_facts(len, m);
        self.messages.insert(offset, facts);
        self.keep_key(offset, m);
    }

    fn keep_key(&mut self, offset: u64, m: &MessageView<'_>) {
        if let Some(keys) = &mut self.keys
            && !m.key.is_empty()
            && m.timer_deliver_at_ms().is_some()
        {
            keys.insert(offset, m.key.to_string());
        }
        if self.keys.is_some() && m.schedule {
            let spec = m.properties().map_err(|e| e.to_string()).and_then(|properties| {
                let found = properties.into_iter().find(|(name, _)| name == SPEC_PROPERTY);
                found.map(|(_, text)| text).ok_or_else(|| format!("no {SPEC_PROPERTY:?} property"))
            });
            self.schedule_specs.insert(offset, spec);
        }
    }

    /// The spec of the schedule record at `offset`, if keys were kept.
    pub fn schedule_spec(&self, offset: u64) -> Option<&std::result::Result<String, String>> {
        self.schedule_specs.get(&offset)
    }

    /// The key of the timed message at `offset`, if it has one and keys were kept.
    pub fn key(&self, offset: u64) -> Option<&str> {
        self.keys.as_ref()?.get(&offset).map(String::as_str)
    }

    fn message_facts(&mut self, len: usize, m: &MessageView<'_>) -> MessageFacts {
        let next_id = self.topics.len() as u32;
        let topic = *self.topic_ids.entry(m.topic.to_string()).or_insert_with(|| {
            self.topics.push(m.topic.to_string());
            next_id
        });
        MessageFacts {
            len: len as u32,
            store_time_ms: m.store_time_ms,
            // A bucket scheduler's copy is an ordinary message of its topic.
            deliver_at_ms: m.timer_deliver_at_ms().unwrap_or(0),
            delay_level: m.timing.delay_level,
            queue_id: m.queue_id,
            topic,
            tag_hash: queue_entry::tag_hash(m.tags),
            schedule: m.schedule,
        }
    }

    fn note(&mut self, offset: u64, len: usize, record: Record<'_>) {
        let time = record.time_ms();
        if self.oldest_time_ms.is_none() {
            self.oldest_time_ms = time;
        }
        match record {
            Record::Message(m) => {
                self.counts.messages += 1;
                self.counts.timed += u64::from(m.timer_deliver_at_ms().is_some());
                self.newest_time_ms = self.newest_time_ms.max(m.store_time_ms);
                let facts = self.message_facts(len, &m);
                self.messages.insert(offset, facts);
                // An update's record settles the replaced schedule's timer as a cancel does.
                if let Some(r) = delaywheel::internals::replaced_by(&m) {
                    self.cancels.push((offset, r.timer_offset, r.deliver_at_ms));
                }
                self.keep_key(offset, &m);
            }
            Record::Delivery(d) => {
                self.counts.deliveries += 1;
                self.counts.delivery_records += 1;
                self.newest_time_ms = self.newest_time_ms.max(d.delivered_at_ms);
                self.deliveries.push((offset, d.delivered_at_ms, d.message_offset));
            }
            Record::Deliveries(d) => {
                self.counts.deliveries += d.len() as u64;
                self.counts.delivery_records += 1;
                self.newest_time_ms = self.newest_time_ms.max(d.delivered_at_ms);
                self.deliveries.extend(d.timers().map(|(timer, _)| (offset, d.delivered_at_ms, timer)));
                let run = DeliveryRun {
                    len: len as u32,
                    delivered_at_ms: d.delivered_at_ms,
                    topic: d.topic.to_string(),
                    queue_id: d.queue_id,
                    timers: d.timers().collect(),
                };
                self.runs.insert(offset, run);
            }
            Record::Cancel(c) => {
                self.counts.cancels += 1;
                self.newest_time_ms = self.newest_time_ms.max(c.cancelled_at_ms);
                self.cancels.push((offset, c.message_offset, c.deliver_at_ms));
            }
            Record::Reschedule(r) => {
                self.counts.reschedules += 1;
                self.newest_time_ms = self.newest_time_ms.max(r.rescheduled_at_ms);
                if r.delivers() {
                    // A schedule's occurrence: it delivers the timer it replaces.
                    self.counts.deliveries += 1;
                    self.deliveries.push((offset, r.rescheduled_at_ms, r.from_timer));
                }
                self.reschedules.insert(offset, r);
            }
            Record::Occurrences(o) => {
                // Each entry as the occurrence record it stands for, named by the entry.
                self.counts.deliveries += o.len() as u64;
                self.counts.delivery_records += 1;
                self.counts.reschedules += o.len() as u64;
                self.newest_time_ms = self.newest_time_ms.max(o.delivered_at_ms);
                let mut fired = Vec::with_capacity(o.len());
                for (name, r) in o.entries() {
                    self.deliveries.push((offset, r.rescheduled_at_ms, r.from_timer));
                    self.reschedules.insert(name, r);
                    fired.push(r.from_timer);
                }
                let run = OccurrenceRun { len: len as u32, delivered_at_ms: o.delivered_at_ms, fired };
                self.occurrence_runs.insert(offset, run);
            }
            Record::Relocation(r) => {
                self.counts.relocations += 1;
                self.newest_time_ms = self.newest_time_ms.max(r.relocated_at_ms);
                self.relocations.push((offset, r));
            }
            Record::Skipped => {
                self.counts.skipped += 1;
                self.skipped.push((offset, len as u64));
            }
            Record::Padding => {}
        }
    }

    pub fn topic(&self, m: &MessageFacts) -> &str {
        &self.topics[m.topic as usize]
    }

    /// The timed message at `offset`, if that is one.
    pub fn timed(&self, offset: u64) -> Option<&MessageFacts> {
        self.messages.get(&offset).filter(|m| m.deliver_at_ms != 0)
    }
}

/// The segments as a walk reads them: plain reads of the bytes it asks for.
struct Reads<'a>(&'a CommitLog);

impl internals::walk::SegmentReader for Reads<'_> {
    type Error = crate::error::DumpError;

    fn read(&mut self, base: u64, local: usize, len: usize) -> Result<Option<Cow<'_, [u8]>>> {
        let Some(segment) = self.0.segments.iter().find(|s| s.first == base) else { return Ok(None) };
        Ok(Some(Cow::Owned(segment.file.read(local as u64, len)?)))
    }
}
