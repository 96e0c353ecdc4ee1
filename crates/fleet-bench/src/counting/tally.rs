//! [`Tally`]: the counts of [`super::Counters`] at one moment, as plain numbers that subtract
//! (what happened in between) and add up (several machines or roles).

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

use super::{CLASSES, Class, METHODS, Method};

/// Counts at one moment; subtract two to get what happened in between.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub(super) requests: [[u64; CLASSES]; METHODS],
    pub(super) puts: [u64; CLASSES],
    pub(super) deletes: [u64; CLASSES],
    pub errors: u64,
    /// Requests that failed on their deadline.
    pub timeouts: u64,
    /// The same, per method.
    pub(super) method_timeouts: [u64; METHODS],
    /// Keep-alives of a lease etcd no longer had.
    pub leases_lost: u64,
    /// Keys and values returned by range reads.
    pub read_bytes: u64,
    pub watch_messages: u64,
    pub watch_events: u64,
    /// The slowest request so far (not a difference: the maximum since counting began).
    pub(super) latency_max_us: [u64; METHODS],
    pub(super) latency_sum_us: [u64; METHODS],
}

impl Tally {
    /// The slowest `method` request since counting began.
    pub fn max_latency(&self, method: Method) -> Duration {
        Duration::from_micros(self.latency_max_us[method.index()])
    }

    /// `txn 20, range 3`: the requests that failed on their deadline, by method (none: empty).
    pub fn timeouts_by_method(&self) -> String {
        let parts: Vec<String> = Method::ALL
            .iter()
            .map(|m| (m, self.method_timeouts[m.index()]))
            .filter(|(_, n)| *n > 0)
            .map(|(m, n)| format!("{} {n}", m.label()))
            .collect();
        parts.join(", ")
    }

    /// The mean latency of `method` requests in this tally.
    pub fn mean_latency(&self, method: Method) -> Duration {
        let n = self.method(method).max(1);
        Duration::from_micros(self.latency_sum_us[method.index()] / n)
    }

    pub fn requests(&self, method: Method, class: Class) -> u64 {
        self.requests[method.index()][class.index()]
    }

    pub fn method(&self, method: Method) -> u64 {
        self.requests[method.index()].iter().sum()
    }

    pub fn total(&self) -> u64 {
        self.requests.iter().flatten().sum()
    }

    /// Put and delete operations applied by transactions that touched `class`.
    pub fn writes(&self, class: Class) -> u64 {
        self.puts[class.index()] + self.deletes[class.index()]
    }

    pub fn all_writes(&self) -> u64 {
        self.puts.iter().sum::<u64>() + self.deletes.iter().sum::<u64>()
    }

    /// Every (method, class) with a non-zero count, largest first.
    pub fn breakdown(&self) -> Vec<(Method, Class, u64)> {
        let mut out: Vec<(Method, Class, u64)> = Method::ALL
            .iter()
            .flat_map(|m| Class::ALL.iter().map(move |c| (*m, *c)))
            .map(|(m, c)| (m, c, self.requests(m, c)))
            .filter(|(_, _, n)| *n > 0)
            .collect();
        out.sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
        out
    }
}

fn zip2<const A: usize, const B: usize>(
    a: [[u64; B]; A],
    b: [[u64; B]; A],
    f: impl Fn(u64, u64) -> u64 + Copy,
) -> [[u64; B]; A] {
    std::array::from_fn(|i| std::array::from_fn(|j| f(a[i][j], b[i][j])))
}

fn zip<const A: usize>(a: [u64; A], b: [u64; A], f: impl Fn(u64, u64) -> u64) -> [u64; A] {
    std::array::from_fn(|i| f(a[i], b[i]))
}

impl Sub for Tally {
    type Output = Tally;
    fn sub(self, o: Tally) -> Tally {
        let f = u64::saturating_sub;
        Tally {
            requests: zip2(self.requests, o.requests, f),
            puts: zip(self.puts, o.puts, f),
            deletes: zip(self.deletes, o.deletes, f),
            errors: f(self.errors, o.errors),
            timeouts: f(self.timeouts, o.timeouts),
            method_timeouts: zip(self.method_timeouts, o.method_timeouts, f),
            leases_lost: f(self.leases_lost, o.leases_lost),
            read_bytes: f(self.read_bytes, o.read_bytes),
            watch_messages: f(self.watch_messages, o.watch_messages),
            watch_events: f(self.watch_events, o.watch_events),
            latency_max_us: self.latency_max_us,
            latency_sum_us: zip(self.latency_sum_us, o.latency_sum_us, f),
        }
    }
}

impl Add for Tally {
    type Output = Tally;
    fn add(self, o: Tally) -> Tally {
        let f = |a: u64, b: u64| a + b;
        Tally {
            requests: zip2(self.requests, o.requests, f),
            puts: zip(self.puts, o.puts, f),
            deletes: zip(self.deletes, o.deletes, f),
            errors: self.errors + o.errors,
            timeouts: self.timeouts + o.timeouts,
            method_timeouts: zip(self.method_timeouts, o.method_timeouts, |a, b| a + b),
            leases_lost: self.leases_lost + o.leases_lost,
            read_bytes: self.read_bytes + o.read_bytes,
            watch_messages: self.watch_messages + o.watch_messages,
            watch_events: self.watch_events + o.watch_events,
            latency_max_us: zip(self.latency_max_us, o.latency_max_us, u64::max),
            latency_sum_us: zip(self.latency_sum_us, o.latency_sum_us, |a, b| a + b),
        }
    }
}

impl fmt::Display for Tally {
    /// `range/schedule 12, txn/state 10, ...`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .breakdown()
            .iter()
            .map(|(m, c, n)| format!("{} {}/{}", n, m.label(), c.label()))
            .collect();
        f.write_str(&parts.join(", "))
    }
}
