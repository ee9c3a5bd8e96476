//! The checks every [`Flow`] store passes, for the stores' own tests: the in-memory one, and each
//! database's.
//!
//! Each check takes two handles on one empty store. For a database, make them two backends with
//! pools of their own on the same schema or file: two worker processes. For the in-memory store,
//! two clones. [`flow_store_checks!`](crate::flow_store_checks) writes one named test per check.
//!
//! | check | what it holds the store to |
//! |---|---|
//! | [`pause_is_audited`] | a pause keeps who, why and when, and writes its event; the first pause stands, of ten racing too; a blank reason, name or kind is refused |
//! | [`resume_and_events`] | a resume answers once, of ten racing too, and writes its event; events come newest first, of one kind or all, as many as asked |
//! | [`limits_round_trip`] | limits read back as set, a zero limit is refused and changes nothing, clearing them lists the kind no more |
//! | [`one_probe_per_probe_time`] | twenty takers over two handles: no probe before it is due, then one per probe time |
//! | [`close_breaker_leaves_a_persons_pause`] | a breaker's pause ends when its probe succeeds; a person's stays |
//! | [`tokens_keep_the_rate`] | a bucket raced for two seconds grants no more than its burst and its rate, and its wait is right |
//! | [`slots_are_fenced`] | sixteen takers for three slots: three; a stale holder renews and frees nothing; a lapsed slot is taken over |

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use redrive_core::{BREAKER, ErrorKind, Flow, FlowAction, FlowEvent, KindFlow, Limits, Paused, Rate};
use tokio::sync::Barrier;

/// Runs `n` tasks at once, alternating between the two handles; their answers, in task order.
async fn race<F, T, Fut>(a: &F, b: &F, n: usize, task: impl Fn(F, usize) -> Fut) -> Vec<T>
where
    F: Flow + Clone + 'static,
    T: Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    let start = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let handle = if i % 2 == 0 { a.clone() } else { b.clone() };
            let (start, run) = (Arc::clone(&start), task(handle, i));
            tokio::spawn(async move {
                start.wait().await;
                run.await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(n);
    for task in tasks {
        answers.push(task.await.expect("a racing task panicked"));
    }
    answers
}

async fn flow_of(store: &impl Flow, kind: &str) -> Option<KindFlow> {
    store.kinds().await.expect("kinds").into_iter().find(|k| k.kind == kind)
}

async fn paused(store: &impl Flow, kind: &str) -> Option<Paused> {
    flow_of(store, kind).await.and_then(|k| k.paused)
}

fn summary(events: &[FlowEvent]) -> Vec<(&str, FlowAction, &str, &str)> {
    events.iter().map(|e| (e.kind.as_str(), e.action, e.by.as_str(), e.detail.as_str())).collect()
}

/// Panics unless a pause keeps who, why and when (on the store's clock, near this one's), writes
/// one `paused` event, and stands against a second pause from another handle (false, nothing
/// changed); unless a blank reason, name or kind is refused as
/// [`InvalidInput`](ErrorKind::InvalidInput), pausing nothing; and unless of ten pauses racing
/// over two handles one answers true, and it is the one that stands, with one event.
pub async fn pause_is_audited<F: Flow + Clone + 'static>(a: F, b: F) {
    let kind = "charge_order";
    let before = Utc::now();
    assert!(a.pause(kind, "provider answers 503", "ana", None).await.unwrap(), "a first pause");
    let after = Utc::now();
    assert!(!b.pause(kind, "another reason", "bob", Some(Duration::from_secs(1))).await.unwrap(), "a second pause");
    let stood = paused(&b, kind).await.expect("the kind reads as paused from the other handle");
    assert_eq!((stood.reason.as_str(), stood.by.as_str(), stood.probe_at), ("provider answers 503", "ana", None));
    let skew = chrono::Duration::seconds(5);
    assert!(stood.at >= before - skew && stood.at <= after + skew, "paused at {} ({before} to {after})", stood.at);
    assert_eq!(flow_of(&b, kind).await.unwrap().limits, Limits::default());
    let events = b.events(Some(kind), 10).await.unwrap();
    assert_eq!(summary(&events), [(kind, FlowAction::Paused, "ana", "provider answers 503")], "one event, the first");

    for (kind, reason, by) in [("send_mail", " ", "ana"), ("send_mail", "maintenance", ""), (" ", "maintenance", "ana")]
    {
        let refused = a.pause(kind, reason, by, None).await.unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::InvalidInput, "pause({kind:?}, {reason:?}, {by:?})");
    }
    assert_eq!(a.resume(kind, "  ").await.unwrap_err().kind(), ErrorKind::InvalidInput, "a resume by no one");
    assert!(paused(&a, "send_mail").await.is_none(), "a refused pause pauses nothing");
    assert!(a.events(Some("send_mail"), 10).await.unwrap().is_empty(), "a refused pause writes no event");
    assert!(paused(&a, kind).await.is_some(), "a refused resume resumes nothing");

    // Of several workers tripping one breaker at once, one pauses (and alerts).
    let tripped = race(&a, &b, 10, |store, i| async move {
        store.pause("send_mail", &format!("worker {i} saw 5 failures"), BREAKER, Some(Duration::from_secs(60))).await
    })
    .await;
    let first: Vec<usize> = (0..10).filter(|i| matches!(tripped[*i], Ok(true))).collect();
    assert_eq!(first.len(), 1, "one of ten racing pauses stands: {tripped:?}");
    assert!(tripped.iter().all(Result::is_ok), "{tripped:?}");
    let stood = paused(&b, "send_mail").await.expect("paused");
    assert_eq!(stood.reason, format!("worker {} saw 5 failures", first[0]), "the pause that answered true stands");
    assert_eq!(b.events(Some("send_mail"), 10).await.unwrap().len(), 1, "one event");
}

