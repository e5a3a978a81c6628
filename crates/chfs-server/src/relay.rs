//! The contact cache of relayed lookups ([`chfs_proto::Request::Lookup`]):
//! answers this server fetched from the owners of entries it does not
//! own, kept for a bounded time, and the lookups in flight to owners, so
//! that identical lookups arriving meanwhile wait for the same answer
//! instead of each sending a request (coalescing). The handler
//! (`handler::relay_lookup`) sends the requests; this module only keeps
//! the state.
//!
//! Freshness: an answer is stamped with the time its request to the owner
//! was *sent* (the owner read its entry after that), and a lookup takes
//! it only when that is at most `min(its max age, the server's cap)` ago.
//! A lookup joins a request in flight only under the same rule. Only
//! answers that say something about the entry are kept (its metadata, or
//! ENOENT); transport failures are passed on and forgotten.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chfs_proto::{ErrorReply, Meta};
use chfs_sys::lock;
use tokio::sync::oneshot;

/// What a lookup answers: the entry, or why not.
pub(crate) type Answer = Result<Meta, ErrorReply>;

/// Most answers kept; beyond, expired ones are dropped, then all.
const CAPACITY: usize = 65_536;

struct Cached {
    sent: Instant,
    answer: Answer,
}

struct InFlight {
    /// Which request (so that a newer one in the table is not removed by
    /// an older one finishing).
    id: u64,
    sent: Instant,
    waiters: Vec<oneshot::Sender<Answer>>,
}

/// What a lookup does next ([`Contact::begin`]).
pub(crate) enum Step {
    /// Answered from the cache.
    Hit(Answer),
    /// Wait for the request in flight.
    Wait(oneshot::Receiver<Answer>),
    /// Send the request to the owner (request `id`, sent now), then
    /// [`Contact::finish`] it; the answer also arrives on the receiver.
    Lead {
        id: u64,
        sent: Instant,
        rx: oneshot::Receiver<Answer>,
    },
}

/// The contact cache of one server.
pub(crate) struct Contact {
    cap: Duration,
    cache: Mutex<HashMap<String, Cached>>,
    inflight: Mutex<HashMap<String, InFlight>>,
    next: std::sync::atomic::AtomicU64,
}

impl Contact {
    /// A cache keeping answers at most `cap` (zero: none are kept).
    pub fn new(cap: Duration) -> Self {
        Self {
            cap,
            cache: Mutex::default(),
            inflight: Mutex::default(),
            next: Default::default(),
        }
    }

    /// The next step of a lookup of `path` that accepts answers at most
    /// `max_age` old.
    pub fn begin(&self, path: &str, max_age: Duration) -> Step {
        let age = max_age.min(self.cap);
        if !age.is_zero() {
            if let Some(c) = lock(&self.cache).get(path) {
                if c.sent.elapsed() <= age {
                    return Step::Hit(c.answer.clone());
                }
            }
        }
        let (tx, rx) = oneshot::channel();
        let mut inflight = lock(&self.inflight);
        if let Some(f) = inflight.get_mut(path) {
            if f.sent.elapsed() <= max_age {
                f.waiters.push(tx);
                return Step::Wait(rx);
            }
        }
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let sent = Instant::now();
        inflight.insert(
            path.to_string(),
            InFlight {
                id,
                sent,
                waiters: vec![tx],
            },
        );
        Step::Lead { id, sent, rx }
    }

