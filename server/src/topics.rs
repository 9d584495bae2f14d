//! The cap on topics. Each topic costs the store a directory and, once it
//! has a message, a consume-queue file per queue; a client could otherwise
//! name a new topic with every byte it sends. A send or a receive that would
//! take the server past [`ServeOptions::max_topics`](crate::ServeOptions::max_topics)
//! is refused as a whole with `FORBIDDEN`, naming the cap. Topics the store
//! already has count, and so do the retry and dead-letter topics a receive
//! may make.

use std::collections::HashSet;
use std::sync::Mutex;

use delaywheel::Store;

use crate::proto::Code;
use crate::status::Refusal;

/// The default cap on topics.
pub const DEFAULT_MAX_TOPICS: usize = 10_000;

/// The topics the server has admitted, up to its cap.
pub(crate) struct Topics {
    max: usize,
    admitted: Mutex<HashSet<String>>,
}

impl Topics {
    /// The store's topics, admitted; at most `max` in all.
    pub fn new(store: &Store, max: usize) -> Self {
        Self { max, admitted: Mutex::new(store.topics().into_iter().collect()) }
    }

    /// Admits every topic of `names`, or none if that would pass the cap.
    pub fn admit<'a>(&self, names: impl IntoIterator<Item = &'a str>, field: &str) -> Result<(), Refusal> {
        let mut admitted = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        let new: HashSet<&str> = names.into_iter().filter(|name| !admitted.contains(*name)).collect();
        if admitted.len() + new.len() > self.max {
            let why = format!(
                "{} new topic(s) would pass the server's cap of {} topics (--max-topics)",
                new.len(),
                self.max
            );
            return Err(Refusal::field(Code::Forbidden, field, why));
        }
        admitted.extend(new.into_iter().map(String::from));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_topics_count_and_a_request_is_admitted_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(delaywheel::Config::new(dir.path())).unwrap();
        store.consumer("Old", 0).unwrap();
        let topics = Topics::new(&store, 3);
        topics.admit(["Old", "A"], "topic.name").unwrap();
        let refused = topics.admit(["A", "B", "C"], "topic.name").unwrap_err();
        assert_eq!(refused.code, Code::Forbidden);
        assert!(refused.message.starts_with("topic.name: 2 new topic(s)"), "{}", refused.message);
        topics.admit(["Old", "A", "B"], "topic.name").unwrap();
        assert!(topics.admit(["C"], "topic.name").is_err(), "none of the refused request was admitted");
        store.close().unwrap();
    }
}