/// Panics unless a resume answers true once (false again, false for a kind never paused), lists
/// the kind no more and writes a `resumed` event by who resumed; and unless events come newest
/// first, of one kind or of all, at most as many as asked; and unless of ten resumes racing over
/// two handles one answers true, with one event.
pub async fn resume_and_events<F: Flow + Clone + 'static>(a: F, b: F) {
    let (charge, mail) = ("charge_order", "send_mail");
    assert!(a.pause(charge, "provider down", "ana", None).await.unwrap());
    assert!(b.pause(mail, "smtp relay full", "bob", None).await.unwrap());
    assert!(b.resume(charge, "cy").await.unwrap(), "the resume of a paused kind");
    assert!(!a.resume(charge, "cy").await.unwrap(), "a second resume");
    assert!(!a.resume("never_paused", "cy").await.unwrap(), "the resume of a kind never paused");
    let kinds: Vec<String> = a.kinds().await.unwrap().into_iter().map(|k| k.kind).collect();
    assert_eq!(kinds, [mail], "only the kind still paused is listed");

    let all = a.events(None, 10).await.unwrap();
    let expected =
        [(charge, FlowAction::Resumed, "cy"), (mail, FlowAction::Paused, "bob"), (charge, FlowAction::Paused, "ana")];
    let seen: Vec<_> = all.iter().map(|e| (e.kind.as_str(), e.action, e.by.as_str())).collect();
    assert_eq!(seen, expected, "every event, newest first");
    assert!(all.windows(2).all(|w| w[0].at >= w[1].at), "newest first by time too");
    assert!(all[0].detail.contains("ana"), "a resume says whose pause ended: {:?}", all[0].detail);
    let of_charge = b.events(Some(charge), 10).await.unwrap();
    let actions: Vec<_> = of_charge.iter().map(|e| (e.kind.as_str(), e.action)).collect();
    assert_eq!(actions, [(charge, FlowAction::Resumed), (charge, FlowAction::Paused)], "one kind's events");
    assert_eq!(b.events(None, 2).await.unwrap(), all[..2], "at most as many as asked, the newest");
    assert!(b.events(Some("never_paused"), 10).await.unwrap().is_empty());

    assert!(a.pause(charge, "provider down again", "dee", None).await.unwrap(), "a resumed kind pauses again");
    assert_eq!(paused(&b, charge).await.map(|p| p.by), Some("dee".to_owned()));

    let resumed = race(&a, &b, 10, move |store, i| async move { store.resume(charge, &format!("op{i}")).await }).await;
    let answered: Vec<usize> = (0..10).filter(|i| matches!(resumed[*i], Ok(true))).collect();
    assert_eq!(answered.len(), 1, "one of ten racing resumes answers true: {resumed:?}");
    let events = a.events(Some(charge), 10).await.unwrap();
    let by = format!("op{}", answered[0]);
    assert_eq!(
        (events.len(), events[0].action, events[0].by.as_str()),
        (4, FlowAction::Resumed, by.as_str()),
        "one event"
    );
}

