//! The contact cache of relayed lookups ([`chfs_proto::Request::Lookup`]):
//! answers this server fetched from the owners of entries it does not
//! own, kept for a bounded time, and the lookups in flight to owners, so
//! that identical lookups arriving meanwhile wait for the same answer
//! instead of each sending a request (coalescing). The handler
//! (`handler::relay_lookup`) sends the requests; this module only keeps
//! the state.
//!
//! Invalidation: the contact asks the owner with `WatchStat`, and the
//! owner remembers it ([`Watchers`]) for as long as the contact may keep
//! the answer; when the entry changes, the owner tells it
//! (`Invalidate`) before it answers the change. An answer in flight
//! when its invalidation arrives is handed to the lookups waiting for it
//! but not kept. A contact the owner cannot reach keeps its answer until
//! it expires.
//!
//! Second lookups only (as CHFS): the first lookup of a path (none kept
//! or in flight, and none in the last `cap`) is passed to the owner as a
//! plain lookup, [`Step::Pass`]: the owner does not remember this contact
//! and the answer is not kept, so files looked up once (file per process)
//! cost no cache entry here, no watch at the owner and no invalidation
//! when they change later. Only a path looked up again within `cap` is
//! asked with `WatchStat` and kept. A storm of lookups of one path costs
//! the owner at most two requests per contact: the first passed, then the
//! one the others wait for. A passed lookup is not joined (the owner
//! would not tell this contact of a change, so a lookup arriving after a
//! change completed could get the answer read before it).
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
    /// The first lookup of the path: ask the owner without `WatchStat`
    /// and keep nothing.
    Pass,
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
    /// When paths in flight were invalidated (their answers then are not
    /// kept).
    invalidated: Mutex<HashMap<String, Instant>>,
    /// Paths looked up once (when), not kept.
    seen: Mutex<HashMap<String, Instant>>,
    /// The lookups waiting for requests in flight that a newer request
    /// for the same path replaced in `inflight`, by request.
    superseded: Mutex<HashMap<u64, Vec<oneshot::Sender<Answer>>>>,
    next: std::sync::atomic::AtomicU64,
}

impl Contact {
    /// A cache keeping answers at most `cap` (zero: none are kept).
    pub fn new(cap: Duration) -> Self {
        Self {
            cap,
            cache: Mutex::default(),
            inflight: Mutex::default(),
            invalidated: Mutex::default(),
            seen: Mutex::default(),
            superseded: Mutex::default(),
            next: Default::default(),
        }
    }

    /// The longest time an answer is kept.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The owner of `path` changed it: what is kept is dropped, and an
    /// answer in flight is not kept.
    pub fn invalidate(&self, path: &str) {
        lock(&self.cache).remove(path);
        if lock(&self.inflight).contains_key(path) {
            lock(&self.invalidated).insert(path.to_string(), Instant::now());
        }
    }

    /// The next step of a lookup of `path` that accepts answers at most
    /// `max_age` old.
    pub fn begin(&self, path: &str, max_age: Duration) -> Step {
        let age = max_age.min(self.cap);
        // An answer is kept (if too old for this lookup): not a first one.
        let mut kept = false;
        if let Some(c) = lock(&self.cache).get(path) {
            if !age.is_zero() && c.sent.elapsed() <= age {
                return Step::Hit(c.answer.clone());
            }
            kept = true;
        }
        let (tx, rx) = oneshot::channel();
        let mut inflight = lock(&self.inflight);
        if let Some(f) = inflight.get_mut(path) {
            // Not one whose answer an invalidation made stale: a lookup
            // arriving now may have been issued after the change.
            let invalidated = lock(&self.invalidated)
                .get(path)
                .is_some_and(|&t| t >= f.sent);
            if f.sent.elapsed() <= max_age && !invalidated {
                f.waiters.push(tx);
                return Step::Wait(rx);
            }
        } else if !kept && !self.cap.is_zero() && self.first(path) {
            return Step::Pass;
        }
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let sent = Instant::now();
        let old = inflight.insert(
            path.to_string(),
            InFlight {
                id,
                sent,
                waiters: vec![tx],
            },
        );
        if let Some(old) = old {
            // Its lookups still get its answer.
            lock(&self.superseded).insert(old.id, old.waiters);
        }
        Step::Lead { id, sent, rx }
    }

    /// Is this the first lookup of `path` within `cap` (it is then
    /// remembered as seen)?
    fn first(&self, path: &str) -> bool {
        let cap = self.cap;
        let mut seen = lock(&self.seen);
        if seen.get(path).is_some_and(|t| t.elapsed() <= cap) {
            return false;
        }
        if seen.len() >= CAPACITY && !seen.contains_key(path) {
            seen.retain(|_, t| t.elapsed() <= cap);
            if seen.len() >= CAPACITY {
                // (the paths then count as seen once more)
                seen.clear();
            }
        }
        seen.insert(path.to_string(), Instant::now());
        true
    }

