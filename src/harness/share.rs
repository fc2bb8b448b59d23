//! Each user's share of the execution slots.
//!
//! The queue's order ([`super::fair`]) decides who starts next, not how long a start holds
//! its slot: a user whose calls each run for minutes (a terminal command, an MCP tool that
//! waits) could hold every slot of the server until the execution time limit, and every
//! other user's call would wait that long, however fair the queue. So at most `per_user`
//! tools of one user run at once on a replica (`--max-running-per-user`, by default half of
//! `--execution-concurrency`): the slot of one more call is refused at its freeze or grant,
//! and the claim loop passes over that user's queued calls until a tool of theirs returns.
//! The calls are not refused — they wait in the queue, in order. A share is given back when
//! the tool returns, before its result is stored (the slot stays busy until then): results
//! are stored in group commits, and counting their latency would halve a lone user's
//! throughput of short calls.
//!
//! Shares are counted per replica, like the slots; a grant takes the slot for the call's
//! owner, whoever decides. Passing over a user costs the claim loop one index step, however
//! long their backlog ([`crate::store::Store::queue_head`] reads the queue per user).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// The number of slots each user holds on this replica, and the most one may hold.
#[derive(Debug)]
pub struct Shares {
    per_user: usize,
    held: Mutex<HashMap<String, usize>>,
}

/// One slot counted for `owner` until dropped.
#[derive(Debug)]
pub struct Share {
    shares: Arc<Shares>,
    owner: String,
}

impl Shares {
    /// Shares of at most `per_user` slots each (at least 1).
    pub fn new(per_user: usize) -> Arc<Self> {
        Arc::new(Self { per_user: per_user.max(1), held: Mutex::new(HashMap::new()) })
    }

    /// The most slots one user holds at once.
    pub fn per_user(&self) -> usize {
        self.per_user
    }

    /// A slot for `owner` when they hold fewer than their share; None otherwise.
    pub fn try_take(self: &Arc<Self>, owner: &str) -> Option<Share> {
        let mut held = self.held.lock();
        let n = held.entry(owner.to_owned()).or_insert(0);
        if *n >= self.per_user {
            return None;
        }
        *n += 1;
        Some(Share { shares: Arc::clone(self), owner: owner.to_owned() })
    }

    /// A slot for `owner` whatever they hold (a call claimed already: it runs).
    pub fn take(self: &Arc<Self>, owner: &str) -> Share {
        *self.held.lock().entry(owner.to_owned()).or_insert(0) += 1;
        Share { shares: Arc::clone(self), owner: owner.to_owned() }
    }

    /// For the first `free` of `queued` (owners of queued calls in queue order, one entry per
    /// call), the shares while each owner has one left: stops at the first call whose owner
    /// has none (the calls claimed must be a prefix of the queue).
    pub fn take_prefix(self: &Arc<Self>, queued: &[String], free: usize) -> Vec<Share> {
        let mut held = self.held.lock();
        let mut taken = Vec::new();
        for owner in queued.iter().take(free) {
            let n = held.entry(owner.clone()).or_insert(0);
            if *n >= self.per_user {
                break;
            }
            *n += 1;
            taken.push(Share { shares: Arc::clone(self), owner: owner.clone() });
        }
        taken
    }

    /// The users holding their whole share.
    pub fn full(&self) -> Vec<String> {
        self.held.lock().iter().filter(|(_, n)| **n >= self.per_user).map(|(o, _)| o.clone()).collect()
    }

    /// How many slots `owner` holds.
    pub fn held(&self, owner: &str) -> usize {
        self.held.lock().get(owner).copied().unwrap_or(0)
    }

    /// Whether `owner` holds their whole share.
    pub fn is_full(&self, owner: &str) -> bool {
        self.held(owner) >= self.per_user
    }
}

impl Share {
    /// Whose slot this is.
    pub fn owner(&self) -> &str {
        &self.owner
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock();
        if let Some(n) = held.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_user_holds_at_most_their_share_and_gets_it_back() {
        let shares = Shares::new(2);
        let a1 = shares.try_take("a").unwrap();
        let _a2 = shares.try_take("a").unwrap();
        assert!(shares.try_take("a").is_none(), "a third slot for a");
        assert_eq!(shares.full(), owners(&["a"]));
        let _b = shares.try_take("b").unwrap();
        drop(a1);
        assert!(shares.full().is_empty());
        assert_eq!(shares.held("a"), 1);
        // A call claimed already runs whatever its owner holds.
        let _a3 = shares.take("a");
        let _a4 = shares.take("a");
        assert_eq!(shares.held("a"), 3);
    }

    #[test]
    fn a_prefix_stops_at_the_first_call_past_its_owners_share() {
        let shares = Shares::new(2);
        let _held = shares.try_take("a").unwrap();
        let taken = shares.take_prefix(&owners(&["b", "a", "b", "a", "c"]), 10);
        let got: Vec<&str> = taken.iter().map(Share::owner).collect();
        assert_eq!(got, ["b", "a", "b"], "a's second queued call is past a's share");
        assert_eq!(shares.held("a"), 2);
        drop(taken);
        assert_eq!((shares.held("a"), shares.held("b")), (1, 0));
        assert_eq!(shares.take_prefix(&owners(&["c", "c", "c"]), 2).len(), 2, "no more than free");
        assert_eq!(shares.held("c"), 0, "dropped shares are given back");
    }
}