/// Panics unless limits read back from the other handle as set (periods to the microsecond),
/// with a `limits` event saying what they are; a limit of 0, a rate of 0 or a blank name is
/// refused as [`InvalidInput`](ErrorKind::InvalidInput) and changes nothing; limits and a pause
/// are kept apart; and cleared limits on a kind that is not paused list it no more.
pub async fn limits_round_trip<F: Flow + Clone + 'static>(a: F, b: F) {
    let kind = "charge_order";
    let limits = Limits {
        concurrency: Some(3),
        rate: Some(Rate::parse("5/250ms").unwrap()),
        key_concurrency: Some(1),
        key_rate: Some(Rate { count: 7, per: Duration::from_micros(1500) }),
    };
    a.set_limits(kind, &limits, "ana").await.unwrap();
    let read = flow_of(&b, kind).await.expect("a kind with limits is listed");
    assert_eq!((read.limits, read.paused), (limits, None), "read back from the other handle");
    let events = b.events(Some(kind), 10).await.unwrap();
    let detail = limits.to_string();
    assert_eq!(summary(&events), [(kind, FlowAction::Limits, "ana", detail.as_str())]);

    let refused = [
        Limits { concurrency: Some(0), ..limits },
        Limits { key_concurrency: Some(0), ..limits },
        Limits { rate: Some(Rate { count: 0, per: Duration::from_secs(1) }), ..limits },
        Limits { key_rate: Some(Rate { count: 5, per: Duration::ZERO }), ..limits },
    ];
    for bad in refused {
        let e = b.set_limits(kind, &bad, "bob").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad:?}");
    }
    assert_eq!(b.set_limits(kind, &limits, " ").await.unwrap_err().kind(), ErrorKind::InvalidInput, "no name");
    assert_eq!(b.set_limits("", &limits, "bob").await.unwrap_err().kind(), ErrorKind::InvalidInput, "no kind");
    assert_eq!(flow_of(&a, kind).await.unwrap().limits, limits, "a refused change changes nothing");
    assert_eq!(a.events(None, 10).await.unwrap().len(), 1, "a refused change writes no event");

    let rate_only = Limits { rate: Some(Rate::per_second(100)), ..Limits::default() };
    b.set_limits(kind, &rate_only, "bob").await.unwrap();
    assert_eq!(flow_of(&a, kind).await.unwrap().limits, rate_only, "set replaces every limit");

    assert!(a.pause(kind, "provider down", "ana", None).await.unwrap());
    b.set_limits(kind, &Limits::default(), "bob").await.unwrap();
    let both = flow_of(&a, kind).await.expect("a paused kind without limits is listed");
    assert_eq!((both.limits, both.paused.map(|p| p.by)), (Limits::default(), Some("ana".to_owned())));
    let events = a.events(Some(kind), 1).await.unwrap();
    assert_eq!(summary(&events), [(kind, FlowAction::Limits, "bob", "no limits")], "clearing is audited");
    b.set_limits(kind, &rate_only, "bob").await.unwrap();
    assert!(b.resume(kind, "ana").await.unwrap());
    assert_eq!(flow_of(&a, kind).await.map(|k| (k.limits, k.paused)), Some((rate_only, None)), "a resume keeps limits");
    a.set_limits(kind, &Limits::default(), "bob").await.unwrap();
    assert_eq!(flow_of(&b, kind).await, None, "a kind with neither a pause nor limits is not listed");
}

