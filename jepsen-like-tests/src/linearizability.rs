//! Per-key linearizability of lock operations: a Wing–Gong–Lowe search with
//! memoization (Lowe's "just-in-time linearization" with a cache of (linearized
//! set, state) configurations), and a time budget after which the answer is
//! "unknown", never "linearizable".
//!
//! The model is a lease lock: one holder (session, token) or none; tokens of
//! grants strictly increase; a holder may lose the lock at any moment by its
//! session expiring (the server decides that on its own clock), after which that
//! session never succeeds again on this key. So a grant to B while A holds is
//! explained by A's expiry, but then a later successful release by A is not.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::history::{Function, Kind, Operation, NOT_ACQUIRED, NOT_HOLDER};

/// A lock operation as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockStep {
    /// Granted with `token`.
    AcquireOk {
        session: u64,
        token: u64,
    },
    /// Answered "not acquired": another session held the lock.
    AcquireBusy {
        session: u64,
    },
    /// Unknown: may have been granted (with a token we never learnt) or not.
    AcquireInfo {
        session: u64,
    },
    ReleaseOk {
        session: u64,
        token: u64,
    },
    /// Refused: `token` was not the current grant of `session`.
    ReleaseRefused {
        session: u64,
        token: u64,
    },
    ReleaseInfo {
        session: u64,
        token: u64,
    },
}

/// The lease lock's state. `token` 0 is a grant whose token is unknown.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LockState {
    holder: Option<(u64, u64)>,
    last_token: u64,
    /// Sessions that the search let expire; sorted.
    expired: Vec<u64>,
}

impl LockState {
    fn is_expired(&self, session: u64) -> bool {
        self.expired.binary_search(&session).is_ok()
    }

    fn expire(&mut self, session: u64) {
        if let Err(position) = self.expired.binary_search(&session) {
            self.expired.insert(position, session);
        }
    }

    /// Every state the operation can lead to (none: it cannot happen here).
    fn step(&self, operation: LockStep) -> Vec<LockState> {
        let mut next = Vec::new();
        match operation {
            LockStep::AcquireOk { session, token } => {
                if self.is_expired(session) {
                    return next;
                }
                match self.holder {
                    // Acquiring a held lock again returns the existing grant.
                    Some((holder, held)) if holder == session => {
                        if held == token || (held == 0 && token > self.last_token) {
                            let mut state = self.clone();
                            state.holder = Some((session, token));
                            state.last_token = state.last_token.max(token);
                            next.push(state);
                        }
                    }
                    holder => {
                        if token > self.last_token {
                            let mut state = self.clone();
                            if let Some((previous, _)) = holder {
                                state.expire(previous);
                            }
                            state.holder = Some((session, token));
                            state.last_token = token;
                            next.push(state);
                        }
                    }
                }
            }
            LockStep::AcquireBusy { session } => {
                if matches!(self.holder, Some((holder, _)) if holder != session) {
                    next.push(self.clone());
                }
            }
            LockStep::AcquireInfo { session } => {
                next.push(self.clone());
                if !self.is_expired(session) && !matches!(self.holder, Some((holder, _)) if holder == session) {
                    let mut state = self.clone();
                    if let Some((previous, _)) = self.holder {
                        state.expire(previous);
                    }
                    state.holder = Some((session, 0));
                    next.push(state);
                }
            }
            LockStep::ReleaseOk { session, token } => {
                if self.holder == Some((session, token)) {
                    let mut state = self.clone();
                    state.holder = None;
                    next.push(state);
                }
            }
            LockStep::ReleaseRefused { session, token } => {
                if self.holder != Some((session, token)) {
                    next.push(self.clone());
                } else {
                    // Refused because the session had just expired.
                    let mut state = self.clone();
                    state.holder = None;
                    state.expire(session);
                    next.push(state);
                }
            }
            LockStep::ReleaseInfo { session, token } => {
                next.push(self.clone());
                if self.holder == Some((session, token)) {
                    let mut state = self.clone();
                    state.holder = None;
                    next.push(state);
                }
            }
        }
        next
    }
}

