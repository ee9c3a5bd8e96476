//! The in-memory flow store: paused kinds, limits, rate buckets and slots of one process.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

use super::{MemoryBackend, token};
use crate::backend::{
    BREAKER, Flow, FlowAction, FlowEvent, KindFlow, Limits, Paused, Rate, Slot, Tokens, check_kind, check_pause, gcra,
};
use crate::error::Result;

/// The flow state: a kind's pause and limits, the audit trail, the buckets and the slots.
#[derive(Debug, Default)]
pub(super) struct FlowState {
    kinds: BTreeMap<String, (Option<Paused>, Limits)>,
    events: Vec<FlowEvent>,
    /// A bucket's theoretical arrival time.
    buckets: BTreeMap<String, Instant>,
    /// A limit's slots: the holder's token and until when.
    slots: BTreeMap<String, Vec<Option<(String, Instant)>>>,
}

/// Events kept: the newest this many.
const EVENTS_KEPT: usize = 10_000;

impl FlowState {
    fn log(&mut self, kind: &str, action: FlowAction, by: &str, detail: String) {
        if self.events.len() >= EVENTS_KEPT {
            self.events.remove(0);
        }
        self.events.push(FlowEvent { at: Utc::now(), kind: kind.to_owned(), action, by: by.to_owned(), detail });
    }

    /// Forgets a kind with neither a pause nor limits.
    fn tidy(&mut self, kind: &str) {
        if self.kinds.get(kind).is_some_and(|(paused, limits)| paused.is_none() && limits.is_none()) {
            self.kinds.remove(kind);
        }
    }
}

impl Flow for MemoryBackend {
    async fn kinds(&self) -> Result<Vec<KindFlow>> {
        let state = self.lock();
        let kinds = state.flow.kinds.iter();
        Ok(kinds
            .map(|(kind, (paused, limits))| KindFlow { kind: kind.clone(), paused: paused.clone(), limits: *limits })
            .collect())
    }

    async fn pause(&self, kind: &str, reason: &str, by: &str, probe_after: Option<Duration>) -> Result<bool> {
        check_pause(kind, reason, by)?;
        let mut state = self.lock();
        let flow = &mut state.flow;
        let entry = flow.kinds.entry(kind.to_owned()).or_default();
        // The first pause stands, but a person's takes over a breaker's: its probe would
        // otherwise resume what the person meant to keep paused.
        if entry.0.as_ref().is_some_and(|p| p.probe_at.is_none() || probe_after.is_some()) {
            return Ok(false);
        }
        let at = Utc::now();
        let probe_at = probe_after.map(|after| at + after);
        entry.0 = Some(Paused { reason: reason.to_owned(), by: by.to_owned(), at, probe_at });
        flow.log(kind, FlowAction::Paused, by, reason.to_owned());
        Ok(true)
    }

    async fn resume(&self, kind: &str, by: &str) -> Result<bool> {
        check_kind(kind)?;
        crate::backend::require_history("who resumed", by)?;
        let mut state = self.lock();
        let flow = &mut state.flow;
        let Some(paused) = flow.kinds.get_mut(kind).and_then(|(paused, _)| paused.take()) else {
            return Ok(false);
        };
        let since = paused.at.format("%Y-%m-%d %H:%M:%S UTC");
        flow.log(kind, FlowAction::Resumed, by, format!("paused by {} since {since}", paused.by));
        flow.tidy(kind);
        Ok(true)
    }

    async fn set_limits(&self, kind: &str, limits: &Limits, by: &str) -> Result<()> {
        check_kind(kind)?;
        crate::backend::require_history("who set the limits", by)?;
        limits.validate()?;
        let mut state = self.lock();
        let flow = &mut state.flow;
        flow.kinds.entry(kind.to_owned()).or_default().1 = *limits;
        flow.log(kind, FlowAction::Limits, by, limits.to_string());
        flow.tidy(kind);
        Ok(())
    }

    async fn events(&self, kind: Option<&str>, limit: usize) -> Result<Vec<FlowEvent>> {
        let state = self.lock();
        let events = state.flow.events.iter().rev().filter(|e| kind.is_none_or(|k| e.kind == k));
        Ok(events.take(limit).cloned().collect())
    }

    async fn take_probe(&self, kind: &str, cool_down: Duration) -> Result<bool> {
        let mut state = self.lock();
        let now = Utc::now();
        match state.flow.kinds.get_mut(kind).and_then(|(paused, _)| paused.as_mut()) {
            Some(Paused { probe_at: Some(at), .. }) if *at <= now => {
                *at = now + cool_down;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn close_breaker(&self, kind: &str) -> Result<bool> {
        let mut state = self.lock();
        let flow = &mut state.flow;
        let Some((paused, _)) = flow.kinds.get_mut(kind) else { return Ok(false) };
        if paused.as_ref().is_none_or(|p| p.probe_at.is_none()) {
            return Ok(false);
        }
        *paused = None;
        flow.log(kind, FlowAction::Resumed, BREAKER, "a probe succeeded".to_owned());
        flow.tidy(kind);
        Ok(true)
    }

    async fn take_tokens(&self, key: &str, rate: Rate, want: u32) -> Result<Tokens> {
        let now = Instant::now();
        let mut state = self.lock();
        let tat = state.flow.buckets.get(key).map(|tat| tat.saturating_duration_since(now).as_micros() as i64);
        let (tokens, tat) = gcra(tat, 0, rate, want);
        if tokens.granted > 0 {
            state.flow.buckets.insert(key.to_owned(), now + Duration::from_micros(tat.max(0) as u64));
        }
        Ok(tokens)
    }

    async fn take_slot(&self, key: &str, limit: u32, lease: Duration) -> Result<Option<Slot>> {
        let now = Instant::now();
        let mut state = self.lock();
        let slots = state.flow.slots.entry(key.to_owned()).or_default();
        slots.resize(slots.len().max(limit as usize), None);
        let free = slots[..limit as usize].iter().position(|s| s.as_ref().is_none_or(|(_, until)| *until <= now));
        Ok(free.map(|slot| {
            let token = token();
            slots[slot] = Some((token.clone(), now + lease));
            Slot { key: key.to_owned(), slot: slot as u32, token }
        }))
    }

    async fn renew_slot(&self, slot: &Slot, lease: Duration) -> Result<bool> {
        let mut state = self.lock();
        match state.flow.slots.get_mut(&slot.key).and_then(|s| s.get_mut(slot.slot as usize)) {
            Some(Some((token, until))) if *token == slot.token => {
                *until = Instant::now() + lease;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release_slot(&self, slot: &Slot) -> Result<()> {
        let mut state = self.lock();
        if let Some(held) = state.flow.slots.get_mut(&slot.key).and_then(|s| s.get_mut(slot.slot as usize))
            && held.as_ref().is_some_and(|(token, _)| *token == slot.token)
        {
            *held = None;
        }
        Ok(())
    }
}