/// Panics unless a breaker's probe is nobody's before it is due, then one of twenty takers' over
/// two handles per probe time, the next one `cool_down` later; and unless a person's pause, or a
/// kind not paused, has none.
pub async fn one_probe_per_probe_time<F: Flow + Clone + 'static>(a: F, b: F) {
    let kind = "charge_order";
    let (after, cool_down) = (Duration::from_secs(1), Duration::from_secs(1));
    assert!(a.pause(kind, "5 failures in a row", BREAKER, Some(after)).await.unwrap());
    let takers = || race(&a, &b, 20, move |store, _| async move { store.take_probe(kind, cool_down).await });
    let early = takers().await;
    assert!(early.iter().all(|t| matches!(t, Ok(false))), "no probe before it is due: {early:?}");

    for round in 0..2 {
        tokio::time::sleep(if round == 0 { after } else { cool_down } + Duration::from_millis(100)).await;
        let taken = takers().await;
        let winners = taken.iter().filter(|t| matches!(t, Ok(true))).count();
        assert_eq!(winners, 1, "one probe per probe time (round {round}): {taken:?}");
        let again = takers().await;
        assert!(again.iter().all(|t| matches!(t, Ok(false))), "the next probe is cool_down on: {again:?}");
    }
    let probe_at = paused(&b, kind).await.and_then(|p| p.probe_at).expect("still a breaker's pause");
    assert!(probe_at > Utc::now() - chrono::Duration::seconds(5), "the probe time moved on: {probe_at}");

    assert!(a.pause("send_mail", "maintenance", "ana", None).await.unwrap());
    assert!(!b.take_probe("send_mail", cool_down).await.unwrap(), "a person's pause has no probe");
    assert!(!b.take_probe("never_paused", cool_down).await.unwrap(), "a kind not paused has no probe");
}

/// Panics unless `close_breaker` ends a breaker's pause, once, with a `resumed` event by
/// [`BREAKER`], and leaves a person's pause as it was; and unless a person's pause takes over a
/// breaker's (which no probe then ends), while a breaker's never takes over a pause.
pub async fn close_breaker_leaves_a_persons_pause<F: Flow + Clone + 'static>(a: F, b: F) {
    let (person, breaker) = ("send_mail", "charge_order");
    assert!(a.pause(person, "maintenance", "ana", None).await.unwrap());
    assert!(!b.close_breaker(person).await.unwrap(), "a person's pause is not the breaker's to end");
    assert_eq!(paused(&a, person).await.map(|p| p.by), Some("ana".to_owned()));
    assert_eq!(a.events(Some(person), 10).await.unwrap().len(), 1, "and nothing was written");

    assert!(a.pause(breaker, "5 failures in a row", BREAKER, Some(Duration::ZERO)).await.unwrap());
    assert!(b.take_probe(breaker, Duration::from_secs(60)).await.unwrap(), "a probe due at once");
    assert!(b.close_breaker(breaker).await.unwrap(), "the probe succeeded");
    assert!(!a.close_breaker(breaker).await.unwrap(), "once");
    assert!(paused(&a, breaker).await.is_none(), "the breaker's pause ended");
    let events = a.events(Some(breaker), 1).await.unwrap();
    assert_eq!((events[0].action, events[0].by.as_str()), (FlowAction::Resumed, BREAKER));
    assert!(!a.close_breaker("never_paused").await.unwrap());

    // A person's pause takes over a breaker's, and no probe or success of one ends it.
    assert!(a.pause(breaker, "5 failures in a row", BREAKER, Some(Duration::ZERO)).await.unwrap());
    assert!(!b.pause(breaker, "again", BREAKER, Some(Duration::ZERO)).await.unwrap(), "a breaker's stands");
    assert!(b.pause(breaker, "maintenance", "ana", None).await.unwrap(), "a person's takes over");
    assert!(!a.take_probe(breaker, Duration::from_secs(60)).await.unwrap(), "no probe of a person's pause");
    assert!(!a.close_breaker(breaker).await.unwrap(), "nor does a probe's success end it");
    assert_eq!(paused(&a, breaker).await.map(|p| (p.by, p.probe_at)), Some(("ana".to_owned(), None)));
    assert!(!a.pause(breaker, "5 failures in a row", BREAKER, Some(Duration::ZERO)).await.unwrap());
}

