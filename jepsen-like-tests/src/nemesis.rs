//! The nemesis: which faults exist, how each is installed and healed, and how its
//! outcome is recorded (installed, skipped or indeterminate).
//!
//! Partitions are nftables rules on the output hook, inside the private network
//! namespace the harness runs in (every loopback packet passes that hook; nodes
//! bind their outgoing peer connections to their own address 127.0.0.1x, so a rule
//! between two node addresses cuts exactly that link). The table dies with the
//! namespace, so a crashed harness leaves nothing on the host.

use std::collections::BTreeSet;
use std::process::Command;

use rand::seq::SliceRandom;
use rand::Rng;
use serde::Serialize;

/// The fault families of `--nemesis`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NemesisKind {
    Kill,
    Pause,
    /// Only the worker pause (part of `Pause`).
    WorkerPause,
    /// Only a holder's stop followed by a kill of the leader (part of `Pause`): the
    /// bound on a dead holder across a leader change.
    HolderKill,
    Partition,
    Clock,
    Member,
    /// Operator faults on a node's disk: wiped, corrupted.
    Disk,
    /// A rolling upgrade from an older release's build (`--previous-server`); not in
    /// `all`, which needs no second build.
    Upgrade,
    /// A follower wiped in the first second of a fresh cluster, once, before the
    /// workers start: the moments before the leader has recorded every member.
    WipeEarly,
    /// Grey: a node's peer links delayed (a proxy in front of every peer port).
    SlowLink,
    /// Grey: a node starved of CPU (a cgroup's bandwidth limit).
    SlowCpu,
    /// Grey: a node whose fsyncs take tens of milliseconds (the disk knob).
    SlowDisk,
}

impl NemesisKind {
    pub const ALL: [NemesisKind; 7] = [
        NemesisKind::Kill,
        NemesisKind::Pause,
        NemesisKind::Partition,
        NemesisKind::Clock,
        NemesisKind::Member,
        NemesisKind::Disk,
        NemesisKind::WipeEarly,
    ];

    /// The grey faults, `grey`: not in `all`, whose clean faults they would dilute;
    /// the suite runs them on their own (see the README's grey figures).
    pub const GREY: [NemesisKind; 3] = [NemesisKind::SlowLink, NemesisKind::SlowCpu, NemesisKind::SlowDisk];

    /// Parses "kill,pause,partition,clock,member,disk,wipe-early" or "all" (or
    /// "none"), "upgrade", "slow-link,slow-cpu,slow-disk" or "grey", and "worker-pause" (only the GC pause of workers: the
    /// unfenced control) and "holder-kill" (only a holder's stop and a leader kill: the
    /// lease bound).
    pub fn parse_list(text: &str) -> Result<BTreeSet<NemesisKind>, String> {
        let mut kinds = BTreeSet::new();
        for word in text.split(',').map(str::trim).filter(|word| !word.is_empty()) {
            match word {
                "all" => kinds.extend(NemesisKind::ALL),
                "none" => {}
                "kill" => {
                    kinds.insert(NemesisKind::Kill);
                }
                "pause" => {
                    kinds.insert(NemesisKind::Pause);
                }
                "worker-pause" => {
                    kinds.insert(NemesisKind::WorkerPause);
                }
                "holder-kill" => {
                    kinds.insert(NemesisKind::HolderKill);
                }
                "partition" => {
                    kinds.insert(NemesisKind::Partition);
                }
                "clock" => {
                    kinds.insert(NemesisKind::Clock);
                }
                "member" => {
                    kinds.insert(NemesisKind::Member);
                }
                "disk" => {
                    kinds.insert(NemesisKind::Disk);
                }
                "upgrade" => {
                    kinds.insert(NemesisKind::Upgrade);
                }
                "wipe-early" => {
                    kinds.insert(NemesisKind::WipeEarly);
                }
                "grey" => kinds.extend(NemesisKind::GREY),
                "slow-link" => {
                    kinds.insert(NemesisKind::SlowLink);
                }
                "slow-cpu" => {
                    kinds.insert(NemesisKind::SlowCpu);
                }
                "slow-disk" => {
                    kinds.insert(NemesisKind::SlowDisk);
                }
                other => {
                    let known = "kill, pause, partition, clock, member, disk, wipe-early, upgrade, slow-link, \
                                 slow-cpu, slow-disk, grey, all or none";
                    return Err(format!("unknown nemesis {other:?}: use {known}"));
                }
            }
        }
        Ok(kinds)
    }

