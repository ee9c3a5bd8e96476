//! The messages a broker backend holds in this process, fenced by their lease tokens.
//!
//! A broker accepts some calls with a stale token (SQS takes an old receipt handle for some) or
//! changes the token on every update (Azure's pop receipt), and a push broker's deliveries live
//! only here (QStash): so each claim's tokens are kept here, and a call with a token that is not
//! the claim's finds nothing, or [`LeaseLost`](ErrorKind::LeaseLost) through [`Held::fence`].

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};

/// Past this many entries, a [`Held::new`] table drops those untouched for [`HELD_FOR`]: a
/// message settled by another process would otherwise stay for ever.
pub const HELD_MAX: usize = 10_000;
/// How long an entry stays untouched before it may be dropped (see [`HELD_MAX`]).
pub const HELD_FOR: Duration = Duration::from_secs(15 * 60);
/// Tokens one claim keeps: its first (the worker's lease may still carry it) and the latest.
pub const TOKENS_KEPT: usize = 4;

/// Held messages by key (a message id, or the lease token itself where the token is the only
/// name a claim has), each with its claim's tokens and the backend's own `T`.
///
/// Every call takes the lock for its own length only, and never calls out while holding it.
pub struct Held<T> {
    entries: Mutex<HashMap<String, Entry<T>>>,
    /// Past this many entries, those untouched this long are dropped; `None`: never.
    limit: Option<(usize, Duration)>,
}

struct Entry<T> {
    /// The claim's tokens: its first and the latest few, the current one last.
    tokens: Vec<String>,
    value: T,
    touched: Instant,
}