/// Panics unless a fresh bucket grants its burst (the count) and then nothing, with a wait until
/// one interval after the burst, after which one start is granted; and unless six takers over two
/// handles for about two seconds are granted no more than count + rate × elapsed between them,
/// and no fewer than half that.
pub async fn tokens_keep_the_rate<F: Flow + Clone + 'static>(a: F, b: F) {
    let rate = Rate { count: 4, per: Duration::from_secs(2) };
    let interval = rate.interval();
    let asked = tokio::time::Instant::now();
    let burst = a.take_tokens("rate:wait", rate, 10).await.unwrap();
    assert_eq!((burst.granted, burst.wait), (4, Duration::ZERO), "a fresh bucket grants its burst");
    let denied = b.take_tokens("rate:wait", rate, 1).await.unwrap();
    assert_eq!(denied.granted, 0, "the burst is spent");
    // The next start is one interval after the burst: no later, and no sooner than that less the
    // time the two takes took.
    let soonest = interval.saturating_sub(asked.elapsed());
    assert!(
        denied.wait >= soonest && denied.wait <= interval,
        "wait {:?}: not within {soonest:?} to {interval:?}",
        denied.wait
    );
    tokio::time::sleep(denied.wait).await;
    assert_eq!(a.take_tokens("rate:wait", rate, 3).await.unwrap().granted, 1, "one start after the wait");
    assert_eq!(b.take_tokens("rate:other", rate, 2).await.unwrap().granted, 2, "buckets are apart");

    let rate = Rate { count: 5, per: Duration::from_millis(500) };
    let started = tokio::time::Instant::now();
    let run_for = Duration::from_secs(2);
    let granted = race(&a, &b, 6, move |store, i| async move {
        let mut granted = 0;
        while started.elapsed() < run_for {
            let want = 1 + (i as u32 % 2);
            let tokens = store.take_tokens("rate:race", rate, want).await.expect("take tokens");
            assert!(tokens.granted <= want, "granted {} of {want}", tokens.granted);
            granted += tokens.granted;
            if tokens.granted == 0 {
                tokio::time::sleep(tokens.wait.min(Duration::from_millis(50))).await;
            }
        }
        granted
    })
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    let total: u32 = granted.iter().sum();
    let most = f64::from(rate.count) + f64::from(rate.count) / rate.per.as_secs_f64() * elapsed;
    assert!(f64::from(total) <= most, "{total} granted in {elapsed:.2} s: more than {most:.1}");
    assert!(f64::from(total) >= most / 2.0, "{total} granted in {elapsed:.2} s: fewer than half of {most:.1}");
}

