//! The order of the execution queue between users: start-time fair queuing.
//!
//! Queued invocations are claimed in the order of their queue tag (then their id), and the tag
//! is given when the invocation enters the queue (frozen without approval, or granted) by
//! Start-time Fair Queueing with every call costing 1 (P. Goyal, H. M. Vin, H. Cheng,
//! "Start-time Fair Queueing: A Scheduling Algorithm for Integrated Services Packet Switching
//! Networks", SIGCOMM 1996): the tag is `max(V, F(owner))`, where `V` is the largest tag
//! claimed so far (the "virtual time" of the call in service) and `F(owner)` the owner's
//! previous tag + 1. A user who queues 10,000 calls gets tags `V … V + 9,999`; another user's
//! call queued meanwhile gets `V` and is claimed with the next batch, not after all of them.
//! Within one user the order stays first come, first served.
//!
//! Tags are this replica's: every replica claims from the one queue and advances its `V` with
//! what it claims, and raises it to the queue's head at every sweep ([`FairQueue::started`]), so tags
//! of replicas stay close; the order is a fairness, never a correctness matter — every queued
//! call is claimed once, whatever its tag.

use std::collections::HashMap;

use parking_lot::Mutex;

/// Tags for the execution queue (see the module docs).
#[derive(Debug, Default)]
pub struct FairQueue {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// `V`: the largest tag claimed so far.
    virtual_time: i64,
    /// `F(owner)`: each owner's next tag at the earliest. Only owners ahead of `V` matter.
    next: HashMap<String, i64>,
    /// Owners kept at the last pruning (pruned again when `next` doubled).
    kept: usize,
}

impl FairQueue {
    /// The queue tag of a call of `owner_id` entering the queue now.
    pub fn tag(&self, owner_id: &str) -> i64 {
        let mut s = self.state.lock();
        let v = s.virtual_time;
        let start = s.next.get(owner_id).map_or(v, |&f| f.max(v));
        s.next.insert(owner_id.to_owned(), start.saturating_add(1));
        // An owner whose next tag is not ahead of `V` is as good as new: drop such owners
        // once the map doubled since the last pruning (amortised O(1) per tag).
        if s.next.len() > 2 * s.kept + 64 {
            s.next.retain(|_, f| *f > v);
            s.kept = s.next.len();
        }
        start
    }

    /// The tag [`FairQueue::tag`] would give `owner_id` now, without taking it.
    pub fn next_tag(&self, owner_id: &str) -> i64 {
        let s = self.state.lock();
        s.next.get(owner_id).map_or(s.virtual_time, |&f| f.max(s.virtual_time))
    }

    /// A call of `owner_id` entered the queue with `tag` (from [`FairQueue::next_tag`]):
    /// the owner's next tag is at least `tag + 1`.
    pub fn took(&self, owner_id: &str, tag: i64) {
        let mut s = self.state.lock();
        let next = s.next.entry(owner_id.to_owned()).or_insert(0);
        *next = (*next).max(tag.saturating_add(1));
    }

    /// A call of tag `tag` was claimed, or the queue's head (the smallest tag queued, read
    /// from the store) has tag `tag`: `V` advances to it when it was behind (after a start,
    /// or while other replicas did the claiming).
    pub fn started(&self, tag: i64) {
        let mut s = self.state.lock();
        s.virtual_time = s.virtual_time.max(tag);
    }

    /// `V`, the largest tag claimed so far.
    pub fn virtual_time(&self) -> i64 {
        self.state.lock().virtual_time
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_burst_does_not_go_ahead_of_anothers_call() {
        let q = FairQueue::default();
        let a: Vec<i64> = (0..1000).map(|_| q.tag("a")).collect();
        assert_eq!(a, (0..1000).collect::<Vec<_>>(), "one user alone: first come, first served");
        assert_eq!(q.tag("b"), 0, "b's call is claimed with a's first");
        q.started(10);
        assert_eq!(q.tag("b"), 10, "b's next starts at V");
        assert_eq!(q.tag("c"), 10);
        assert_eq!(q.tag("a"), 1000, "a stays behind its own queue");
        q.started(5);
        assert_eq!(q.virtual_time(), 10, "V never goes back");
        q.started(2000);
        assert_eq!(q.tag("a"), 2000, "a user idle while V passed starts at V");
        // A grant looks first and takes the turn only when its call was queued.
        assert_eq!(q.next_tag("a"), 2001);
        assert_eq!(q.next_tag("a"), 2001, "looking takes nothing");
        q.took("a", 2001);
        assert_eq!(q.tag("a"), 2002);
    }

    #[test]
    fn owners_behind_the_virtual_time_are_pruned() {
        let q = FairQueue::default();
        for i in 0..10_000 {
            q.tag(&format!("u{i}"));
            q.started(i);
        }
        let s = q.state.lock();
        assert!(s.next.len() < 300, "{} owners kept", s.next.len());
    }
}