impl<T> Entry<T> {
    fn holds(&self, token: &str) -> bool {
        self.tokens.iter().any(|t| t == token)
    }
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Held<T> {
    /// A table that drops entries untouched for [`HELD_FOR`] once it holds [`HELD_MAX`].
    pub fn new() -> Self {
        Self::with_limit(HELD_MAX, HELD_FOR)
    }

    /// A table that drops entries untouched for `age` once it holds `max`.
    pub fn with_limit(max: usize, age: Duration) -> Self {
        Self { entries: Mutex::default(), limit: Some((max, age)) }
    }

    /// A table that never drops an entry: its owner removes each (a push broker's deliveries,
    /// which lapse on their own timers).
    pub fn unbounded() -> Self {
        Self { entries: Mutex::default(), limit: None }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry<T>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `value` under `key` with `token`, in place of any earlier claim of it.
    pub fn insert(&self, key: impl Into<String>, token: impl Into<String>, value: T) {
        self.replace(key, token, |_| value);
    }

    /// Holds what `value` makes of the earlier claim's value under `key` (if this process still
    /// holds one, its lease unsettled), with `token`.
    pub fn replace(&self, key: impl Into<String>, token: impl Into<String>, value: impl FnOnce(Option<&T>) -> T) {
        let mut entries = self.lock();
        if let Some((max, age)) = self.limit
            && entries.len() >= max
        {
            entries.retain(|_, e| e.touched.elapsed() < age);
        }
        let key = key.into();
        let value = value(entries.get(&key).map(|e| &e.value));
        entries.insert(key, Entry { tokens: vec![token.into()], value, touched: Instant::now() });
    }

    /// What `f` makes of the value `key` holds, if `token` is one of its claim's.
    pub fn with<R>(&self, key: &str, token: &str, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.lock().get_mut(key).filter(|e| e.holds(token)).map(|e| f(&mut e.value))
    }

    /// [`LeaseLost`](ErrorKind::LeaseLost) if `key` is held under a claim `token` is not one of
    /// (received again since); a key not held here is the broker's to fence.
    pub fn fence(&self, key: &str, token: &str) -> Result<()> {
        match self.lock().get(key) {
            Some(e) if !e.holds(token) => {
                Err(Error::new(ErrorKind::LeaseLost, format!("message {key} was received again since")))
            }
            _ => Ok(()),
        }
    }

    /// The current token of the claim `token` is one of; `None` if it is not held here.
    pub fn latest(&self, key: &str, token: &str) -> Option<String> {
        self.lock().get(key).filter(|e| e.holds(token)).and_then(|e| e.tokens.last().cloned())
    }

    /// Records `new` as the current token of the claim `token` is one of (it keeps its first
    /// and the latest, [`TOKENS_KEPT`] in all), touches it, and gives its value to `f`.
    pub fn renew<R>(&self, key: &str, token: &str, new: String, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let mut entries = self.lock();
        let entry = entries.get_mut(key).filter(|e| e.holds(token))?;
        if entry.tokens.len() >= TOKENS_KEPT {
            entry.tokens.remove(1);
        }
        entry.tokens.push(new);
        entry.touched = Instant::now();
        Some(f(&mut entry.value))
    }

    /// Removes the entry of `key` if `token` is one of its claim's.
    pub fn remove(&self, key: &str, token: &str) -> Option<T> {
        self.remove_if(key, token, |_| true)
    }

    /// Removes the entry of `key` if `token` is one of its claim's and `keep` says so of its value.
    pub fn remove_if(&self, key: &str, token: &str, keep: impl FnOnce(&T) -> bool) -> Option<T> {
        let mut entries = self.lock();
        if entries.get(key).is_some_and(|e| e.holds(token) && keep(&e.value)) {
            return entries.remove(key).map(|e| e.value);
        }
        None
    }

    /// Whether any held value is one `f` looks for.
    pub fn any(&self, f: impl FnMut(&T) -> bool) -> bool {
        self.lock().values().map(|e| &e.value).any(f)
    }

    /// How many messages are held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

impl<T> std::fmt::Debug for Held<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Tokens are never shown.
        f.debug_struct("Held").field("len", &self.len()).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step on a table, and what it answers.
    enum Step {
        Insert(&'static str, &'static str, u32),
        Renew(&'static str, &'static str, &'static str),
        Fence(&'static str, &'static str, bool),
        Get(&'static str, &'static str, Option<u32>),
        Latest(&'static str, &'static str, Option<&'static str>),
        Remove(&'static str, &'static str, Option<u32>),
        Len(usize),
    }
    use Step::*;

    fn run(table: &Held<u32>, steps: &[Step]) {
        for (n, step) in steps.iter().enumerate() {
            match *step {
                Insert(key, token, value) => table.insert(key, token, value),
                Renew(key, token, new) => drop(table.renew(key, token, new.to_owned(), |_| ())),
                Fence(key, token, ok) => assert_eq!(table.fence(key, token).is_ok(), ok, "step {n}"),
                Get(key, token, want) => assert_eq!(table.with(key, token, |v| *v), want, "step {n}"),
                Latest(key, token, want) => assert_eq!(table.latest(key, token).as_deref(), want, "step {n}"),
                Remove(key, token, want) => assert_eq!(table.remove(key, token), want, "step {n}"),
                Len(want) => assert_eq!(table.len(), want, "step {n}"),
            }
        }
    }

    #[test]
    fn a_claim_is_found_and_fenced_by_its_token() {
        let cases: &[(&str, &[Step])] = &[
            ("its own token finds it", &[Insert("m", "r1", 1), Get("m", "r1", Some(1)), Fence("m", "r1", true)]),
            ("another token does not", &[Insert("m", "r1", 1), Get("m", "r0", None), Fence("m", "r0", false)]),
            ("a key not held is the broker's to fence", &[Fence("m", "r1", true), Get("m", "r1", None)]),
            (
                "a new receive stales the old token",
                &[Insert("m", "r1", 1), Insert("m", "r2", 2), Fence("m", "r1", false), Get("m", "r2", Some(2))],
            ),
            (
                "removed only by its own token",
                &[Insert("m", "r1", 1), Remove("m", "r0", None), Len(1), Remove("m", "r1", Some(1)), Len(0)],
            ),
            (
                "a renewal's tokens all stand for the claim, the latest current",
                &[
                    Insert("m", "r1", 1),
                    Renew("m", "r1", "r2"),
                    Renew("m", "r2", "r3"),
                    Latest("m", "r1", Some("r3")),
                    Latest("m", "r2", Some("r3")),
                    Fence("m", "r2", true),
                ],
            ),
            (
                "a claim keeps its first token and the latest",
                &[
                    Insert("m", "r1", 1),
                    Renew("m", "r1", "r2"),
                    Renew("m", "r1", "r3"),
                    Renew("m", "r1", "r4"),
                    Renew("m", "r1", "r5"),
                    Get("m", "r1", Some(1)),
                    Get("m", "r2", None),
                    Get("m", "r5", Some(1)),
                    Latest("m", "r3", Some("r5")),
                ],
            ),
            (
                "a stale token renews nothing",
                &[Insert("m", "r1", 1), Renew("m", "r0", "r9"), Latest("m", "r1", Some("r1"))],
            ),
        ];
        for (name, steps) in cases {
            eprintln!("case: {name}");
            run(&Held::new(), steps);
        }
    }

    #[test]
    fn a_full_table_drops_what_was_untouched_too_long() {
        let table = Held::with_limit(2, Duration::ZERO);
        run(&table, &[Insert("a", "r", 1), Insert("b", "r", 2), Len(2), Insert("c", "r", 3), Len(1)]);
        run(&table, &[Get("a", "r", None), Get("c", "r", Some(3))]);
        let kept = Held::with_limit(2, Duration::from_secs(60));
        run(&kept, &[Insert("a", "r", 1), Insert("b", "r", 2), Insert("c", "r", 3), Len(3)]);
        let unbounded = Held::unbounded();
        run(&unbounded, &[Insert("a", "r", 1), Insert("b", "r", 2), Insert("c", "r", 3), Len(3)]);
    }

    #[test]
    fn a_replacement_sees_the_earlier_claim_and_removal_can_be_refused() {
        let table: Held<(u32, bool)> = Held::new();
        table.insert("m", "r1", (1, false));
        table.replace("m", "r2", |earlier| (2, earlier.is_some()));
        assert_eq!(table.with("m", "r2", |v| *v), Some((2, true)));
        assert_eq!(table.remove_if("m", "r2", |v| !v.1), None, "kept: it fences an older claim");
        assert!(table.any(|v| v.0 == 2) && !table.any(|v| v.0 == 1));
        assert_eq!(table.remove_if("m", "r2", |v| v.1), Some((2, true)));
        assert!(table.is_empty());
    }
}