    /// The owner answered request `id` (sent at `sent`) for `path`: keeps
    /// the answer when it is worth keeping and hands it to every lookup
    /// waiting for it.
    pub fn finish(&self, path: &str, id: u64, sent: Instant, answer: Answer) {
        let stale = {
            // (locks in the order of `begin`: in flight, then invalidated)
            let inflight = lock(&self.inflight);
            let mut inv = lock(&self.invalidated);
            let stale = inv.get(path).is_some_and(|&t| t >= sent);
            if inflight.get(path).is_none_or(|f| f.id == id) {
                inv.remove(path);
            }
            stale
        };
        let keep = !stale
            && match &answer {
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
                _ => lock(&self.superseded).remove(&id),
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

/// At an owner: the contact servers that keep an answer about a path
/// (until when), to be told when it changes.
#[derive(Default)]
pub(crate) struct Watchers {
    /// Any contact ever asked (else nothing is looked up: no cost while
    /// lookups are not relayed).
    used: std::sync::atomic::AtomicBool,
    by_path: Mutex<HashMap<String, Vec<(String, Instant)>>>,
}

impl Watchers {
    /// `contact` keeps an answer about `path` for `keep`.
    pub fn watch(&self, path: &str, contact: &str, keep: Duration) {
        if keep.is_zero() {
            return;
        }
        self.used.store(true, std::sync::atomic::Ordering::Relaxed);
        let until = Instant::now() + keep;
        let mut m = lock(&self.by_path);
        if m.len() >= CAPACITY && !m.contains_key(path) {
            let now = Instant::now();
            m.retain(|_, v| v.iter().any(|(_, t)| *t > now));
            if m.len() >= CAPACITY {
                // (their contacts' answers expire on their own)
                m.clear();
            }
        }
        let v = m.entry(path.to_string()).or_default();
        match v.iter_mut().find(|(c, _)| c == contact) {
            Some(w) => w.1 = w.1.max(until),
            None => v.push((contact.to_string(), until)),
        }
    }

    /// The contacts still keeping an answer about a path for which
    /// `keep(path)` is false (this server no longer owns it: the server
    /// list changed), by path; forgotten here.
    pub fn take_unless(&self, keep: impl Fn(&str) -> bool) -> Vec<(String, Vec<String>)> {
        let now = Instant::now();
        let mut m = lock(&self.by_path);
        let gone: Vec<String> = m.keys().filter(|p| !keep(p)).cloned().collect();
        gone.into_iter()
            .filter_map(|p| {
                let live: Vec<String> = m
                    .remove(&p)?
                    .into_iter()
                    .filter(|(_, t)| *t > now)
                    .map(|(c, _)| c)
                    .collect();
                (!live.is_empty()).then_some((p, live))
            })
            .collect()
    }

    /// Has any contact ever asked?
    pub fn used(&self) -> bool {
        self.used.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The contacts still keeping an answer about `path` or (with
    /// `below`) a path inside it, by path; forgotten here.
    pub fn take(&self, path: &str, below: bool) -> Vec<(String, Vec<String>)> {
        let now = Instant::now();
        let mut m = lock(&self.by_path);
        let paths: Vec<String> = if below {
            m.keys()
                .filter(|p| chfs_proto::path::is_within(p, path))
                .cloned()
                .collect()
        } else if m.contains_key(path) {
            vec![path.to_string()]
        } else {
            return Vec::new();
        };
        paths
            .into_iter()
            .filter_map(|p| {
                let v = m.remove(&p)?;
                let live: Vec<String> = v
                    .into_iter()
                    .filter(|(_, t)| *t > now)
                    .map(|(c, _)| c)
                    .collect();
                (!live.is_empty()).then_some((p, live))
            })
            .collect()
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

    /// The first lookup of `p` (passed to the owner, nothing kept).
    fn pass(c: &Contact, p: &str) {
        assert!(
            matches!(c.begin(p, Duration::from_secs(1)), Step::Pass),
            "a first lookup of {p} is passed"
        );
    }

    #[test]
    fn only_a_second_lookup_is_kept_and_a_passed_one_is_not_joined() {
        let c = Contact::new(Duration::from_millis(50));
        pass(&c, "/a");
        pass(&c, "/b");
        // A second lookup leads the request others wait for.
        let Step::Lead { id, sent, .. } = c.begin("/a", Duration::from_secs(1)) else {
            panic!("a second lookup leads");
        };
        assert!(matches!(
            c.begin("/a", Duration::from_secs(1)),
            Step::Wait(_)
        ));
        c.finish("/a", id, sent, Ok(meta(3)));
        assert!(matches!(c.begin("/a", Duration::from_secs(1)), Step::Hit(Ok(m)) if m.size == 3));
        // Once expired, a kept path is not a first lookup again.
        std::thread::sleep(Duration::from_millis(60));
        assert!(matches!(
            c.begin("/a", Duration::from_secs(1)),
            Step::Lead { .. }
        ));
        // A path seen longer than the cap ago is a first lookup again.
        pass(&c, "/b");
        // No cache: no first lookups either (nothing would be kept).
        let z = Contact::new(Duration::ZERO);
        assert!(matches!(
            z.begin("/a", Duration::from_secs(1)),
            Step::Lead { .. }
        ));
    }

    #[test]
    fn a_request_invalidated_in_flight_is_not_joined() {
        let c = Contact::new(Duration::from_secs(10));
        pass(&c, "/a");
        let Step::Lead { id, sent, rx } = c.begin("/a", Duration::from_secs(5)) else {
            panic!()
        };
        c.invalidate("/a");
        // A lookup arriving after the change leads a request of its own.
        let Step::Lead {
            id: id2,
            sent: sent2,
            rx: rx2,
        } = c.begin("/a", Duration::from_secs(5))
        else {
            panic!("not joined after its invalidation");
        };
        c.finish("/a", id, sent, Ok(meta(1)));
        c.finish("/a", id2, sent2, Ok(meta(2)));
        assert_eq!(rx.blocking_recv().unwrap().unwrap().size, 1);
        assert_eq!(rx2.blocking_recv().unwrap().unwrap().size, 2);
        assert!(matches!(c.begin("/a", Duration::from_secs(5)), Step::Hit(Ok(m)) if m.size == 2));
    }

    #[test]
    fn identical_lookups_share_one_request_and_the_answer_is_kept() {
        let c = Contact::new(Duration::from_secs(10));
        pass(&c, "/a");
        pass(&c, "/b");
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
        pass(&c, "/a");
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
    fn an_answer_invalidated_in_flight_is_given_but_not_kept() {
        let c = Contact::new(Duration::from_secs(10));
        pass(&c, "/a");
        let Step::Lead { id, sent, rx } = c.begin("/a", Duration::from_secs(5)) else {
            panic!()
        };
        c.invalidate("/a");
        c.finish("/a", id, sent, Ok(meta(1)));
        assert_eq!(rx.blocking_recv().unwrap().unwrap().size, 1);
        let Step::Lead { id, sent, .. } = c.begin("/a", Duration::from_secs(5)) else {
            panic!("not kept");
        };
        c.finish("/a", id, sent, Ok(meta(2)));
        assert!(matches!(c.begin("/a", Duration::from_secs(5)), Step::Hit(Ok(m)) if m.size == 2));
        c.invalidate("/a");
        assert!(matches!(
            c.begin("/a", Duration::from_secs(5)),
            Step::Lead { .. }
        ));
    }

    #[test]
    fn watchers_are_taken_once_and_expire() {
        let w = Watchers::default();
        assert!(!w.used());
        w.watch("/d/a", "c1:1", Duration::from_secs(10));
        w.watch("/d/a", "c2:1", Duration::from_secs(10));
        w.watch("/d/b", "c1:1", Duration::from_millis(1));
        w.watch("/e", "c1:1", Duration::from_secs(10));
        assert!(w.used());
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            w.take("/d/a", false),
            vec![(
                "/d/a".to_string(),
                vec!["c1:1".to_string(), "c2:1".to_string()]
            )]
        );
        assert!(w.take("/d/a", false).is_empty(), "taken once");
        assert!(w.take("/d", true).is_empty(), "/d/b expired");
        assert_eq!(w.take("/", true).len(), 1);
        // Those of paths this server no longer owns.
        w.watch("/mine", "c1:1", Duration::from_secs(10));
        w.watch("/moved", "c1:1", Duration::from_secs(10));
        w.watch("/moved", "c2:1", Duration::from_secs(10));
        assert_eq!(
            w.take_unless(|p| p == "/mine"),
            vec![(
                "/moved".to_string(),
                vec!["c1:1".to_string(), "c2:1".to_string()]
            )]
        );
        assert_eq!(w.take("/", true).len(), 1, "/mine stays");
    }

    #[test]
    fn a_forgotten_path_is_asked_again_and_no_cap_keeps_nothing() {
        let c = Contact::new(Duration::from_secs(10));
        pass(&c, "/a");
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
