//! A rolling upgrade, as the README's "Upgrading" gives it: every node starts on the
//! previous build (speaking the command level before this one), then one node at a
//! time is stopped as SIGTERM stops it and started on this build, and the next waits
//! until it caught up with the leader. Faults go on meanwhile. The fault suite's
//! upgrade check reads what happened; the history's checks say that nothing
//! acknowledged was lost.

use leasehold_jepsen::checker::Upgrade;

/// How long a node may take to stop once told to.
pub const STOP_MS: u64 = 5_000;
/// How long an upgraded node may take to apply what the leader had applied when it
/// was told to stop.
pub const CATCH_UP_MS: u64 = 8_000;

enum Step {
    /// The next node is told to stop at `at_ms` (simulated).
    Waiting { at_ms: u64 },
    /// `node` was told to stop; the leader had applied up to `goal`.
    Stopping { node: u64, goal: u64, deadline_ms: u64, at_ns: u64 },
    /// `node` runs this build; `exit`: how the previous one ended (None: it did not
    /// stop within `STOP_MS` and was killed).
    CatchingUp { node: u64, goal: u64, deadline_ms: u64, at_ns: u64, exit: Option<i32> },
}

/// A seed's rolling upgrade.
pub struct RollingUpgrade {
    /// The nodes still on the previous build, in the order they are upgraded.
    pending: Vec<u64>,
    step: Step,
    pub upgrades: Vec<Upgrade>,
    /// Nodes that run this build without an upgrade step: started again as new
    /// incarnations by the README's replacement.
    pub replaced: Vec<u64>,
}

/// What the run does next for the upgrade.
pub enum Action {
    /// Tell `node` to stop (SIGTERM).
    Stop(u64),
    /// `node` is down: start it on this build.
    Start(u64),
}

impl RollingUpgrade {
    /// Upgrades `nodes` one at a time from `first_ms` on.
    pub fn new(nodes: u64, first_ms: u64) -> RollingUpgrade {
        RollingUpgrade {
            pending: (1..=nodes).collect(),
            step: Step::Waiting { at_ms: first_ms },
            upgrades: Vec::new(),
            replaced: Vec::new(),
        }
    }

    /// The node told to stop and not yet stopped.
    pub fn stopping(&self) -> Option<u64> {
        match self.step {
            Step::Stopping { node, .. } => Some(node),
            _ => None,
        }
    }

    /// The node being upgraded (told to stop, or catching up): no fault picks it.
    pub fn busy(&self) -> Option<u64> {
        match self.step {
            Step::Stopping { node, .. } | Step::CatchingUp { node, .. } => Some(node),
            Step::Waiting { .. } => None,
        }
    }

    /// The next thing to do at `now`. `ready` says whether a node may be stopped (it
    /// serves, no replacement of it is under way, no fault is on it); `goal` is what
    /// the leader applied now; `applied`, what a node applied (None: down); `gap_ms`,
    /// how long after a node caught up the next is stopped.
    pub fn next(
        &mut self,
        now_ms: u64,
        now_ns: u64,
        gap_ms: impl FnOnce() -> u64,
        ready: impl Fn(u64) -> bool,
        goal: impl Fn() -> Option<u64>,
        applied: impl Fn(u64) -> Option<u64>,
    ) -> Option<Action> {
        match self.step {
            Step::Waiting { at_ms } if now_ms >= at_ms => {
                let node = self.pending.iter().copied().find(|node| ready(*node))?;
                let goal = goal()?;
                self.pending.retain(|pending| *pending != node);
                self.step = Step::Stopping { node, goal, deadline_ms: now_ms + STOP_MS, at_ns: now_ns };
                Some(Action::Stop(node))
            }
            Step::Stopping { node, goal, deadline_ms, at_ns } if now_ms >= deadline_ms => {
                let deadline_ms = now_ms + CATCH_UP_MS;
                self.step = Step::CatchingUp { node, goal, deadline_ms, at_ns, exit: None };
                Some(Action::Start(node))
            }
            Step::CatchingUp { node, goal, deadline_ms, at_ns, exit } => {
                let caught_up = applied(node).is_some_and(|index| index >= goal);
                if caught_up || now_ms >= deadline_ms {
                    self.upgrades.push(Upgrade { node, exit, caught_up, at_ns });
                    self.step = Step::Waiting { at_ms: now_ms + gap_ms() };
                }
                None
            }
            _ => None,
        }
    }

    /// The node told to stop stopped itself with `code`: start it on this build.
    pub fn exited(&mut self, code: i32, now_ms: u64) -> Option<Action> {
        let Step::Stopping { node, goal, at_ns, .. } = self.step else { return None };
        let deadline_ms = now_ms + CATCH_UP_MS;
        self.step = Step::CatchingUp { node, goal, deadline_ms, at_ns, exit: Some(code) };
        Some(Action::Start(node))
    }

    /// A node the README's replacement started on this build.
    pub fn replacing(&mut self, node: u64) {
        if self.pending.contains(&node) {
            self.pending.retain(|pending| *pending != node);
            self.replaced.push(node);
        }
    }

    /// Every node has been upgraded (or replaced) and caught up.
    pub fn ended(&self) -> bool {
        self.pending.is_empty() && matches!(self.step, Step::Waiting { .. })
    }

    /// The nodes the upgrade check holds to: all but those replaced before their turn.
    pub fn upgraded_nodes(&self, nodes: u64) -> Vec<u64> {
        (1..=nodes).filter(|node| !self.replaced.contains(node)).collect()
    }
}