    /// The concrete faults of this family.
    pub fn faults(self) -> &'static [Fault] {
        match self {
            NemesisKind::Kill => &[Fault::KillLeader, Fault::KillRandom, Fault::KillAll],
            NemesisKind::Pause => {
                &[Fault::PauseNode, Fault::PauseLeader, Fault::PauseWorker, Fault::PauseWorkerKillLeader]
            }
            NemesisKind::WorkerPause => &[Fault::PauseWorker],
            NemesisKind::HolderKill => &[Fault::PauseWorkerKillLeader],
            NemesisKind::Partition => {
                &[Fault::PartitionHalves, Fault::PartitionLeader, Fault::PartitionBridge, Fault::PartitionOneWay]
            }
            NemesisKind::Clock => &[Fault::ClockFast, Fault::ClockSlow, Fault::ClockJump],
            NemesisKind::Member => &[Fault::MemberReplace],
            NemesisKind::Disk => &[Fault::WipeRejoin, Fault::CorruptReplace, Fault::DiskFull],
            NemesisKind::Upgrade => &[Fault::RollingUpgrade],
            NemesisKind::WipeEarly => &[Fault::WipeEarly],
            NemesisKind::SlowLink => &[Fault::SlowLink],
            NemesisKind::SlowCpu => &[Fault::SlowCpu],
            NemesisKind::SlowDisk => &[Fault::SlowDisk],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 of the leader, restart on its data directory.
    KillLeader,
    KillRandom,
    /// kill -9 of every node (workers paused), restart, check durability (e).
    KillAll,
    /// SIGSTOP of a node for 2–3 election timeouts.
    PauseNode,
    PauseLeader,
    /// SIGSTOP of a worker for longer than its TTL: the GC pause.
    PauseWorker,
    /// SIGSTOP of a worker that holds a lock for two TTLs, and kill -9 of the leader
    /// three quarters of a TTL in (restarted at once): the holder's lock must still
    /// be handed on within the published bound, not a TTL after the new leader.
    PauseWorkerKillLeader,
    PartitionHalves,
    PartitionLeader,
    /// One node sees both sides; the sides do not see each other.
    PartitionBridge,
    /// Packets from one node to another are dropped (for TCP this is not really
    /// one-way: SYNs or ACKs are lost).
    PartitionOneWay,
    /// The leader's monotonic clock runs fast (sessions expire early).
    ClockFast,
    ClockSlow,
    /// The leader's monotonic clock jumps forward by more than a TTL.
    ClockJump,
    /// Remove a node, empty its data directory, start it again under its id as a new
    /// incarnation, add it back (README, "Replacing a node").
    MemberReplace,
    /// A follower's data directory is wiped and the node restarted with the same
    /// flags: it must stop (exit code 4) without voting or acknowledging; then it is
    /// replaced as the README says.
    WipeRejoin,
    /// Bytes flipped in the middle of a stopped follower's write-ahead log: it must
    /// refuse to start (exit code 3); then it is replaced as the README says.
    CorruptReplace,
    /// A follower is replaced by one on a 512 KiB disk (a tmpfs in a mount namespace of
    /// its own): when the disk fills it must stop with exit code 5; then it is
    /// replaced again on its usual disk.
    DiskFull,
    /// A node still on the older release's build is stopped with SIGTERM (it must exit
    /// 0) and started again on its data directory with this workspace's build, as an
    /// operator upgrades; it must catch up with the leader. Followers go first, the
    /// leader last.
    RollingUpgrade,
    /// In a fresh cluster, within the first second after the first leader is seen, a
    /// follower is killed (-9), its data directory emptied and the node restarted at
    /// once with the same flags: it must stop (exit code 4) and the leader must live;
    /// then it is replaced as the README says. Runs once, before the workers start.
    WipeEarly,
    /// Every peer link of one node (the leader or a follower) delayed by tens of
    /// milliseconds with jitter, in order, nothing lost.
    SlowLink,
    /// One node (the leader or a follower) held to a few percent of one core.
    SlowCpu,
    /// One node's (the leader's or a follower's) fsyncs and synced writes take tens of
    /// milliseconds longer.
    SlowDisk,
}

impl Fault {
    /// Whether the fault is grey: the node keeps running, slower.
    pub fn grey(self) -> bool {
        matches!(self, Fault::SlowLink | Fault::SlowCpu | Fault::SlowDisk)
    }

