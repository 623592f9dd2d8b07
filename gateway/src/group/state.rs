//! One classic group's state machine: Kafka's `ClassicGroup` and the classic
//! half of `GroupMetadataManager` (Kafka 4.x), without I/O. Time is passed
//! in (`now`), and every timer is a deadline the coordinator's driver task
//! sleeps until, so the machine is testable without a clock.
//!
//! States: Empty → PreparingRebalance (members (re)join) → CompletingRebalance
//! (the leader assigns) → Stable; Dead once an empty group is forgotten.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{
    HeartbeatRequest, JoinGroupRequest, JoinGroupResponse, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How long a new member's first JoinGroup may wait for its rebalance
/// (Kafka's `GroupCoordinatorConfig.CLASSIC_GROUP_NEW_MEMBER_JOIN_TIMEOUT_MS`).
/// A parked JoinGroup sends no heartbeats, and a client that timed out and
/// retried would otherwise leave a defunct member behind.
const NEW_MEMBER_JOIN_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// A classic group's state, named as Kafka names it on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl State {
    pub const ALL: [State; 5] = [
        State::Empty,
        State::PreparingRebalance,
        State::CompletingRebalance,
        State::Stable,
        State::Dead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::PreparingRebalance => "PreparingRebalance",
            State::CompletingRebalance => "CompletingRebalance",
            State::Stable => "Stable",
            State::Dead => "Dead",
        }
    }
}

/// The `groups.*` settings a group runs by.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub initial_rebalance_delay: Duration,
    pub min_session_timeout: Duration,
    pub max_session_timeout: Duration,
    /// How long an empty group is remembered (its offsets expire as long after).
    pub offsets_retention: Duration,
}

impl Timing {
    /// INVALID_SESSION_TIMEOUT unless `ms` is within the configured bounds.
    pub fn check_session_timeout(&self, ms: i32) -> Result<(), ResponseError> {
        let timeout = millis(ms);
        if ms < 0 || timeout < self.min_session_timeout || timeout > self.max_session_timeout {
            return Err(ResponseError::InvalidSessionTimeout);
        }
        Ok(())
    }
}

/// Who sent a JoinGroup, from its header and connection.
#[derive(Debug, Clone, Default)]
pub struct Joiner {
    pub client_id: StrBytes,
    pub client_host: StrBytes,
    /// The request's version: v4+ must join with a member id (KIP-394);
    /// v9+ supports `skip_assignment` (KIP-814).
    pub version: i16,
}

/// An answer now, or one that comes when the group moves on.
#[derive(Debug)]
pub enum Reply<T> {
    Now(T),
    Wait(oneshot::Receiver<T>),
}

struct Member {
    id: StrBytes,
    instance_id: Option<StrBytes>,
    client_id: StrBytes,
    client_host: StrBytes,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    /// (name, metadata) in the member's order of preference.
    protocols: Vec<(StrBytes, Bytes)>,
    assignment: Bytes,
    /// Joined but not yet through a completed join phase.
    is_new: bool,
    join_waiter: Option<oneshot::Sender<JoinGroupResponse>>,
    sync_waiter: Option<oneshot::Sender<SyncGroupResponse>>,
    heartbeat_deadline: Instant,
}

impl Member {
    fn supports(&self, protocol: &str) -> bool {
        self.protocols.iter().any(|(name, _)| **name == *protocol)
    }

    fn metadata(&self, protocol: &str) -> Bytes {
        let found = self.protocols.iter().find(|(name, _)| **name == *protocol);
        found.map(|(_, metadata)| metadata.clone()).unwrap_or_default()
    }

    /// The member's most preferred protocol among `candidates`.
    fn vote<'a>(&'a self, candidates: &[&StrBytes]) -> Option<&'a StrBytes> {
        let candidate = |name: &&StrBytes| candidates.contains(name);
        self.protocols.iter().map(|(name, _)| name).find(candidate)
    }

    fn matches(&self, protocols: &[JoinGroupRequestProtocol]) -> bool {
        self.protocols.len() == protocols.len()
            && self
                .protocols
                .iter()
                .zip(protocols)
                .all(|((name, metadata), p)| *name == p.name && *metadata == p.metadata)
    }

    /// Members waiting for a rebalance need no heartbeats (Kafka's
    /// `hasSatisfiedHeartbeat`); new ones do, with the join timeout.
    fn heartbeat_exempt(&self) -> bool {
        !self.is_new && (self.join_waiter.is_some() || self.sync_waiter.is_some())
    }

    fn answer_join(&mut self, response: JoinGroupResponse) {
        if let Some(waiter) = self.join_waiter.take() {
            let _ = waiter.send(response);
        }
    }

    fn answer_sync(&mut self, response: SyncGroupResponse) {
        if let Some(waiter) = self.sync_waiter.take() {
            let _ = waiter.send(response);
        }
    }

    fn wait_for_join(&mut self) -> oneshot::Receiver<JoinGroupResponse> {
        let (waiter, answer) = oneshot::channel();
        self.join_waiter = Some(waiter);
        answer
    }

    fn update(&mut self, req: &JoinGroupRequest) {
        self.protocols = protocols(req);
        self.session_timeout = millis(req.session_timeout_ms);
        // A rebalance timeout near zero would leave the group's timer due
        // over and over; no Kafka client sends one.
        self.rebalance_timeout = millis(req.rebalance_timeout_ms).max(MIN_REBALANCE_TIMEOUT);
    }
}

