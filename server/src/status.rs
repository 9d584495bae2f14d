//! Answers in the protocol's terms: a status code and a message naming the
//! field that was wrong.

use std::fmt::Display;

use crate::proto::{Code, Status};

/// A request, or one entry of it, that is not done, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub code: Code,
    pub message: String,
}

impl Refusal {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// A refusal naming the request field at fault.
    pub fn field(code: Code, field: &str, why: impl Display) -> Self {
        Self::new(code, format!("{field}: {why}"))
    }

    pub fn status(&self) -> Status {
        Status { code: self.code as i32, message: self.message.clone() }
    }
}

pub(crate) fn ok() -> Status {
    Status { code: Code::Ok as i32, message: "OK".to_string() }
}

pub(crate) fn status_of(result: Result<(), Refusal>) -> Status {
    result.map_or_else(|refusal| refusal.status(), |()| ok())
}

impl From<delaywheel::Error> for Refusal {
    fn from(e: delaywheel::Error) -> Self {
        Self::new(code_of(&e), e.to_string())
    }
}

/// The protocol's code for a store error: the field's own code where there
/// is one, else bad request for input and internal error for the store.
fn code_of(e: &delaywheel::Error) -> Code {
    use delaywheel::Error as E;
    match e {
        E::Invalid { what, .. } => match *what {
            "topic" => Code::IllegalTopic,
            "key" => Code::IllegalMessageKey,
            "tags" => Code::IllegalMessageTag,
            "body" => Code::MessageBodyTooLarge,
            "properties" => Code::MessagePropertiesTooLarge,
            "deliver_at_ms" | "delay level" => Code::IllegalDeliveryTime,
            _ => Code::BadRequest,
        },
        E::InBatch { source, .. } => code_of(source),
        E::Busy { .. } | E::TickerBusy { .. } | E::Exhausted { .. } => Code::TooManyRequests,
        E::NotYetDurable { .. } => Code::MasterPersistenceTimeout,
        _ => Code::InternalServerError,
    }
}