/// The lock operations of a history the model can use: definite failures other
/// than "not acquired" / "not holder" changed nothing and are left out.
pub fn lock_steps(operations: &[&Operation]) -> Vec<(LockStep, u64, Option<u64>)> {
    let mut steps = Vec::new();
    for operation in operations {
        let session = operation.session;
        let step = match (operation.function, operation.outcome) {
            (Function::Acquire, Kind::Ok) => match operation.token {
                Some(token) => LockStep::AcquireOk { session, token },
                None => continue,
            },
            (Function::Acquire, Kind::Fail) if operation.error.as_deref() == Some(NOT_ACQUIRED) => {
                LockStep::AcquireBusy { session }
            }
            (Function::Acquire, Kind::Info) => LockStep::AcquireInfo { session },
            (Function::Release, outcome) => {
                let Some(token) = operation.token else {
                    continue;
                };
                match outcome {
                    Kind::Ok => LockStep::ReleaseOk { session, token },
                    Kind::Fail if operation.error.as_deref() == Some(NOT_HOLDER) => {
                        LockStep::ReleaseRefused { session, token }
                    }
                    Kind::Info => LockStep::ReleaseInfo { session, token },
                    _ => continue,
                }
            }
            _ => continue,
        };
        steps.push((step, operation.invoke_ns, operation.complete_ns));
    }
    steps
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Linearizable {
    Yes,
    /// No linearization exists (`longest_linearizable_prefix` shows where).
    No,
    /// The time budget ran out.
    Unknown,
}

#[derive(Clone, Copy)]
struct Entry {
    /// Index into the operations.
    operation: usize,
    is_call: bool,
    /// For a call, the index of its return entry.
    matching: usize,
}

/// Checks one key's history: (step, invoke, completion or None for info).
pub fn check(steps: &[(LockStep, u64, Option<u64>)], budget: Duration) -> Linearizable {
    let give_up = Instant::now() + budget;
    // Events: calls and returns ordered by time, a return before a call at the same
    // instant being impossible to overlap; info operations return after everything.
    let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(steps.len() * 2);
    for (index, (_, invoke, complete)) in steps.iter().enumerate() {
        events.push((*invoke, 1, index));
        events.push((complete.unwrap_or(u64::MAX), 0, index));
    }
    // Calls sort after returns at equal times: equal timestamps are treated as
    // ordered (return first), the conservative reading of real-time order.
    events.sort_by_key(|(time, is_call, index)| (*time, *is_call, *index));
    let count = events.len();
    // Node 0 is the head sentinel; entries are 1..=count.
    let mut entries = vec![Entry { operation: usize::MAX, is_call: false, matching: 0 }];
    let mut call_position = vec![0usize; steps.len()];
    let mut return_position = vec![0usize; steps.len()];
    for (position, (_, is_call, index)) in events.iter().enumerate() {
        let node = position + 1;
        entries.push(Entry { operation: *index, is_call: *is_call == 1, matching: 0 });
        if *is_call == 1 {
            call_position[*index] = node;
        } else {
            return_position[*index] = node;
        }
    }
    for index in 0..steps.len() {
        entries[call_position[index]].matching = return_position[index];
    }
    let mut next: Vec<usize> = (0..=count).map(|node| node + 1).collect();
    let mut previous: Vec<usize> = (0..=count).map(|node| node.wrapping_sub(1)).collect();
    next[count] = usize::MAX;
    let words = steps.len().div_ceil(64).max(1);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, LockState)> = HashSet::new();
    // (call node, state before, candidate index taken)
    let mut stack: Vec<(usize, LockState, usize)> = Vec::new();
    let mut state = LockState::default();
    let mut node = next[0];
    let mut first_candidate = 0usize;
    let mut iterations = 0u64;

    let lift = |next: &mut Vec<usize>, previous: &mut Vec<usize>, node: usize, matching: usize| {
        for removed in [node, matching] {
            let (before, after) = (previous[removed], next[removed]);
            next[before] = after;
            if after != usize::MAX {
                previous[after] = before;
            }
        }
    };
    let unlift = |next: &mut Vec<usize>, previous: &mut Vec<usize>, node: usize, matching: usize| {
        for restored in [matching, node] {
            let (before, after) = (previous[restored], next[restored]);
            next[before] = restored;
            if after != usize::MAX {
                previous[after] = restored;
            }
        }
    };

    loop {
        if next[0] == usize::MAX {
            return Linearizable::Yes;
        }
        iterations += 1;
        if iterations.is_multiple_of(1024) && Instant::now() >= give_up {
            return Linearizable::Unknown;
        }
        let entry = entries[node];
        if entry.is_call {
            let candidates = state.step(steps[entry.operation].0);
            let mut taken = None;
            for (choice, candidate) in candidates.into_iter().enumerate().skip(first_candidate) {
                let word = entry.operation / 64;
                let bit = 1u64 << (entry.operation % 64);
                linearized[word] |= bit;
                if cache.insert((linearized.clone(), candidate.clone())) {
                    taken = Some((choice, candidate));
                    break;
                }
                linearized[word] &= !bit;
            }
            first_candidate = 0;
            match taken {
                Some((choice, candidate)) => {
                    stack.push((node, std::mem::replace(&mut state, candidate), choice));
                    lift(&mut next, &mut previous, node, entry.matching);
                    node = next[0];
                }
                None => node = next[node],
            }
        } else {
            // A return whose call is not linearized: undo the last choice.
            let Some((call, before, choice)) = stack.pop() else {
                return Linearizable::No;
            };
            let operation = entries[call].operation;
            linearized[operation / 64] &= !(1u64 << (operation % 64));
            state = before;
            unlift(&mut next, &mut previous, call, entries[call].matching);
            node = call;
            first_candidate = choice + 1;
        }
    }
}

