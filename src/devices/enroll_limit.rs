//! The attempt limit of `POST /v1/runner/enroll`, which needs no token: wrong enrollment codes
//! are limited per client address and for the whole process, with two in-memory token
//! buckets (docs/runner.md, "Enrollment attempts").
//!
//! Each attempt takes one token from its address's bucket and one from the global bucket
//! before the code is looked at; an attempt that was not a wrong code (it enrolled, or the
//! store failed) gives them back. An empty bucket answers 429 `enrollment_rate_limited` with
//! `Retry-After` (the time until it holds a token again) without looking at the code, so a
//! guesser learns nothing more once limited — a right code from that address waits too. A
//! bucket holds `per minute` tokens and refills at that rate.
//!
//! The address is the TCP peer's (IPv6 addresses by their /64, the block one host usually
//! gets). Behind a reverse proxy every client has the proxy's address and shares its bucket;
//! the buckets are per process, so a cluster of N replicas allows N times the global rate.
//! The map of addresses is bounded: full (refilled) buckets are dropped when it reaches
//! [`MAX_ADDRESSES`], and it starts over if that is not enough.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Most addresses tracked at once.
pub const MAX_ADDRESSES: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(capacity: f64, now: Instant) -> Self {
        Self { tokens: capacity, at: now }
    }

    /// Adds what refilled since the last look (`capacity` per minute, at most `capacity`).
    fn refill(&mut self, capacity: f64, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * capacity / 60.0).min(capacity);
        self.at = now;
    }

    /// How long until the bucket holds one whole token.
    fn wait(&self, capacity: f64) -> Duration {
        if self.tokens >= 1.0 { Duration::ZERO } else { Duration::from_secs_f64((1.0 - self.tokens) * 60.0 / capacity) }
    }
}

struct State {
    global: Bucket,
    by_address: HashMap<IpAddr, Bucket>,
}

/// The two buckets of enrollment attempts (see the module docs).
pub struct EnrollLimiter {
    per_address: f64,
    global: f64,
    state: Mutex<State>,
}

/// One attempt's tokens, taken; [`Attempt::refund`] gives them back.
#[derive(Debug)]
pub struct Attempt {
    address: Option<IpAddr>,
}

/// The key of a client address: IPv4 as is, IPv6 by its /64 (IPv4-mapped as IPv4).
fn key(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

impl EnrollLimiter {
    /// A limiter allowing `per_address` wrong codes a minute from one address and `global`
    /// from all of them (each at least 1).
    pub fn new(per_address: u32, global: u32) -> Self {
        let (per_address, global) = (f64::from(per_address.max(1)), f64::from(global.max(1)));
        let now = Instant::now();
        Self {
            per_address,
            global,
            state: Mutex::new(State { global: Bucket::full(global, now), by_address: HashMap::new() }),
        }
    }

    /// Takes one token from `address`'s bucket (when known) and one from the global bucket,
    /// or says how long to wait when either is empty (nothing is taken then).
    pub fn begin(&self, address: Option<IpAddr>) -> Result<Attempt, Duration> {
        let now = Instant::now();
        let address = address.map(key);
        let mut state = self.state.lock();
        state.global.refill(self.global, now);
        let mut wait = state.global.wait(self.global);
        if let Some(addr) = address {
            if !state.by_address.contains_key(&addr) && state.by_address.len() >= MAX_ADDRESSES {
                let cap = self.per_address;
                state.by_address.retain(|_, b| {
                    b.refill(cap, now);
                    b.tokens < cap
                });
                if state.by_address.len() >= MAX_ADDRESSES {
                    state.by_address.clear();
                }
            }
            let bucket = state.by_address.entry(addr).or_insert_with(|| Bucket::full(self.per_address, now));
            bucket.refill(self.per_address, now);
            wait = wait.max(bucket.wait(self.per_address));
        }
        if !wait.is_zero() {
            return Err(wait);
        }
        state.global.tokens -= 1.0;
        if let Some(bucket) = address.and_then(|a| state.by_address.get_mut(&a)) {
            bucket.tokens -= 1.0;
        }
        Ok(Attempt { address })
    }

    /// Gives an attempt's tokens back: it was not a wrong code.
    pub fn refund(&self, attempt: Attempt) {
        let mut state = self.state.lock();
        state.global.tokens = (state.global.tokens + 1.0).min(self.global);
        let cap = self.per_address;
        if let Some(bucket) = attempt.address.and_then(|a| state.by_address.get_mut(&a)) {
            bucket.tokens = (bucket.tokens + 1.0).min(cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_and_everyone_run_dry_and_a_refund_gives_back() {
        let limiter = EnrollLimiter::new(2, 3);
        let a: IpAddr = "10.0.0.1".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let b: IpAddr = "10.0.0.2".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
        assert!(limiter.begin(Some(a)).is_ok());
        let second = limiter.begin(Some(a));
        assert!(second.is_ok());
        let wait = limiter.begin(Some(a)).err().unwrap_or_default();
        assert!(wait > Duration::from_secs(25) && wait <= Duration::from_secs(30), "{wait:?}");
        if let Ok(attempt) = second {
            limiter.refund(attempt);
        }
        assert!(limiter.begin(Some(a)).is_ok(), "a refunded attempt is free again");
        // Three attempts hold the whole global bucket once another address takes the last.
        assert!(limiter.begin(Some(b)).is_ok());
        let wait = limiter.begin(Some(b)).err().unwrap_or_default();
        assert!(wait > Duration::from_secs(15) && wait <= Duration::from_secs(20), "global: {wait:?}");
    }

    #[test]
    fn ipv6_addresses_share_their_slash_64() {
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap_or(IpAddr::from([0u8; 16]));
        let two: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap_or(IpAddr::from([0u8; 16]));
        assert_eq!(key(one), key(two));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap_or(IpAddr::from([0u8; 16]));
        assert_eq!(key(mapped), "10.0.0.1".parse::<IpAddr>().unwrap_or(IpAddr::from([0, 0, 0, 0])));
    }
}