/// The shortest rebalance timeout honoured.
const MIN_REBALANCE_TIMEOUT: Duration = Duration::from_secs(1);

/// The initial rebalance of an empty group waits for more members: one
/// `delay` at a time, extended while members keep arriving, at most the
/// rebalance timeout in all (Kafka's `InitialDelayedJoin`).
#[derive(Debug, Clone, Copy)]
struct InitialDelay {
    delay: Duration,
    remaining: Duration,
    new_member_added: bool,
}

/// One classic consumer group.
pub struct Group {
    timing: Timing,
    state: State,
    previous_state: State,
    generation: i32,
    protocol_type: Option<StrBytes>,
    protocol_name: Option<StrBytes>,
    /// The members' metadata under the chosen protocol when the current
    /// generation began (or the group was restored): what OffsetDelete
    /// leaves alone, through a rebalance too, whose rejoins do not change
    /// it (Kafka's `subscribedTopics`, computed in `initNextGeneration`).
    generation_metadata: Option<Vec<Bytes>>,
    leader: Option<StrBytes>,
    members: BTreeMap<StrBytes, Member>,
    /// group.instance.id → member id (KIP-345).
    static_members: HashMap<StrBytes, StrBytes>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, until they join or
    /// their session timeout passes (KIP-394).
    pending_members: HashMap<StrBytes, Instant>,
    /// Members that have not sent SyncGroup since the join phase completed.
    pending_sync: BTreeSet<StrBytes>,
    join_deadline: Option<Instant>,
    initial_delay: Option<InitialDelay>,
    sync_deadline: Option<Instant>,
    /// An empty group is forgotten (turns Dead) at this time, once no
    /// member id handed out is pending: `groups.offsets_retention` after it
    /// last had members; at once for a group no member ever joined (a
    /// JoinGroup from an unknown member must not leave state behind it).
    forget_at: Instant,
    /// What a new coordinator would load changed (a completed rebalance,
    /// the group emptied, a static member replaced): persist a [`Snapshot`].
    changed: bool,
    /// The last snapshot taken (or restored): what a new coordinator would
    /// load, once written.
    stored: Option<Snapshot>,
    /// A static member was replaced since: `stored` names it by its new
    /// member id, and must be written again ([`Group::take_renamed`]).
    renamed: bool,
}

/// What a new coordinator needs to take a group over without a rebalance
/// (persisted in Redis at every completed rebalance, when the group empties
/// and when a static member is replaced): Kafka's `GroupMetadataValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub generation: i32,
    pub protocol_type: Option<StrBytes>,
    pub protocol_name: Option<StrBytes>,
    pub leader: Option<StrBytes>,
    pub members: Vec<SnapshotMember>,
}

/// One member of a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotMember {
    pub id: StrBytes,
    pub instance_id: Option<StrBytes>,
    pub client_id: StrBytes,
    pub client_host: StrBytes,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    /// (name, metadata) in the member's order of preference.
    pub protocols: Vec<(StrBytes, Bytes)>,
    pub assignment: Bytes,
}

impl Group {
    pub fn new(timing: Timing, now: Instant) -> Self {
        Self {
            timing,
            state: State::Empty,
            previous_state: State::Empty,
            generation: 0,
            protocol_type: None,
            protocol_name: None,
            generation_metadata: None,
            leader: None,
            members: BTreeMap::new(),
            static_members: HashMap::new(),
            pending_members: HashMap::new(),
            pending_sync: BTreeSet::new(),
            join_deadline: None,
            initial_delay: None,
            sync_deadline: None,
            forget_at: now,
            changed: false,
            stored: None,
            renamed: false,
        }
    }

    /// A group taken over from a [`Snapshot`]: Stable with its members and
    /// assignments (their sessions start now), or Empty without members.
    pub fn restore(timing: Timing, snapshot: Snapshot, now: Instant) -> Self {
        let mut group = Self::new(timing, now);
        group.stored = Some(snapshot.clone());
        group.generation = snapshot.generation;
        group.protocol_type = snapshot.protocol_type;
        group.protocol_name = snapshot.protocol_name;
        for m in snapshot.members {
            if let Some(instance_id) = &m.instance_id {
                group.static_members.insert(instance_id.clone(), m.id.clone());
            }
            let member = Member {
                id: m.id.clone(),
                instance_id: m.instance_id,
                client_id: m.client_id,
                client_host: m.client_host,
                session_timeout: m.session_timeout,
                rebalance_timeout: m.rebalance_timeout.max(MIN_REBALANCE_TIMEOUT),
                protocols: m.protocols,
                assignment: m.assignment,
                is_new: false,
                join_waiter: None,
                sync_waiter: None,
                heartbeat_deadline: now + m.session_timeout,
            };
            group.members.insert(m.id, member);
        }
        group.leader = snapshot
            .leader
            .filter(|leader| group.members.contains_key(leader))
            .or_else(|| group.members.keys().next().cloned());
        if group.members.is_empty() {
            group.protocol_name = None;
            group.leader = None;
            group.transition(State::Empty, now);
        } else {
            group.transition(State::Stable, now);
        }
        group.generation_metadata = group.current_metadata();
        group
    }