    /// Whether the fault runs once at a time of its own (the harness's schedule), not
    /// drawn between the others.
    pub fn scheduled(self) -> bool {
        matches!(self, Fault::RollingUpgrade | Fault::WipeEarly)
    }

    /// Whether the fault itself stops its target nodes' processes (removal, a refused
    /// data directory, a full disk), so that their exits are not unexpected.
    pub fn stops_its_targets(self) -> bool {
        matches!(
            self,
            Fault::MemberReplace
                | Fault::WipeRejoin
                | Fault::CorruptReplace
                | Fault::DiskFull
                | Fault::RollingUpgrade
                | Fault::WipeEarly
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "kill-leader",
            Fault::KillRandom => "kill-random",
            Fault::KillAll => "kill-all",
            Fault::PauseNode => "pause-node",
            Fault::PauseLeader => "pause-leader",
            Fault::PauseWorker => "pause-worker",
            Fault::PauseWorkerKillLeader => "pause-worker-kill-leader",
            Fault::PartitionHalves => "partition-halves",
            Fault::PartitionLeader => "partition-leader",
            Fault::PartitionBridge => "partition-bridge",
            Fault::PartitionOneWay => "partition-one-way",
            Fault::ClockFast => "clock-fast",
            Fault::ClockSlow => "clock-slow",
            Fault::ClockJump => "clock-jump",
            Fault::MemberReplace => "member-replace",
            Fault::WipeRejoin => "wipe-rejoin",
            Fault::CorruptReplace => "corrupt-replace",
            Fault::DiskFull => "disk-full",
            Fault::RollingUpgrade => "rolling-upgrade",
            Fault::WipeEarly => "wipe-early",
            Fault::SlowLink => "slow-link",
            Fault::SlowCpu => "slow-cpu",
            Fault::SlowDisk => "slow-disk",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Installed,
    /// Not installed (no leader to target, the knob refused, …).
    Skipped,
    /// May or may not have taken effect (an admin request went unanswered).
    Indeterminate,
}

/// One fault, as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub fault: &'static str,
    pub outcome: Outcome,
    /// Node ids, or worker process numbers for pause-worker.
    pub targets: Vec<u64>,
    pub detail: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Directed links (from, to) between node ids whose packets are dropped.
pub type Grudge = Vec<(u64, u64)>;

fn both_ways(left: &[u64], right: &[u64]) -> Grudge {
    let mut grudge = Vec::new();
    for a in left {
        for b in right {
            grudge.push((*a, *b));
            grudge.push((*b, *a));
        }
    }
    grudge
}

/// The links a partition fault cuts, among `nodes`; `leader` for the isolated
/// leader (a random node when unknown).
pub fn grudge(fault: Fault, nodes: &[u64], leader: Option<u64>, random: &mut impl Rng) -> Grudge {
    let mut shuffled = nodes.to_vec();
    shuffled.shuffle(random);
    match fault {
        Fault::PartitionHalves => {
            let (left, right) = shuffled.split_at(shuffled.len() / 2);
            both_ways(left, right)
        }
        Fault::PartitionLeader => {
            let isolated = leader.unwrap_or(shuffled[0]);
            let rest: Vec<u64> = nodes.iter().copied().filter(|id| *id != isolated).collect();
            both_ways(&[isolated], &rest)
        }
        Fault::PartitionBridge => {
            // shuffled[0] is the bridge; the others split into two sides.
            let others = &shuffled[1..];
            let (left, right) = others.split_at(others.len() / 2);
            both_ways(left, right)
        }
        Fault::PartitionOneWay => vec![(shuffled[0], shuffled[1])],
        other => panic!("{other:?} is not a partition"),
    }
}

/// The nftables table of the fault suite, in the harness's own network namespace.
pub const NFT_TABLE: &str = "leasehold_jepsen";

fn nft(arguments: &[&str]) -> Result<(), String> {
    let output = Command::new("nft").args(arguments).output().map_err(|error| format!("cannot run nft: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("nft {}: {}", arguments.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
    }
}

/// Installs `grudge` (node id → address by `address_of`). `reject` answers TCP
/// with a reset (fails fast) instead of dropping silently (peers hang until their
/// deadlines); both paths are worth exercising.
pub fn install_partition(grudge: &Grudge, address_of: impl Fn(u64) -> String, reject: bool) -> Result<(), String> {
    heal_partition();
    nft(&["add", "table", "inet", NFT_TABLE])?;
    nft(&["add", "chain", "inet", NFT_TABLE, "out", "{ type filter hook output priority 0 ; }"])?;
    for (from, to) in grudge {
        let (source, destination) = (address_of(*from), address_of(*to));
        let mut rule =
            vec!["add", "rule", "inet", NFT_TABLE, "out", "ip", "saddr", &source, "ip", "daddr", &destination];
        if reject {
            rule.extend(["meta", "l4proto", "tcp", "reject", "with", "tcp", "reset"]);
        } else {
            rule.push("drop");
        }
        nft(&rule)?;
    }
    Ok(())
}

/// Removes every partition rule (the whole table). Harmless when there is none.
pub fn heal_partition() {
    let _ = nft(&["delete", "table", "inet", NFT_TABLE]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn nemesis_lists_parse() {
        assert_eq!(NemesisKind::parse_list("all").unwrap().len(), 7);
        let early = NemesisKind::parse_list("wipe-early,kill").unwrap();
        assert_eq!(early, BTreeSet::from([NemesisKind::Kill, NemesisKind::WipeEarly]));
        assert!(NemesisKind::parse_list("all").unwrap().contains(&NemesisKind::WipeEarly));
        assert_eq!(NemesisKind::WipeEarly.faults(), &[Fault::WipeEarly]);
        assert!(Fault::WipeEarly.scheduled() && Fault::WipeEarly.stops_its_targets());
        assert!(!Fault::KillRandom.scheduled() && !Fault::KillRandom.stops_its_targets());
        assert_eq!(NemesisKind::parse_list("disk").unwrap(), BTreeSet::from([NemesisKind::Disk]));
        assert_eq!(
            NemesisKind::parse_list("kill,pause").unwrap(),
            BTreeSet::from([NemesisKind::Kill, NemesisKind::Pause])
        );
        assert!(NemesisKind::parse_list("flood").is_err());
        let upgrade = NemesisKind::parse_list("upgrade,kill").unwrap();
        assert_eq!(upgrade, BTreeSet::from([NemesisKind::Kill, NemesisKind::Upgrade]));
        assert!(!NemesisKind::parse_list("all").unwrap().contains(&NemesisKind::Upgrade), "all needs no second build");
        let grey = NemesisKind::parse_list("grey").unwrap();
        assert_eq!(grey, BTreeSet::from(NemesisKind::GREY));
        assert!(grey.iter().all(|kind| kind.faults().iter().all(|fault| fault.grey() && !fault.scheduled())));
        assert_eq!(NemesisKind::parse_list("slow-disk").unwrap(), BTreeSet::from([NemesisKind::SlowDisk]));
    }

    #[test]
    fn partitions_cut_the_links_they_promise() {
        let mut random = rand::rngs::StdRng::seed_from_u64(7);
        let nodes = [1, 2, 3, 4, 5];
        let halves = grudge(Fault::PartitionHalves, &nodes, None, &mut random);
        assert_eq!(halves.len(), 2 * 2 * 3);
        let isolated = grudge(Fault::PartitionLeader, &nodes, Some(3), &mut random);
        assert!(isolated.iter().all(|(a, b)| *a == 3 || *b == 3));
        assert_eq!(isolated.len(), 8);
        let bridge = grudge(Fault::PartitionBridge, &nodes, None, &mut random);
        let touched: BTreeSet<u64> = bridge.iter().flat_map(|(a, b)| [*a, *b]).collect();
        assert_eq!(touched.len(), 4, "the bridge node keeps every link");
        let one_way = grudge(Fault::PartitionOneWay, &nodes, None, &mut random);
        assert_eq!(one_way.len(), 1);
    }
}