    /// The owner answered request `id` (sent at `sent`) for `path`: keeps
    /// the answer when it is worth keeping and hands it to every lookup
    /// waiting for it.
    pub fn finish(&self, path: &str, id: u64, sent: Instant, answer: Answer) {
        let keep = match &answer {
            Ok(_) => true,
            Err(e) => e.errno == libc::ENOENT,
        };
        if keep && !self.cap.is_zero() {
            let mut cache = lock(&self.cache);
            if cache.len() >= CAPACITY && !cache.contains_key(path) {
                let cap = self.cap;
                cache.retain(|_, c| c.sent.elapsed() <= cap);
                if cache.len() >= CAPACITY {
                    cache.clear();
                }
            }
            // A newer answer already kept stays.
            if cache.get(path).is_none_or(|c| c.sent <= sent) {
                cache.insert(
                    path.to_string(),
                    Cached {
                        sent,
                        answer: answer.clone(),
                    },
                );
            }
        }
        let waiters = {
            let mut inflight = lock(&self.inflight);
            match inflight.get(path) {
                Some(f) if f.id == id => inflight.remove(path).map(|f| f.waiters),
                _ => None,
            }
        };
        for tx in waiters.into_iter().flatten() {
            let _ = tx.send(answer.clone());
        }
    }

    /// Forgets what is kept about `path` (this server changed it).
    pub fn forget(&self, path: &str) {
        if !self.cap.is_zero() {
            lock(&self.cache).remove(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(size: u64) -> Meta {
        Meta {
            mode: libc::S_IFREG | 0o644,
            size,
            ..Default::default()
        }
    }

    #[test]
    fn identical_lookups_share_one_request_and_the_answer_is_kept() {
        let c = Contact::new(Duration::from_secs(10));
        let Step::Lead { id, sent, rx } = c.begin("/a", Duration::from_secs(1)) else {
            panic!("the first lookup leads");
        };
        let Step::Wait(rx2) = c.begin("/a", Duration::from_secs(1)) else {
            panic!("an identical lookup waits");
        };
        // Another path is another request.
        assert!(matches!(
            c.begin("/b", Duration::from_secs(1)),
            Step::Lead { .. }
        ));
        c.finish("/a", id, sent, Ok(meta(7)));
        assert_eq!(rx.blocking_recv().unwrap().unwrap().size, 7);
        assert_eq!(rx2.blocking_recv().unwrap().unwrap().size, 7);
        match c.begin("/a", Duration::from_secs(1)) {
            Step::Hit(Ok(m)) => assert_eq!(m.size, 7),
            _ => panic!("kept"),
        }
        // A lookup that accepts nothing cached asks again.
        assert!(matches!(c.begin("/a", Duration::ZERO), Step::Lead { .. }));
    }

    #[test]
    fn answers_expire_and_failures_are_not_kept() {
        let c = Contact::new(Duration::from_millis(30));
        let Step::Lead { id, sent, .. } = c.begin("/a", Duration::from_secs(5)) else {
            panic!()
        };
        c.finish("/a", id, sent, Err(ErrorReply::new(libc::ENOENT, "no")));
        assert!(matches!(
            c.begin("/a", Duration::from_secs(5)),
            Step::Hit(Err(_))
        ));
        // The server's cap bounds what a client asks for.
        std::thread::sleep(Duration::from_millis(40));
        let Step::Lead { id, sent, .. } = c.begin("/a", Duration::from_secs(5)) else {
            panic!("expired");
        };
        c.finish(
            "/a",
            id,
            sent,
            Err(ErrorReply::new(libc::ETIMEDOUT, "slow")),
        );
        assert!(matches!(
            c.begin("/a", Duration::from_secs(5)),
            Step::Lead { .. }
        ));
    }

    #[test]
    fn a_forgotten_path_is_asked_again_and_no_cap_keeps_nothing() {
        let c = Contact::new(Duration::from_secs(10));
        let Step::Lead { id, sent, .. } = c.begin("/a", Duration::from_secs(5)) else {
            panic!()
        };
        c.finish("/a", id, sent, Ok(meta(1)));
        c.forget("/a");
        assert!(matches!(
            c.begin("/a", Duration::from_secs(5)),
            Step::Lead { .. }
        ));
        let c = Contact::new(Duration::ZERO);
        let Step::Lead { id, sent, .. } = c.begin("/a", Duration::from_secs(5)) else {
            panic!()
        };
        c.finish("/a", id, sent, Ok(meta(1)));
        assert!(matches!(
            c.begin("/a", Duration::from_secs(5)),
            Step::Lead { .. }
        ));
    }
}
