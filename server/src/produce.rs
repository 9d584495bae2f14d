//! What a producer's requests do to the store: `SendMessage` puts a batch,
//! whole or not at all (`send.rs` turns each message into a store message);
//! `RecallMessage` cancels a timed message's timer.

use delaywheel::CancelOutcome;

use crate::names;
use crate::proto::*;
use crate::send;
use crate::server::Shared;
use crate::status::{Refusal, ok};

impl Shared {
    pub(crate) fn send(&self, messages: Vec<Message>) -> SendMessageResponse {
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
                    return SendMessageResponse { status: Some(refusal.status()), entries: vec![] };
                }
            }
        }
        if outgoing.is_empty() {
            let refusal = Refusal::field(Code::BadRequest, "messages", "empty");
            return SendMessageResponse { status: Some(refusal.status()), entries: vec![] };
        }
        if let Err(refusal) = self.topics.admit(outgoing.iter().map(|o| o.topic.as_str()), "topic.name") {
            self.metrics.send_refusals.increment(outgoing.len() as u64);
            return SendMessageResponse { status: Some(refusal.status()), entries: vec![] };
        }
        let ids: Vec<_> = outgoing.iter().map(|o| (o.message_id.clone(), o.topic.clone(), o.timed)).collect();
        let receipts = match self.store.put_batch(outgoing.into_iter().map(|o| o.message)) {
            Ok(receipts) => receipts,
            Err(e) => {
                self.metrics.send_refusals.increment(ids.len() as u64);
                return SendMessageResponse { status: Some(Refusal::from(e).status()), entries: vec![] };
            }
        };
        let entries = ids.into_iter().zip(receipts).map(|((message_id, topic, timed), receipt)| {
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