/// The length of the longest prefix (in invoke order) of `steps` that is
/// linearizable, found by bisection: where a failing history goes wrong.
pub fn longest_linearizable_prefix(steps: &[(LockStep, u64, Option<u64>)], budget: Duration) -> usize {
    let (mut good, mut bad) = (0usize, steps.len());
    while bad - good > 1 {
        let middle = (good + bad) / 2;
        match check(&steps[..middle], budget) {
            Linearizable::No => bad = middle,
            _ => good = middle,
        }
    }
    good
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_secs(10);

    fn ok(step: LockStep, invoke: u64, complete: u64) -> (LockStep, u64, Option<u64>) {
        (step, invoke, Some(complete))
    }

    #[test]
    fn sequential_grants_and_releases_are_linearizable() {
        let history = vec![
            ok(LockStep::AcquireOk { session: 1, token: 5 }, 0, 10),
            ok(LockStep::AcquireBusy { session: 2 }, 11, 12),
            ok(LockStep::ReleaseOk { session: 1, token: 5 }, 13, 14),
            ok(LockStep::AcquireOk { session: 2, token: 9 }, 15, 16),
        ];
        assert_eq!(check(&history, BUDGET), Linearizable::Yes);
    }

    #[test]
    fn expiry_explains_a_takeover_but_not_a_later_release_by_the_old_holder() {
        let takeover = vec![
            ok(LockStep::AcquireOk { session: 1, token: 5 }, 0, 10),
            ok(LockStep::AcquireOk { session: 2, token: 9 }, 20, 30),
            ok(LockStep::ReleaseRefused { session: 1, token: 5 }, 40, 50),
        ];
        assert_eq!(check(&takeover, BUDGET), Linearizable::Yes);
        let double_holder = vec![
            ok(LockStep::AcquireOk { session: 1, token: 5 }, 0, 10),
            ok(LockStep::AcquireOk { session: 2, token: 9 }, 20, 30),
            ok(LockStep::ReleaseOk { session: 1, token: 5 }, 40, 50),
        ];
        assert!(matches!(check(&double_holder, BUDGET), Linearizable::No));
    }

    #[test]
    fn a_busy_answer_for_a_free_lock_is_caught() {
        let history = vec![
            ok(LockStep::AcquireOk { session: 1, token: 5 }, 0, 10),
            ok(LockStep::ReleaseOk { session: 1, token: 5 }, 11, 12),
            ok(LockStep::AcquireBusy { session: 2 }, 13, 14),
        ];
        assert!(matches!(check(&history, BUDGET), Linearizable::No));
    }

    #[test]
    fn concurrent_operations_may_be_ordered_either_way_and_info_may_apply() {
        let history = vec![
            ok(LockStep::AcquireOk { session: 2, token: 9 }, 0, 30),
            ok(LockStep::AcquireOk { session: 1, token: 5 }, 0, 30),
            (LockStep::ReleaseInfo { session: 2, token: 9 }, 31, None),
            ok(LockStep::AcquireOk { session: 3, token: 12 }, 40, 50),
            ok(LockStep::AcquireBusy { session: 1 }, 60, 70),
        ];
        assert_eq!(check(&history, BUDGET), Linearizable::Yes);
    }

    #[test]
    fn a_decreasing_token_is_not_linearizable() {
        let history = vec![
            ok(LockStep::AcquireOk { session: 1, token: 9 }, 0, 10),
            ok(LockStep::ReleaseOk { session: 1, token: 9 }, 11, 12),
            ok(LockStep::AcquireOk { session: 2, token: 5 }, 13, 14),
        ];
        assert!(matches!(check(&history, BUDGET), Linearizable::No));
    }

    #[test]
    fn many_concurrent_operations_finish_quickly() {
        // 8 sessions taking turns, 4000 operations, with overlap.
        let mut history = Vec::new();
        let mut time = 0;
        let mut token = 0;
        for round in 0..1000u64 {
            let session = round % 8 + 1;
            token += 3;
            history.push(ok(LockStep::AcquireOk { session, token }, time, time + 10));
            history.push(ok(LockStep::AcquireBusy { session: session % 8 + 1 }, time + 5, time + 12));
            history.push(ok(LockStep::ReleaseOk { session, token }, time + 13, time + 20));
            history.push((LockStep::AcquireInfo { session: 9 }, time + 1, None));
            time += 21;
        }
        let started = Instant::now();
        let verdict = check(&history, Duration::from_secs(30));
        assert_eq!(verdict, Linearizable::Yes);
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
