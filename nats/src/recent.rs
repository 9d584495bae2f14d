//! A map that forgets each entry a while after it was last written: what a
//! partition settled or cancelled lately, remembered for as long as a
//! retry or a duplicate can still come.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

pub(crate) struct Recent<K, V> {
    remember_for: Duration,
    entries: HashMap<K, (V, Instant)>,
    /// Each write with its time, oldest first: what to forget next.
    order: VecDeque<(Instant, K)>,
}

impl<K: Hash + Eq + Clone, V> Recent<K, V> {
    pub(crate) fn new(remember_for: Duration) -> Self {
        Recent { remember_for, entries: HashMap::new(), order: VecDeque::new() }
    }

    /// Writes `key`, remembered from now on.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        self.forget_old();
        let now = Instant::now();
        self.entries.insert(key.clone(), (value, now));
        self.order.push_back((now, key));
    }

    /// The value of `key`, if written within the time remembered.
    pub(crate) fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        let (value, at) = self.entries.get(key)?;
        (at.elapsed() < self.remember_for).then_some(value)
    }

    fn forget_old(&mut self) {
        while let Some((at, _)) = self.order.front()
            && at.elapsed() >= self.remember_for
        {
            let (at, key) = self.order.pop_front().expect("just seen");
            // A key written again since stays, for its latest write.
            if self.entries.get(&key).is_some_and(|&(_, latest)| latest == at) {
                self.entries.remove(&key);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        (self.entries.len(), self.order.len())
    }
}