/// Panics unless sixteen takers over two handles get three slots of a limit of three (0, 1 and 2);
/// a holder renews and lets go of its own slot only (a stale token renews nothing and frees
/// nothing); a raised limit gives the next slot; a lapsed slot is still its holder's until taken
/// over; and a short lease lapses and is taken over, after which its old holder's renew is false
/// and its release frees nothing.
pub async fn slots_are_fenced<F: Flow + Clone + 'static>(a: F, b: F) {
    let (key, lease) = ("kind:charge_order", Duration::from_secs(30));
    let taken = race(&a, &b, 16, move |store, _| async move { store.take_slot(key, 3, lease).await.unwrap() }).await;
    let mut held: Vec<_> = taken.into_iter().flatten().collect();
    held.sort_by_key(|s| s.slot);
    assert_eq!(held.iter().map(|s| s.slot).collect::<Vec<_>>(), [0, 1, 2], "three slots, once each");
    assert!(held.iter().all(|s| s.key == key));
    assert_eq!(a.take_slot(key, 3, lease).await.unwrap(), None, "all three are held");

    assert!(b.renew_slot(&held[0], lease).await.unwrap(), "a holder renews");
    let mut stale = held[1].clone();
    stale.token = held[0].token.clone();
    assert!(!a.renew_slot(&stale, lease).await.unwrap(), "another slot's token renews nothing");
    b.release_slot(&stale).await.unwrap();
    assert_eq!(a.take_slot(key, 3, lease).await.unwrap(), None, "and frees nothing");
    b.release_slot(&held[1]).await.unwrap();
    let again = a.take_slot(key, 3, lease).await.unwrap().expect("a released slot is free");
    assert_eq!(again.slot, 1);
    assert_ne!(again.token, held[1].token, "a new holder, a new token");
    assert!(!b.renew_slot(&held[1], lease).await.unwrap(), "the released holder's renew is false");
    assert_eq!(b.take_slot(key, 4, lease).await.unwrap().map(|s| s.slot), Some(3), "a raised limit");
    assert_eq!(b.take_slot("key:charge_order:acct_42", 1, lease).await.unwrap().map(|s| s.slot), Some(0));

    // Lapsed but not taken over: still the holder's (a late heartbeat).
    let short = Duration::from_millis(500);
    let late = a.take_slot("kind:late", 1, short).await.unwrap().expect("a free slot");
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    assert!(b.renew_slot(&late, lease).await.unwrap(), "a lapsed slot nobody took is renewed");
    assert_eq!(a.take_slot("kind:late", 1, lease).await.unwrap(), None, "and held again");

    let key = "kind:send_mail";
    let first = a.take_slot(key, 1, short).await.unwrap().expect("a free slot");
    assert_eq!(b.take_slot(key, 1, lease).await.unwrap(), None, "held until its lease lapses");
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    let second = b.take_slot(key, 1, lease).await.unwrap().expect("a lapsed slot is taken over");
    assert_eq!(second.slot, first.slot);
    assert_ne!(second.token, first.token);
    assert!(!a.renew_slot(&first, lease).await.unwrap(), "the stale holder's renew is false");
    a.release_slot(&first).await.unwrap();
    assert_eq!(a.take_slot(key, 1, lease).await.unwrap(), None, "the stale holder's release frees nothing");
    assert!(b.renew_slot(&second, lease).await.unwrap(), "the new holder renews");
    b.release_slot(&second).await.unwrap();
    assert!(a.take_slot(key, 1, lease).await.unwrap().is_some(), "its release frees the slot");
}

/// Writes one test per check above (multi-threaded, so that races are real), each on two handles
/// made fresh by `$handles`, an expression of a future of a tuple: the two handles, then anything
/// that must live as long as the test (a temporary directory). Your crate needs `tokio` with
/// `macros` and `rt-multi-thread`.
///
/// ```
/// use redrive_core::MemoryBackend;
///
/// async fn two_handles() -> (MemoryBackend, MemoryBackend) {
///     let store = MemoryBackend::new();
///     (store.clone(), store)
/// }
/// redrive_conformance::flow_store_checks!(two_handles());
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! flow_store_checks {
    ($handles:expr) => {
        $crate::flow_store_checks!(@each $handles; pause_is_audited resume_and_events limits_round_trip
            one_probe_per_probe_time close_breaker_leaves_a_persons_pause tokens_keep_the_rate slots_are_fenced);
    };
    (@each $handles:expr; $($name:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let handles = $handles.await;
                $crate::flow_store::$name(handles.0, handles.1).await;
            }
        )*
    };
}