    /// The group as a new coordinator would load it, if that changed since
    /// the last call.
    pub fn take_snapshot(&mut self) -> Option<Snapshot> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        self.renamed = false;
        let members = (self.members.values())
            .map(|m| SnapshotMember {
                id: m.id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                session_timeout: m.session_timeout,
                rebalance_timeout: m.rebalance_timeout,
                protocols: m.protocols.clone(),
                assignment: m.assignment.clone(),
            })
            .collect();
        let snapshot = Snapshot {
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader: self.leader.clone(),
            members,
        };
        self.stored = Some(snapshot.clone());
        Some(snapshot)
    }

    /// The last snapshot taken, again, if a static member was replaced
    /// since, outside Stable (where [`Group::take_snapshot`] writes the
    /// group as it is): the same generation, the member under its new id.
    /// A rebalance is not written until it completes; should the group
    /// change coordinator before, the next one loads this snapshot and
    /// knows the new incarnation (its join answer's generation is then
    /// ILLEGAL_GENERATION, and it joins again), where the one before
    /// named the old member id, and fenced the new one: FENCED_INSTANCE_ID,
    /// fatal to the Java consumer. Kafka persists nothing either during a
    /// rebalance; here groups change coordinator whenever a gateway joins
    /// or leaves.
    pub fn take_renamed(&mut self) -> Option<Snapshot> {
        if !std::mem::take(&mut self.renamed) {
            return None;
        }
        self.stored.clone()
    }

    /// How many members the group has.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn protocol_type(&self) -> StrBytes {
        self.protocol_type.clone().unwrap_or_default()
    }

    // ---- JoinGroup ----

    /// JoinGroup: the session timeout is already checked.
    pub fn join(&mut self, req: JoinGroupRequest, joiner: &Joiner, now: Instant) -> Reply<JoinGroupResponse> {
        if req.member_id.is_empty() {
            self.join_new_member(req, joiner, now)
        } else {
            self.join_existing_member(req, joiner, now)
        }
    }

    fn join_new_member(
        &mut self,
        req: JoinGroupRequest,
        joiner: &Joiner,
        now: Instant,
    ) -> Reply<JoinGroupResponse> {
        if !self.supports_protocols(&req) {
            return Reply::Now(join_error(
                StrBytes::default(),
                ResponseError::InconsistentGroupProtocol,
            ));
        }
        let prefix = req.group_instance_id.as_ref().unwrap_or(&joiner.client_id);
        let new_id = StrBytes::from_string(format!("{prefix}-{}", uuid::Uuid::new_v4()));
        let existing = req
            .group_instance_id
            .as_ref()
            .and_then(|i| self.static_members.get(i))
            .cloned();
        match (&req.group_instance_id, existing) {
            (Some(_), Some(old_id)) => self.rejoin_static_member(old_id, new_id, req, joiner, now),
            (None, _) if joiner.version >= 4 => {
                self.pending_members
                    .insert(new_id.clone(), now + millis(req.session_timeout_ms));
                Reply::Now(join_error(new_id, ResponseError::MemberIdRequired))
            }
            _ => self.add_member(new_id, req, joiner, now),
        }
    }

    fn join_existing_member(
        &mut self,
        req: JoinGroupRequest,
        joiner: &Joiner,
        now: Instant,
    ) -> Reply<JoinGroupResponse> {
        let id = req.member_id.clone();
        if !self.supports_protocols(&req) {
            return Reply::Now(join_error(id, ResponseError::InconsistentGroupProtocol));
        }
        if req.group_instance_id.is_none() && self.pending_members.remove(&id).is_some() {
            return self.add_member(id, req, joiner, now);
        }
        if let Err(error) = self.validate_member(&id, req.group_instance_id.as_ref()) {
            return Reply::Now(join_error(id, error));
        }
        let member = &self.members[&id];
        let unchanged = member.matches(&req.protocols);
        match self.state {
            State::PreparingRebalance => self.update_member_and_rebalance(&id, &req, now),
            State::CompletingRebalance if unchanged => Reply::Now(self.join_answer(&id, self.leader.clone())),
            State::Stable if unchanged && !self.is_leader(&id) => {
                Reply::Now(self.join_answer(&id, self.leader.clone()))
            }
            State::CompletingRebalance | State::Stable => self.update_member_and_rebalance(&id, &req, now),
            State::Empty | State::Dead => Reply::Now(join_error(id, ResponseError::UnknownMemberId)),
        }
    }

    fn add_member(
        &mut self,
        id: StrBytes,
        req: JoinGroupRequest,
        joiner: &Joiner,
        now: Instant,
    ) -> Reply<JoinGroupResponse> {
        let mut member = Member {
            id: id.clone(),
            instance_id: req.group_instance_id.clone(),
            client_id: joiner.client_id.clone(),
            client_host: joiner.client_host.clone(),
            session_timeout: Duration::ZERO,
            rebalance_timeout: Duration::ZERO,
            protocols: Vec::new(),
            assignment: Bytes::new(),
            is_new: true,
            join_waiter: None,
            sync_waiter: None,
            heartbeat_deadline: now + NEW_MEMBER_JOIN_TIMEOUT,
        };
        member.update(&req);
        let answer = member.wait_for_join();
        if let (State::PreparingRebalance, Some(initial)) = (self.state, &mut self.initial_delay) {
            initial.new_member_added = true;
        }
        if self.members.is_empty() {
            self.protocol_type = Some(req.protocol_type.clone());
        }
        self.leader.get_or_insert_with(|| id.clone());
        if let Some(instance_id) = req.group_instance_id {
            self.static_members.insert(instance_id, id.clone());
        }
        self.members.insert(id, member);
        self.maybe_prepare_rebalance_or_complete_join(now);
        Reply::Wait(answer)
    }

    fn update_member_and_rebalance(
        &mut self,
        id: &StrBytes,
        req: &JoinGroupRequest,
        now: Instant,
    ) -> Reply<JoinGroupResponse> {
        let member = self.members.get_mut(id).expect("validated member");
        member.update(req);
        let answer = member.wait_for_join();
        self.maybe_prepare_rebalance_or_complete_join(now);
        Reply::Wait(answer)
    }

    /// KIP-345: a static member restarted with the same `group.instance.id`
    /// takes over the old member id. A Stable group whose selected protocol
    /// does not change keeps its generation and assignment: no rebalance.
    fn rejoin_static_member(
        &mut self,
        old_id: StrBytes,
        new_id: StrBytes,
        req: JoinGroupRequest,
        joiner: &Joiner,
        now: Instant,
    ) -> Reply<JoinGroupResponse> {
        let leader_before = self.leader.clone();
        self.replace_static_member(&old_id, &new_id, now);
        self.members
            .get_mut(&new_id)
            .expect("replaced member")
            .update(&req);
        if self.state == State::Stable && self.protocol_name.as_ref() == Some(&self.select_protocol()) {
            // Before v9 a returning leader is told the old leader id, so it
            // does not reassign; from v9 it learns it leads but must skip
            // the assignment (KIP-814).
            let skip_assignment = joiner.version >= 9 && self.is_leader(&new_id);
            let leader = if skip_assignment {
                self.leader.clone()
            } else {
                leader_before
            };
            let answer = self
                .join_answer(&new_id, leader)
                .with_skip_assignment(skip_assignment);
            return Reply::Now(answer);
        }
        let answer = self
            .members
            .get_mut(&new_id)
            .expect("replaced member")
            .wait_for_join();
        if self.state == State::CompletingRebalance {
            // The leader may have assigned to the old member id: assign again.
            self.prepare_rebalance(now);
        } else {
            self.maybe_prepare_rebalance_or_complete_join(now);
        }
        Reply::Wait(answer)
    }

    fn replace_static_member(&mut self, old_id: &StrBytes, new_id: &StrBytes, now: Instant) {
        self.changed = true;
        if let Some(stored) = &mut self.stored
            && let Some(member) = stored.members.iter_mut().find(|m| m.id == *old_id)
        {
            member.id = new_id.clone();
            if stored.leader.as_ref() == Some(old_id) {
                stored.leader = Some(new_id.clone());
            }
            self.renamed = true;
        }
        let mut member = self.members.remove(old_id).expect("static member");
        member.answer_join(join_error(old_id.clone(), ResponseError::FencedInstanceId));
        member.answer_sync(sync_error(ResponseError::FencedInstanceId));
        member.id = new_id.clone();
        // A new incarnation, but not a new member: it waits for the
        // rebalance without heartbeats, as Kafka's `replaceStaticMember`
        // makes it.
        member.is_new = false;
        member.heartbeat_deadline = now + member.session_timeout;
        if let Some(instance_id) = &member.instance_id {
            self.static_members.insert(instance_id.clone(), new_id.clone());
        }
        if self.is_leader(old_id) {
            self.leader = Some(new_id.clone());
        }
        if self.pending_sync.remove(old_id) {
            self.pending_sync.insert(new_id.clone());
        }
        self.members.insert(new_id.clone(), member);
    }

    /// Kafka's `supportsProtocols`: a first member must name a protocol type
    /// and protocols; later ones the group's type and a protocol all share.
    fn supports_protocols(&self, req: &JoinGroupRequest) -> bool {
        if self.state == State::Empty {
            return !req.protocol_type.is_empty() && !req.protocols.is_empty();
        }
        let shared = |p: &JoinGroupRequestProtocol| self.members.values().all(|m| m.supports(&p.name));
        self.protocol_type.as_ref() == Some(&req.protocol_type) && req.protocols.iter().any(shared)
    }

    /// Kafka's `selectProtocol`: of the protocols every member supports, the
    /// one most members prefer; ties go to the lexicographically first name.
    fn select_protocol(&self) -> StrBytes {
        let Some(first) = self.members.values().next() else {
            return StrBytes::default();
        };
        let candidates: Vec<&StrBytes> = (first.protocols.iter().map(|(name, _)| name))
            .filter(|name| self.members.values().all(|m| m.supports(name)))
            .collect();
        let mut votes: BTreeMap<&StrBytes, usize> = BTreeMap::new();
        for vote in self.members.values().filter_map(|m| m.vote(&candidates)) {
            *votes.entry(vote).or_default() += 1;
        }
        let most = votes.values().copied().max().unwrap_or_default();
        votes
            .into_iter()
            .find(|(_, n)| *n == most)
            .map(|(name, _)| name.clone())
            .unwrap_or_default()
    }

    // ---- Rebalance ----

    fn can_rebalance(&self) -> bool {
        matches!(
            self.state,
            State::Empty | State::CompletingRebalance | State::Stable
        )
    }

    fn maybe_prepare_rebalance_or_complete_join(&mut self, now: Instant) {
        if self.can_rebalance() {
            self.prepare_rebalance(now);
        } else {
            self.maybe_complete_join_phase(now);
        }
    }

    fn prepare_rebalance(&mut self, now: Instant) {
        if self.state == State::CompletingRebalance {
            self.reset_and_propagate_assignment_error(ResponseError::RebalanceInProgress, now);
        }
        self.pending_sync.clear();
        self.sync_deadline = None;
        metrics::counter!("ketch_group_rebalances_total").increment(1);
        let initial = self.state == State::Empty;
        self.transition(State::PreparingRebalance, now);
        if initial {
            let delay = self.timing.initial_rebalance_delay;
            let remaining = self.rebalance_timeout().saturating_sub(delay);
            self.initial_delay = Some(InitialDelay {
                delay,
                remaining,
                new_member_added: false,
            });
            self.join_deadline = Some(now + delay);
        } else if self.has_all_members_joined() {
            self.complete_join(now);
        } else {
            self.join_deadline = Some(now + self.rebalance_timeout());
        }
    }

    /// Completes the join phase early once everyone has joined, except in
    /// the initial rebalance, which always waits out its delay.
    fn maybe_complete_join_phase(&mut self, now: Instant) {
        if self.state == State::PreparingRebalance
            && self.initial_delay.is_none()
            && self.has_all_members_joined()
        {
            self.complete_join(now);
        }
    }

    fn has_all_members_joined(&self) -> bool {
        self.pending_members.is_empty() && self.members.values().all(|m| m.join_waiter.is_some())
    }

    /// The longest rebalance timeout of the members.
    fn rebalance_timeout(&self) -> Duration {
        self.members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default()
    }

    fn on_join_deadline(&mut self, now: Instant) {
        match self.initial_delay {
            Some(initial) if initial.new_member_added && !initial.remaining.is_zero() => {
                let delay = self.timing.initial_rebalance_delay.min(initial.remaining);
                self.initial_delay = Some(InitialDelay {
                    delay,
                    remaining: initial.remaining.saturating_sub(initial.delay),
                    new_member_added: false,
                });
                self.join_deadline = Some(now + delay);
            }
            _ => self.complete_join(now),
        }
    }

    /// The join phase ends: dynamic members that did not rejoin are removed,
    /// the generation advances and every joined member gets its answer.
    fn complete_join(&mut self, now: Instant) {
        self.join_deadline = None;
        self.initial_delay = None;
        let not_rejoined: Vec<StrBytes> = (self.members.values())
            .filter(|m| m.join_waiter.is_none() && m.instance_id.is_none())
            .map(|m| m.id.clone())
            .collect();
        for id in &not_rejoined {
            self.remove(id);
        }
        if !self.elect_joined_leader() && !self.members.is_empty() {
            // Only static members that did not rejoin are left: wait for them
            // to rejoin or for their sessions to expire.
            self.join_deadline = Some(now + self.rebalance_timeout());
            return;
        }
        self.init_next_generation(now);
        if self.state == State::Empty {
            return;
        }
        let leader = self.leader.clone();
        let members: Vec<StrBytes> = self.members.keys().cloned().collect();
        for id in members {
            let answer = self.join_answer(&id, leader.clone());
            let member = self.members.get_mut(&id).expect("member");
            member.answer_join(answer);
            member.heartbeat_deadline = now + member.session_timeout;
            member.is_new = false;
            self.pending_sync.insert(id);
        }
        self.sync_deadline = Some(now + self.rebalance_timeout());
    }

    /// Keeps the leader if it rejoined, else picks a member that did. When
    /// none did (static members that did not rejoin), the leader stays:
    /// one of them that rejoins under a new member id takes its place
    /// ([`Group::replace_static_member`]), as in Kafka's
    /// `maybeElectNewJoinedLeader`.
    fn elect_joined_leader(&mut self) -> bool {
        let joined = |id: &StrBytes| self.members.get(id).is_some_and(|m| m.join_waiter.is_some());
        if self.leader.as_ref().is_some_and(joined) {
            return true;
        }
        match self.members.values().find(|m| m.join_waiter.is_some()) {
            Some(member) => {
                self.leader = Some(member.id.clone());
                true
            }
            None => false,
        }
    }

    fn init_next_generation(&mut self, now: Instant) {
        self.generation += 1;
        self.pending_sync.clear();
        if self.members.is_empty() {
            self.protocol_name = None;
            self.transition(State::Empty, now);
            self.changed = true;
        } else {
            self.protocol_name = Some(self.select_protocol());
            self.transition(State::CompletingRebalance, now);
        }
        self.generation_metadata = self.current_metadata();
    }

    /// The members' metadata under the chosen protocol: none for a group
    /// without members (nothing subscribed); `None` when members have no
    /// generation that chose a protocol.
    fn current_metadata(&self) -> Option<Vec<Bytes>> {
        if self.members.is_empty() {
            return Some(Vec::new());
        }
        let protocol = self.protocol_name.as_ref()?;
        Some(self.members.values().map(|m| m.metadata(protocol)).collect())
    }

    fn transition(&mut self, state: State, now: Instant) {
        self.previous_state = self.state;
        self.state = state;
        if state == State::Empty {
            self.forget_at = now + self.timing.offsets_retention;
        }
    }

    /// The JoinGroup answer for the current generation, naming `leader`;
    /// the leader gets every member's metadata to assign from.
    fn join_answer(&self, id: &StrBytes, leader: Option<StrBytes>) -> JoinGroupResponse {
        let members = if leader.as_ref() == Some(id) {
            self.member_list()
        } else {
            Vec::new()
        };
        JoinGroupResponse::default()
            .with_member_id(id.clone())
            .with_generation_id(self.generation)
            .with_protocol_type(self.protocol_type.clone())
            .with_protocol_name(self.protocol_name.clone())
            .with_leader(leader.unwrap_or_default())
            .with_members(members)
    }

    fn member_list(&self) -> Vec<JoinGroupResponseMember> {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        (self.members.values())
            .map(|m| {
                JoinGroupResponseMember::default()
                    .with_member_id(m.id.clone())
                    .with_group_instance_id(m.instance_id.clone())
                    .with_metadata(m.metadata(&protocol))
            })
            .collect()
    }

    fn is_leader(&self, id: &StrBytes) -> bool {
        self.leader.as_ref() == Some(id)
    }

    // ---- SyncGroup ----

    pub fn sync(&mut self, req: SyncGroupRequest, now: Instant) -> Reply<SyncGroupResponse> {
        let id = req.member_id.clone();
        if let Err(error) = self.validate_sync(&req) {
            return Reply::Now(sync_error(error));
        }
        match self.state {
            State::Empty | State::Dead => Reply::Now(sync_error(ResponseError::UnknownMemberId)),
            State::PreparingRebalance => Reply::Now(sync_error(ResponseError::RebalanceInProgress)),
            State::CompletingRebalance => {
                let (waiter, answer) = oneshot::channel();
                self.members.get_mut(&id).expect("validated member").sync_waiter = Some(waiter);
                self.synced(&id);
                if self.is_leader(&id) {
                    self.assign(req, now);
                }
                Reply::Wait(answer)
            }
            State::Stable => {
                self.synced(&id);
                let member = self.members.get_mut(&id).expect("validated member");
                member.heartbeat_deadline = now + member.session_timeout;
                let assignment = member.assignment.clone();
                Reply::Now(self.sync_answer(assignment))
            }
        }
    }

    fn validate_sync(&self, req: &SyncGroupRequest) -> Result<(), ResponseError> {
        self.validate_member(&req.member_id, req.group_instance_id.as_ref())?;
        if req.generation_id != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        let inconsistent = |asked: &Option<StrBytes>, ours: &Option<StrBytes>| matches!((asked, ours), (Some(asked), Some(ours)) if asked != ours);
        if inconsistent(&req.protocol_type, &self.protocol_type)
            || inconsistent(&req.protocol_name, &self.protocol_name)
        {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        Ok(())
    }

    fn synced(&mut self, id: &StrBytes) {
        self.pending_sync.remove(id);
        if self.pending_sync.is_empty() {
            self.sync_deadline = None;
        }
    }

    /// The leader's assignment: stored, sent to every waiting member, and
    /// the group is Stable. Members it left out get an empty assignment.
    fn assign(&mut self, req: SyncGroupRequest, now: Instant) {
        let mut assignments: HashMap<StrBytes, Bytes> = req
            .assignments
            .into_iter()
            .map(|a| (a.member_id, a.assignment))
            .collect();
        for member in self.members.values_mut() {
            member.assignment = assignments.remove(&member.id).unwrap_or_default();
        }
        self.propagate_assignment(None, now);
        self.transition(State::Stable, now);
        self.changed = true;
    }

    fn reset_and_propagate_assignment_error(&mut self, error: ResponseError, now: Instant) {
        for member in self.members.values_mut() {
            member.assignment = Bytes::new();
        }
        self.propagate_assignment(Some(error), now);
    }

    fn propagate_assignment(&mut self, error: Option<ResponseError>, now: Instant) {
        let answer = match error {
            None => self.sync_answer(Bytes::new()),
            Some(error) => sync_error(error),
        };
        for member in self.members.values_mut() {
            if member.sync_waiter.is_some() {
                member.answer_sync(answer.clone().with_assignment(member.assignment.clone()));
                member.heartbeat_deadline = now + member.session_timeout;
            }
        }
    }

    fn sync_answer(&self, assignment: Bytes) -> SyncGroupResponse {
        SyncGroupResponse::default()
            .with_protocol_type(self.protocol_type.clone())
            .with_protocol_name(self.protocol_name.clone())
            .with_assignment(assignment)
    }

    // ---- Heartbeat and LeaveGroup ----

    /// Heartbeat: the error code, and the member's session timer restarts.
    pub fn heartbeat(&mut self, req: &HeartbeatRequest, now: Instant) -> Result<(), ResponseError> {
        self.validate_member(&req.member_id, req.group_instance_id.as_ref())?;
        if req.generation_id != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        if matches!(self.state, State::Empty | State::Dead) {
            return Err(ResponseError::UnknownMemberId);
        }
        let member = self.members.get_mut(&req.member_id).expect("validated member");
        member.heartbeat_deadline = now + member.session_timeout;
        match self.state {
            State::PreparingRebalance => Err(ResponseError::RebalanceInProgress),
            _ => Ok(()),
        }
    }

    /// An offset commit of `member_id` keeps its session as a heartbeat
    /// does, while the group is Stable or PreparingRebalance (Kafka's classic
    /// protocol: a consumer busy committing is alive).
    pub fn committed_by(&mut self, member_id: &StrBytes, now: Instant) {
        if matches!(self.state, State::Stable | State::PreparingRebalance)
            && let Some(member) = self.members.get_mut(member_id)
        {
            member.heartbeat_deadline = now + member.session_timeout;
        }
    }

    /// LeaveGroup for each member (KIP-345 batches them, naming members by
    /// member id or by `group.instance.id` alone); one rebalance for all.
    pub fn leave(&mut self, leaving: Vec<MemberIdentity>, now: Instant) -> Vec<MemberResponse> {
        let responses: Vec<MemberResponse> = leaving.into_iter().map(|m| self.leave_one(m)).collect();
        if responses.iter().any(|r| r.error_code == 0) {
            match self.state {
                State::Stable | State::CompletingRebalance => self.prepare_rebalance(now),
                State::PreparingRebalance => self.maybe_complete_join_phase(now),
                State::Empty | State::Dead => {}
            }
        }
        responses
    }

    fn leave_one(&mut self, leaving: MemberIdentity) -> MemberResponse {
        let response = MemberResponse::default()
            .with_member_id(leaving.member_id.clone())
            .with_group_instance_id(leaving.group_instance_id.clone());
        let leaver = if leaving.member_id.is_empty() {
            let by_instance = leaving
                .group_instance_id
                .as_ref()
                .and_then(|i| self.static_members.get(i));
            by_instance.cloned().ok_or(ResponseError::UnknownMemberId)
        } else if self.pending_members.remove(&leaving.member_id).is_some() {
            return response;
        } else {
            let instance_id = leaving.group_instance_id.as_ref();
            self.validate_member(&leaving.member_id, instance_id)
                .map(|()| leaving.member_id.clone())
        };
        match leaver {
            Ok(id) => {
                self.remove_member(&id);
                response
            }
            Err(error) => response.with_error_code(error.code()),
        }
    }

    /// Kafka's `validateMember`: a `group.instance.id` must map to this
    /// member id (else FENCED_INSTANCE_ID); a member id must be known.
    fn validate_member(&self, id: &StrBytes, instance_id: Option<&StrBytes>) -> Result<(), ResponseError> {
        match instance_id.map(|i| self.static_members.get(i)) {
            Some(Some(current)) if current != id => Err(ResponseError::FencedInstanceId),
            Some(None) => Err(ResponseError::UnknownMemberId),
            _ if !self.members.contains_key(id) => Err(ResponseError::UnknownMemberId),
            _ => Ok(()),
        }
    }

    /// Removes a member; a parked JoinGroup learns it with UNKNOWN_MEMBER_ID
    /// (so a live client rejoins).
    fn remove_member(&mut self, id: &StrBytes) {
        if let Some(member) = self.members.get_mut(id) {
            member.answer_join(join_error(StrBytes::default(), ResponseError::UnknownMemberId));
        }
        self.remove(id);
    }

    fn remove(&mut self, id: &StrBytes) {
        if let Some(member) = self.members.remove(id)
            && let Some(instance_id) = &member.instance_id
            && self.static_members.get(instance_id) == Some(id)
        {
            self.static_members.remove(instance_id);
        }
        if self.is_leader(id) {
            self.leader = self.members.keys().next().cloned();
        }
        self.pending_members.remove(id);
        self.pending_sync.remove(id);
    }

    // ---- Timers ----

    /// The earliest deadline the driver must wake up for.
    pub fn next_deadline(&self) -> Option<Instant> {
        let heartbeats = (self.members.values())
            .filter(|m| !m.heartbeat_exempt())
            .map(|m| m.heartbeat_deadline);
        let forget =
            (self.state == State::Empty && self.pending_members.is_empty()).then_some(self.forget_at);
        (heartbeats.chain(self.pending_members.values().copied()))
            .chain(self.join_deadline)
            .chain(self.sync_deadline)
            .chain(forget)
            .min()
    }

    /// Runs every timer due at `now`.
    pub fn expire(&mut self, now: Instant) {
        self.pending_members.retain(|_, deadline| *deadline > now);
        let expired: Vec<StrBytes> = (self.members.values())
            .filter(|m| !m.heartbeat_exempt() && m.heartbeat_deadline <= now)
            .map(|m| m.id.clone())
            .collect();
        for id in &expired {
            tracing::info!(member = %id, "group member session expired");
            self.remove_member(id);
        }
        if !expired.is_empty() {
            self.maybe_prepare_rebalance_or_complete_join(now);
        } else {
            self.maybe_complete_join_phase(now);
        }
        if self.join_deadline.is_some_and(|d| d <= now) {
            self.on_join_deadline(now);
        }
        if self.sync_deadline.is_some_and(|d| d <= now) {
            self.expire_pending_sync(now);
        }
        if self.state == State::Empty && self.pending_members.is_empty() && self.forget_at <= now {
            self.transition(State::Dead, now);
        }
    }

    /// Members that did not send SyncGroup within the rebalance timeout
    /// after the join phase are removed, and the group rebalances.
    fn expire_pending_sync(&mut self, now: Instant) {
        self.sync_deadline = None;
        let pending = std::mem::take(&mut self.pending_sync);
        for id in &pending {
            tracing::info!(member = %id, "group member sent no SyncGroup within its rebalance timeout");
            self.remove(id);
        }
        if !pending.is_empty() {
            self.prepare_rebalance(now);
        }
    }

    // ---- Admin ----

    /// DescribeGroups: members with metadata and assignment once Stable.
    pub fn describe(&self) -> DescribedGroup {
        let stable = self.state == State::Stable;
        let protocol = self.protocol_name.clone().filter(|_| stable).unwrap_or_default();
        let members = (self.members.values())
            .map(|m| {
                let described = DescribedGroupMember::default()
                    .with_member_id(m.id.clone())
                    .with_group_instance_id(m.instance_id.clone())
                    .with_client_id(m.client_id.clone())
                    .with_client_host(m.client_host.clone());
                if stable {
                    described
                        .with_member_metadata(m.metadata(&protocol))
                        .with_member_assignment(m.assignment.clone())
                } else {
                    described
                }
            })
            .collect();
        DescribedGroup::default()
            .with_group_state(StrBytes::from_static_str(self.state.name()))
            .with_protocol_type(self.protocol_type())
            .with_protocol_data(protocol)
            .with_members(members)
    }

    /// What OffsetDelete must leave alone, whatever the group's state: `None`
    /// without members; else the protocol type and the members' metadata
    /// under the protocol of the generation, as it was when the generation
    /// began (a rebalance under way, whose members may rejoin with other
    /// subscriptions, does not change it, as in Kafka); `None` metadata
    /// before the first generation chose a protocol (every topic then counts
    /// as subscribed).
    pub fn subscriptions(&self) -> Option<(StrBytes, Option<Vec<Bytes>>)> {
        if self.members.is_empty() {
            return None;
        }
        Some((self.protocol_type(), self.generation_metadata.clone()))
    }

    /// Kafka's `validateOffsetCommit`. A `transactional` commit (TxnOffsetCommit
    /// v3+) is not refused while the group completes a rebalance: the group's
    /// state is not enforced for those, and the Java producer takes
    /// REBALANCE_IN_PROGRESS there as fatal.
    pub fn validate_offset_commit(
        &self,
        member_id: &StrBytes,
        instance_id: Option<&StrBytes>,
        generation: i32,
        transactional: bool,
    ) -> Result<(), ResponseError> {
        if generation < 0 && self.state == State::Empty {
            // The admin client, or a consumer that assigns itself.
            return Ok(());
        }
        if generation >= 0 || !member_id.is_empty() || instance_id.is_some() {
            self.validate_member(member_id, instance_id)?;
            if generation != self.generation {
                return Err(ResponseError::IllegalGeneration);
            }
        } else if !transactional && self.state != State::Empty {
            return Err(ResponseError::UnknownMemberId);
        }
        if !transactional && self.state == State::CompletingRebalance {
            return Err(ResponseError::RebalanceInProgress);
        }
        Ok(())
    }
}

fn protocols(req: &JoinGroupRequest) -> Vec<(StrBytes, Bytes)> {
    req.protocols
        .iter()
        .map(|p| (p.name.clone(), p.metadata.clone()))
        .collect()
}

/// A duration in milliseconds from the wire; negative counts as zero.
pub fn millis(ms: i32) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

pub fn join_error(member_id: StrBytes, error: ResponseError) -> JoinGroupResponse {
    JoinGroupResponse::default()
        .with_member_id(member_id)
        .with_error_code(error.code())
        .with_protocol_name(None)
}

pub fn sync_error(error: ResponseError) -> SyncGroupResponse {
    SyncGroupResponse::default().with_error_code(error.code())
}
