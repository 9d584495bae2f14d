//! What a producer's requests do to the store: `SendMessage` puts a batch,
//! whole or not at all (`send.rs` turns each message into a store message);
//! `RecallMessage` cancels a timed message's timer.

use std::time::Duration;

use delaywheel::{CancelOutcome, PutTicket, Written};

use crate::names;
use crate::proto::*;
use crate::send;
use crate::server::Shared;
use crate::status::{Refusal, ok};

/// A send's messages, checked and made store messages: appended whole or
/// not at all.
pub(crate) struct Checked {
    /// Each message's id, topic and whether it is timed, in input order.
    ids: Vec<(String, String, bool)>,
    messages: Vec<delaywheel::Message>,
}

impl Checked {
    /// The send, appended: `tickets` are its messages'.
    pub(crate) fn submitted(self, tickets: Vec<PutTicket>) -> Submitted {
        debug_assert_eq!(tickets.len(), self.ids.len());
        Submitted { ids: self.ids, tickets }
    }
}

/// A send's messages, appended (all of them) and not yet durable: the
/// request waits for its tickets without holding a thread, then
/// [`Shared::sent`] answers.
pub(crate) struct Submitted {
    /// Each message's id, topic and whether it is timed, in input order.
    ids: Vec<(String, String, bool)>,
    tickets: Vec<PutTicket>,
}

impl Submitted {
    /// Waits until the batch is durable (one sync covers it: its tickets
    /// share its end), for at most `timeout`.
    pub(crate) async fn durable(&mut self, timeout: Duration) -> Result<(), delaywheel::Error> {
        let Some(last) = self.tickets.last_mut() else { return Ok(()) };
        match tokio::time::timeout(timeout, last).await {
            Ok(durable) => durable.map(drop),
            Err(_) => Err(delaywheel::Error::NotYetDurable {
                written: Written::Batch(self.tickets.iter().map(PutTicket::receipt).collect()),
                waited_ms: timeout.as_millis() as u64,
            }),
        }
    }
}

impl Shared {
    /// Checks a send's messages, whole or not at all: the refusal to answer
    /// if any is not acceptable or would pass the server's topic cap.
    pub(crate) fn check_send(&self, messages: Vec<Message>) -> Result<Checked, SendMessageResponse> {
        let levels = self.store.delay_levels().len();
        let max_body = self.store.max_body_bytes();
        let mut outgoing = Vec::with_capacity(messages.len());
        for message in messages {
            let queue = self.next_queue();
            match send::to_store(message, max_body, levels, queue, self.store.queues_per_topic()) {
                Ok(out) => outgoing.push(out),
                Err(refusal) => {
                    // Nothing of a request is stored unless all of it is.
                    self.metrics.send_refusals.increment(1);
                    return Err(refused(refusal));
                }
            }
        }
        if outgoing.is_empty() {
            return Err(refused(Refusal::field(Code::BadRequest, "messages", "empty")));
        }
        if let Err(refusal) = self.topics.admit(outgoing.iter().map(|o| o.topic.as_str()), "topic.name") {
            self.metrics.send_refusals.increment(outgoing.len() as u64);
            return Err(refused(refusal));
        }
        let (ids, messages) =
            outgoing.into_iter().map(|o| ((o.message_id, o.topic, o.timed), o.message)).unzip();
        Ok(Checked { ids, messages })
    }

    /// Appends a checked send if that takes no wait (on an async caller's
    /// own thread): its tickets, or `None`, with nothing appended, where it
    /// would wait.
    pub(crate) fn try_submit_send(
        &self,
        checked: &Checked,
    ) -> Result<Option<Vec<PutTicket>>, SendMessageResponse> {
        self.store.try_submit_batch(&checked.messages).map_err(|e| {
            self.metrics.send_refusals.increment(checked.ids.len() as u64);
            refused(Refusal::from(e))
        })
    }

    /// Appends a checked send, waiting as long as the store makes a put wait
    /// (run on the blocking pool: for room, for the indexes, for a new segment).
    pub(crate) fn submit_send(&self, checked: Checked) -> Result<Submitted, SendMessageResponse> {
        let Checked { ids, messages } = checked;
        match self.store.submit_batch(messages) {
            Ok(tickets) => Ok(Submitted { ids, tickets }),
            Err(e) => {
                self.metrics.send_refusals.increment(ids.len() as u64);
                Err(refused(Refusal::from(e)))
            }
        }
    }

    /// The answer to a send once [`Submitted::durable`] says how it went.
    pub(crate) fn sent(
        &self,
        submitted: Submitted,
        durable: Result<(), delaywheel::Error>,
    ) -> SendMessageResponse {
        if let Err(e) = durable {
            self.metrics.send_refusals.increment(submitted.ids.len() as u64);
            return refused(Refusal::from(e));
        }
        let receipts = submitted.tickets.iter().map(PutTicket::receipt);
        let entries = submitted.ids.into_iter().zip(receipts).map(|((message_id, topic, timed), receipt)| {
            self.metrics.sends.increment(1);
            let recall_handle = match receipt.handle().filter(|_| timed) {
                Some(handle) => {
                    self.metrics.timed_sends.increment(1);
                    self.key.recall_handle(&topic, handle, &message_id)
                }
                None => String::new(),
            };
            SendResultEntry {
                status: Some(ok()),
                message_id,
                transaction_id: String::new(),
                offset: receipt.offset() as i64,
                recall_handle,
            }
        });
        SendMessageResponse { status: Some(ok()), entries: entries.collect() }
    }

    pub(crate) fn recall(&self, request: &RecallMessageRequest) -> RecallMessageResponse {
        let answer = |status, message_id| RecallMessageResponse { status: Some(status), message_id };
        let topic = match names::topic(&request.topic, "topic.name")
            .and_then(|topic| send::check_topic(&topic, "topic.name").map(|()| topic))
        {
            Ok(topic) => topic,
            Err(refusal) => return answer(refusal.status(), String::new()),
        };
        let (handle, message_id) = match self.key.open_recall(&topic, &request.recall_handle) {
            Ok(opened) => opened,
            Err(why) => {
                return answer(
                    Refusal::field(Code::BadRequest, "recall_handle", why).status(),
                    String::new(),
                );
            }
        };
        let status = match self.store.cancel(handle) {
            Ok(CancelOutcome::Cancelled) => {
                self.metrics.recalls.increment(1);
                ok()
            }
            Ok(CancelOutcome::AlreadyDelivered) => {
                Refusal::field(Code::PreconditionFailed, "recall_handle", "the message was already delivered")
                    .status()
            }
            Ok(CancelOutcome::NotFound) => {
                Refusal::field(Code::NotFound, "recall_handle", "names no timed message").status()
            }
            Err(e) => Refusal::from(e).status(),
        };
        answer(status, message_id)
    }
}

/// A send refused whole.
fn refused(refusal: Refusal) -> SendMessageResponse {
    SendMessageResponse { status: Some(refusal.status()), entries: vec![] }
}
