//! The classic consumer-group coordinator (Kafka's `GroupCoordinator` for
//! classic groups): membership, rebalances and assignments of the groups this
//! gateway coordinates, in memory (DESIGN §6). Committed offsets live in Redis
//! and are not kept here. What a new coordinator needs to take a group over
//! (generation, protocol, members and their assignments: a [`Snapshot`]) is
//! written to Redis at every completed rebalance and loaded by the next
//! coordinator when the group's first request reaches it.
//!
//! Spec: the Kafka protocol guide's group membership APIs; KIP-62 (rebalance
//! timeout), KIP-134 (initial rebalance delay), KIP-345 (static membership,
//! batched LeaveGroup), KIP-394 (member id required), KIP-814 (skip
//! assignment). [`state`] is the state machine; this module locks it, parks
//! requests that wait for a rebalance, and runs one timer task per group.

mod snapshot;
pub mod state;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::storage::Storage;
use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{
    HeartbeatRequest, JoinGroupRequest, JoinGroupResponse, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use ketch_config::GroupsSettings;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

use state::{Group, Reply, Timing, join_error, sync_error};
pub use state::{Joiner, Snapshot, SnapshotMember, State};

/// The protocol type of groups whose members' metadata is a consumer
/// subscription.
pub const CONSUMER_PROTOCOL: &str = "consumer";

/// Which of a group's committed offsets expire one by one
/// ([`Coordinator::expiring`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expiring {
    /// None: the group has members that are not a stable consumer group
    /// (another protocol, a rebalance).
    Nothing,
    /// Only those whose commit set their own expiry time (OffsetCommit
    /// v2–v4's `retention_time_ms`): the group emptied, and the others
    /// expire together, a Redis TTL from when it emptied.
    OwnTimeOnly,
    /// Every one: no member ever joined the group (consumers that assign
    /// their own partitions and commit, Kafka's standalone group).
    All,
    /// Those of topics none of its members subscribes to; the members'
    /// subscription metadata (a stable consumer group).
    Unsubscribed(Vec<Bytes>),
}

/// The groups this gateway coordinates. Cheap to clone.
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

struct Inner {
    timing: Timing,
    groups: Mutex<HashMap<StrBytes, Slot>>,
    writes: Option<Writes>,
    /// Whether this gateway coordinates a group now: checked, under the
    /// groups lock, before a group is created or loaded, so a group handed
    /// over to another gateway never comes back into this one's memory.
    owns: Owns,
}

/// Whether this gateway coordinates a group (membership's answer).
pub trait Ownership: Send + Sync {
    /// Whether this gateway coordinates `group` now.
    fn owns(&self, group: &str) -> bool;
    /// Changes when this gateway's claim on its groups lapsed: a change
    /// queued before is not written after.
    fn epoch(&self) -> u64 {
        0
    }
}

pub type Owns = Arc<dyn Ownership>;

/// Owns every group (a coordinator alone: tests).
struct Alone;

impl Ownership for Alone {
    fn owns(&self, _: &str) -> bool {
        true
    }
}

struct Slot {
    group: Group,
    /// Wakes the group's timer task: its deadlines may have changed.
    timers: Arc<Notify>,
    /// The write that stores the group's latest snapshot ([`Writes::send`]).
    snapshot_write: u64,
    /// [`Ownership::epoch`] when the group came into memory: a copy from an
    /// earlier epoch is stale (this gateway's claim lapsed since, and the
    /// group may have moved on elsewhere) and is dropped when next touched.
    epoch: u64,
}

/// A group's listing in ListGroups.
#[derive(Debug, Clone)]
pub struct Listing {
    pub group_id: StrBytes,
    pub state: State,
    pub protocol_type: StrBytes,
}

/// Why DeleteGroups cannot delete a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotDeleted {
    /// The group has members (NON_EMPTY_GROUP).
    NonEmpty,
    /// The group is not in memory: it may still have offsets in Redis.
    Unknown,
    /// Redis could not say whether the group has a snapshot, or another
    /// gateway coordinates the group now: the error code to answer.
    Refused(i16),
}

impl Coordinator {
    /// A coordinator that keeps no offsets alive (tests).
    pub fn new(settings: &GroupsSettings) -> Self {
        Self::build(settings, None, Arc::new(Alone))
    }

    /// A coordinator that makes a group's committed offsets expire
    /// `groups.offsets_retention` after it becomes Empty, and keeps them
    /// while it has members.
    /// `owns` says whether this gateway coordinates a group now: a group
    /// it does not is neither created nor loaded here, and what Redis keeps
    /// of it is not written from here.
    pub fn with_storage(settings: &GroupsSettings, storage: Arc<dyn Storage>, owns: Owns) -> Self {
        let writes = Writes {
            owns: owns.clone(),
            storage,
            retention: settings.offsets_retention.get(),
            queue: Mutex::new(None),
            sent: AtomicU64::new(0),
            done: Arc::new(watch::channel(0).0),
            failed: Arc::default(),
            superseded: Arc::default(),
        };
        Self::build(settings, Some(writes), owns)
    }

    fn build(settings: &GroupsSettings, writes: Option<Writes>, owns: Owns) -> Self {
        let timing = Timing {
            initial_rebalance_delay: settings.initial_rebalance_delay.get(),
            min_session_timeout: settings.min_session_timeout.get(),
            max_session_timeout: settings.max_session_timeout.get(),
            offsets_retention: settings.offsets_retention.get(),
        };
        let inner = Inner {
            timing,
            groups: Mutex::new(HashMap::new()),
            writes,
            owns,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// JoinGroup; waits (without holding anything) for the join phase when
    /// the member must. A parked JoinGroup whose group this gateway gives
    /// up (shutting down, or another gateway coordinates it now) is
    /// NOT_COORDINATOR, as Kafka answers the parked requests of a group it
    /// unloads: the client finds the next coordinator.
    pub async fn join(
        &self,
        req: JoinGroupRequest,
        joiner: Joiner,
        shutdown: &watch::Receiver<bool>,
    ) -> JoinGroupResponse {
        if let Err(error) = self.load(&req.group_id).await {
            return join_error(req.member_id, error);
        }
        let member_id = req.member_id.clone();
        let group_id = req.group_id.0.clone();
        // A static member that joins without a member id and is answered at
        // once took over its old member id in a Stable group (KIP-345): as
        // Kafka answers it once the group's metadata is written, it waits
        // for the snapshot. Unwritten (the group was handed over meanwhile,
        // or Redis refused it), the next coordinator would restore the old
        // member id and fence this one (FENCED_INSTANCE_ID is fatal to the
        // Java consumer): it is told to find the coordinator and join again.
        let replaces = member_id.is_empty() && req.group_instance_id.is_some();
        let reply = self.join_now(req, &joiner);
        if replaces
            && matches!(&reply, Reply::Now(answer) if answer.error_code == 0)
            && self.stored(&group_id).await != Stored::Written
        {
            return join_error(member_id, ResponseError::CoordinatorNotAvailable);
        }
        let unanswered = join_error(member_id, ResponseError::NotCoordinator);
        settle(reply, shutdown, unanswered).await
    }

    fn join_now(&self, req: JoinGroupRequest, joiner: &Joiner) -> Reply<JoinGroupResponse> {
        // What the group keeps must not pin the request's frame buffer.
        let req = detach_join(req);
        let joiner = &Joiner {
            client_id: detach(&joiner.client_id),
            client_host: detach(&joiner.client_host),
            version: joiner.version,
        };
        let group_id = req.group_id.0.clone();
        if group_id.is_empty() {
            return Reply::Now(join_error(req.member_id, ResponseError::InvalidGroupId));
        }
        if let Err(error) = self.inner.timing.check_session_timeout(req.session_timeout_ms) {
            return Reply::Now(join_error(req.member_id, error));
        }
        // Only a member without an id may create the group.
        let create = req.member_id.is_empty();
        let member_id = req.member_id.clone();
        if create && !self.inner.owns.owns(&group_id) {
            return Reply::Now(join_error(member_id, ResponseError::NotCoordinator));
        }
        self.inner
            .update(&group_id, create, |group, now| group.join(req, joiner, now))
            .unwrap_or_else(|| Reply::Now(join_error(member_id, ResponseError::UnknownMemberId)))
    }

    /// SyncGroup; followers wait for the leader's assignment. A gateway
    /// shutting down answers REBALANCE_IN_PROGRESS, so the member rejoins.
    pub async fn sync(
        &self,
        mut req: SyncGroupRequest,
        shutdown: &watch::Receiver<bool>,
    ) -> SyncGroupResponse {
        if let Err(error) = self.load(&req.group_id).await {
            // The group's rebalance is lost here: the member joins again.
            // Kafka answers so, not COORDINATOR_LOAD_IN_PROGRESS, which
            // the Java consumer's SyncGroup does not expect (it fails).
            return sync_error(match error {
                ResponseError::CoordinatorLoadInProgress => ResponseError::RebalanceInProgress,
                error => error,
            });
        }
        for assignment in &mut req.assignments {
            assignment.member_id = detach(&assignment.member_id);
            assignment.assignment = Bytes::copy_from_slice(&assignment.assignment);
        }
        let group_id = req.group_id.0.clone();
        let reply = match invalid_group(&req.group_id) {
            Some(error) => Reply::Now(sync_error(error)),
            None => (self.inner)
                .update(&group_id, false, |group, now| group.sync(req, now))
                .unwrap_or_else(|| Reply::Now(sync_error(ResponseError::UnknownMemberId))),
        };
        // Parked and given up (as a JoinGroup): NOT_COORDINATOR.
        let response = settle(reply, shutdown, sync_error(ResponseError::NotCoordinator)).await;
        if response.error_code == 0 {
            match self.stored(&group_id).await {
                Stored::Written => {}
                // As Kafka answers SyncGroup once the group's metadata is
                // written: a coordinator that dies now leaves the
                // generation its members were just told. Slow or refused,
                // it is answered anyway (docs/architecture.md §5).
                Stored::Unwritten => {
                    tracing::warn!(group = %group_id, "answering SyncGroup without the group's snapshot written");
                }
                // Handed to another gateway before it was written (or
                // another coordinator wrote a newer generation): the next
                // coordinator will not know this generation, and a member
                // that started on it would be told ILLEGAL_GENERATION and
                // lose its partitions. As Kafka answers the SyncGroups of a
                // group it unloads: the member finds the coordinator and
                // joins again.
                Stored::Lost => return sync_error(ResponseError::NotCoordinator),
            }
        }
        response
    }

    /// After an OffsetCommit: a group without members keeps its offsets
    /// `groups.offsets_retention` from now, as Kafka keeps a standalone
    /// group's. The expiry is queued with the group's other changes, so a
    /// group that gains members meanwhile keeps them (its Active change
    /// comes after it). It is written within [`STORE_WAIT`] and, with
    /// acks=all waiting for replicas, confirmed by them as the offsets
    /// were (from this task: the queue does not wait for replicas), or the
    /// commit fails retriably (as Kafka appends the offsets' expiry with
    /// them). `None` without a queue (a coordinator without storage: the
    /// caller sets it).
    pub async fn retain_committed(&self, group_id: &str) -> Option<ketch_storage::Result<()>> {
        let writes = self.inner.writes.as_ref()?;
        let (answer, answered) = oneshot::channel();
        {
            let groups = self.inner.lock();
            let has_members = groups
                .get(group_id.as_bytes())
                .is_some_and(|slot| slot.group.state() != State::Empty);
            if has_members {
                return Some(Ok(()));
            }
            let group = StrBytes::from_string(group_id.to_owned());
            writes.send(&group, Change::Committed(answer), self.inner.owns.epoch());
        }
        let unavailable = |why: &str| Some(Err(ketch_storage::StorageError::Unavailable(why.to_owned())));
        match tokio::time::timeout(STORE_WAIT, answered).await {
            Err(_) => {
                tracing::warn!(group = %group_id, "the retention of the group's offsets is not written yet");
                unavailable("the retention of the group's offsets is not written yet")
            }
            // Dropped unwritten: the group was handed over meanwhile.
            Ok(Err(_)) => {
                unavailable("the group moved to another coordinator before its retention was written")
            }
            Ok(Ok(Err(e))) => {
                tracing::warn!(group = %group_id, error = %e, "cannot write the retention of the group's offsets");
                Some(Err(e))
            }
            // Confirmed no earlier than the expiry written: one a
            // failover brought back from before is not taken for it.
            Ok(Ok(Ok(at))) => Some(writes.storage.confirm_group_retention(group_id, at).await),
        }
    }

    /// Waits (at most [`STORE_WAIT`]) until the group's latest snapshot is
    /// written to Redis, and says how it went.
    async fn stored(&self, group_id: &StrBytes) -> Stored {
        let Some(writes) = &self.inner.writes else {
            return Stored::Written;
        };
        let Some(wanted) = self.inner.lock().get(group_id).map(|slot| slot.snapshot_write) else {
            // Handed over (forgotten here) meanwhile: its snapshot is not
            // written from here.
            return Stored::Lost;
        };
        let mut done = writes.done.subscribe();
        let written = tokio::time::timeout(STORE_WAIT, done.wait_for(|done| *done >= wanted)).await;
        if written.is_err() {
            tracing::warn!(group = %group_id, "the group's snapshot is not written yet");
            return Stored::Unwritten;
        }
        let failed = writes.failed.lock().unwrap_or_else(PoisonError::into_inner);
        match failed.get(group_id) {
            Some(&(number, lost)) if number >= wanted => {
                if lost {
                    Stored::Lost
                } else {
                    Stored::Unwritten
                }
            }
            _ => Stored::Written,
        }
    }

    /// Heartbeat: the error code (0 for none).
    pub async fn heartbeat(&self, req: &HeartbeatRequest) -> i16 {
        if let Some(error) = invalid_group(&req.group_id) {
            return error.code();
        }
        if self.load(&req.group_id).await.is_err() {
            // The Java client retries a heartbeat answered this way after
            // looking the coordinator up again.
            return ResponseError::CoordinatorNotAvailable.code();
        }
        let outcome = self
            .inner
            .update(&req.group_id.0, false, |group, now| group.heartbeat(req, now));
        match outcome.unwrap_or(Err(ResponseError::UnknownMemberId)) {
            Ok(()) => 0,
            Err(error) => error.code(),
        }
    }

    /// LeaveGroup: one response per leaving member, or a group-level error.
    pub async fn leave(
        &self,
        group_id: &StrBytes,
        leaving: Vec<MemberIdentity>,
    ) -> Result<Vec<MemberResponse>, i16> {
        if group_id.is_empty() {
            return Err(ResponseError::InvalidGroupId.code());
        }
        self.load(group_id).await.map_err(|e| e.code())?;
        let unknown = |m: &MemberIdentity| {
            MemberResponse::default()
                .with_member_id(m.member_id.clone())
                .with_group_instance_id(m.group_instance_id.clone())
                .with_error_code(ResponseError::UnknownMemberId.code())
        };
        let unknown_members: Vec<MemberResponse> = leaving.iter().map(unknown).collect();
        if let Some(left) = self
            .inner
            .update(group_id, false, |group, now| group.leave(leaving, now))
        {
            return Ok(left);
        }
        // A group known only by its committed offsets is an Empty group
        // (Kafka makes one of a simple commit): each member is unknown in
        // it. A group not known at all is the whole request's
        // UNKNOWN_MEMBER_ID, as Kafka's `classicGroupLeave` answers it.
        let has_offsets = match &self.inner.writes {
            Some(writes) => writes
                .storage
                .group_has_offsets(group_id)
                .await
                .map_err(|_| ResponseError::CoordinatorNotAvailable.code())?,
            None => false,
        };
        if has_offsets {
            Ok(unknown_members)
        } else {
            Err(ResponseError::UnknownMemberId.code())
        }
    }

    /// The state and member count of every group in memory.
    pub fn census(&self) -> Vec<(State, usize)> {
        let groups = self.inner.lock();
        groups
            .values()
            .map(|slot| (slot.group.state(), slot.group.member_count()))
            .collect()
    }

    /// Every group in memory.
    pub fn list(&self) -> Vec<Listing> {
        let groups = self.inner.lock();
        let listing = |(id, slot): (&StrBytes, &Slot)| Listing {
            group_id: id.clone(),
            state: slot.group.state(),
            protocol_type: slot.group.protocol_type(),
        };
        groups.iter().map(listing).collect()
    }

    /// DescribeGroups for a group in memory (without its id and authorized
    /// operations, which the caller sets).
    /// An error when the group's snapshot cannot be read, or the group
    /// was handed over while it was (not a view without its members).
    pub async fn describe(&self, group_id: &str) -> Result<Option<DescribedGroup>, ResponseError> {
        self.load(group_id).await?;
        let groups = self.inner.lock();
        Ok(groups.get(group_id.as_bytes()).map(|slot| slot.group.describe()))
    }

    /// Whether this coordinator holds the group in memory (it has members,
    /// or had them lately).
    pub fn in_memory(&self, group_id: &str) -> bool {
        self.inner.lock().contains_key(group_id.as_bytes())
    }

    /// Writes again the retention of a group held here: its offsets kept
    /// while it has members, expiring once it is Empty (unless they expire
    /// already). These writes are not waited for by replicas: one lost to
    /// a Redis failover (a `PERSIST`, say, leaving a Stable group's offsets
    /// to expire) is put right at the next look ([`crate::offset_expiry`]).
    pub fn keep_retention(&self, group_id: &str) {
        let Some(writes) = &self.inner.writes else {
            return;
        };
        let groups = self.inner.lock();
        let Some(slot) = groups.get(group_id.as_bytes()) else {
            return;
        };
        let change = match slot.group.state() {
            State::Dead => return,
            State::Empty => Change::Idle,
            _ => Change::Active,
        };
        writes.send(&StrBytes::from_string(group_id.to_owned()), change, slot.epoch);
    }

    /// The group's members' protocol type and metadata, for OffsetDelete
    /// (see [`Group::subscriptions`]); `None` for a group without members;
    /// an error as [`Coordinator::describe`]'s.
    #[allow(clippy::type_complexity)]
    pub async fn subscriptions(
        &self,
        group_id: &str,
    ) -> Result<Option<(StrBytes, Option<Vec<Bytes>>)>, ResponseError> {
        self.load(group_id).await?;
        let groups = self.inner.lock();
        Ok(groups
            .get(group_id.as_bytes())
            .and_then(|slot| slot.group.subscriptions()))
    }

    /// Forgets an Empty group (DeleteGroups); its offsets are the caller's.
    pub async fn delete(&self, group_id: &str) -> Result<(), NotDeleted> {
        self.load(group_id)
            .await
            .map_err(|e| NotDeleted::Refused(e.code()))?;
        {
            let mut groups = self.inner.lock();
            let slot = groups.get(group_id.as_bytes()).ok_or(NotDeleted::Unknown)?;
            if slot.group.state() != State::Empty {
                return Err(NotDeleted::NonEmpty);
            }
            if let Some(slot) = groups.remove(group_id.as_bytes()) {
                slot.timers.notify_one();
            }
        }
        // Its changes queued before (the Empty snapshot, its offsets'
        // retention) are written before the caller deletes it from Redis,
        // or they would bring it back (Kafka's coordinator orders a
        // group's tombstones after its records). Out of memory now, it
        // queues no more.
        let Some(writes) = &self.inner.writes else {
            return Ok(());
        };
        let wanted = writes.sent.load(AtomicOrdering::Relaxed);
        let mut done = writes.done.subscribe();
        if tokio::time::timeout(STORE_WAIT, done.wait_for(|done| *done >= wanted))
            .await
            .is_err()
        {
            // Loaded again from Redis by the client's retry.
            return Err(NotDeleted::Refused(ResponseError::CoordinatorNotAvailable.code()));
        }
        Ok(())
    }

    /// Whether an OffsetCommit or TxnOffsetCommit from this member and
    /// generation may commit: Kafka's `validateOffsetCommit`. A group not in
    /// memory accepts only commits without a generation; one with a
    /// generation gets GROUP_ID_NOT_FOUND from OffsetCommit v9 on (as in
    /// Kafka), ILLEGAL_GENERATION before (`version`: the request's, or
    /// `None` for a transactional commit, which keeps the older answer).
    pub async fn validate_offset_commit(
        &self,
        group_id: &str,
        member_id: &StrBytes,
        instance_id: Option<&StrBytes>,
        generation: i32,
        version: Option<i16>,
    ) -> Result<(), i16> {
        self.load(group_id).await.map_err(|e| e.code())?;
        let transactional = version.is_none();
        let key = StrBytes::from_string(group_id.to_owned());
        let checked = self.inner.update(&key, false, |group, now| {
            let outcome = group.validate_offset_commit(member_id, instance_id, generation, transactional);
            if outcome.is_ok() && !transactional {
                group.committed_by(member_id, now);
            }
            outcome
        });
        let outcome = match checked {
            Some(outcome) => outcome,
            None if generation < 0 => Ok(()),
            None if version.is_some_and(|v| v >= 9) => Err(ResponseError::GroupIdNotFound),
            // Before v9 (and for transactional commits): ILLEGAL_GENERATION;
            // OffsetCommit answers UNKNOWN_MEMBER_ID instead when the group
            // has offsets (Kafka keeps it, Empty).
            None => Err(ResponseError::IllegalGeneration),
        };
        outcome.map_err(|e| e.code())
    }

    /// Which of a group's committed offsets may expire one by one, each
    /// `groups.offsets_retention` after its commit, as Kafka's
    /// `removeExpiredOffsets` decides by the group's state. A group this
    /// gateway did not hold and that has no members is not kept in memory
    /// for the look (as [`Coordinator::adopt`] does not keep one).
    pub async fn expiring(&self, group_id: &str) -> Result<Expiring, ResponseError> {
        let held = self.in_memory(group_id);
        self.load(group_id).await?;
        if let Some(expiring) = self.expiring_in_memory(group_id, held) {
            return Ok(expiring);
        }
        // No snapshot: no member ever joined it. One this version cannot
        // read (a newer release's) may be of a group with members: nothing
        // of it expires here.
        let Some(writes) = &self.inner.writes else {
            return Ok(Expiring::All);
        };
        match writes.storage.load_group(group_id).await {
            Ok(None) => Ok(Expiring::All),
            Ok(Some(_)) => Ok(Expiring::Nothing),
            Err(_) => Err(ResponseError::CoordinatorLoadInProgress),
        }
    }

    /// [`Coordinator::expiring`] for a group in memory (`None` if it is
    /// not); one `held` before only for the look is forgotten again if
    /// it has no members.
    fn expiring_in_memory(&self, group_id: &str, held: bool) -> Option<Expiring> {
        let mut groups = self.inner.lock();
        let group = &groups.get(group_id.as_bytes())?.group;
        let protocol_type = group.protocol_type();
        let expiring = match group.state() {
            State::Empty if protocol_type.is_empty() => Expiring::All,
            State::Empty => Expiring::OwnTimeOnly,
            State::Stable if protocol_type.as_str() == CONSUMER_PROTOCOL => match group.subscriptions() {
                Some((_, Some(metadata))) => Expiring::Unsubscribed(metadata),
                _ => Expiring::Nothing,
            },
            _ => Expiring::Nothing,
        };
        if !held
            && group.state() == State::Empty
            && let Some(slot) = groups.remove(group_id.as_bytes())
        {
            slot.timers.notify_one();
        }
        Some(expiring)
    }

    /// Brings a group this gateway coordinates in from its snapshot, as a
    /// request for it would, if it has members to expire: whether it is in
    /// memory now. An Empty one is left out (its offsets' retention runs in
    /// Redis already; a request loads it when one comes), so a gateway
    /// does not hold every idle group it coordinates.
    pub async fn adopt(&self, group_id: &str) -> Result<bool, ResponseError> {
        self.load(group_id).await?;
        let mut groups = self.inner.lock();
        let empty = groups
            .get(group_id.as_bytes())
            .is_some_and(|slot| slot.group.state() == State::Empty);
        if empty && let Some(slot) = groups.remove(group_id.as_bytes()) {
            slot.timers.notify_one();
            return Ok(false);
        }
        Ok(groups.contains_key(group_id.as_bytes()))
    }

    /// Brings a group this gateway does not have in memory in from its
    /// snapshot in Redis, if it has one (it was coordinated elsewhere
    /// before). COORDINATOR_LOAD_IN_PROGRESS when Redis cannot say.
    async fn load(&self, group_id: &str) -> Result<(), ResponseError> {
        let Some(writes) = &self.inner.writes else {
            return Ok(());
        };
        if group_id.is_empty() {
            return Ok(());
        }
        {
            let mut groups = self.inner.lock();
            self.inner.drop_stale(&mut groups, group_id.as_bytes());
            if groups.contains_key(group_id.as_bytes()) {
                return Ok(());
            }
        }
        let stored = writes.storage.load_group(group_id).await.map_err(|e| {
            tracing::warn!(group = group_id, error = %e, "cannot load the group's snapshot");
            ResponseError::CoordinatorLoadInProgress
        })?;
        let Some(bytes) = stored else {
            return Ok(());
        };
        let Some(snapshot) = snapshot::decode(bytes) else {
            tracing::warn!(
                group = group_id,
                "ignoring a group snapshot this version cannot read"
            );
            return Ok(());
        };
        let now = Instant::now();
        let mut groups = self.inner.lock();
        let group_id = StrBytes::from_string(group_id.to_owned());
        if !self.inner.owns.owns(&group_id) {
            // Handed over to another gateway while this one read Redis.
            return Err(ResponseError::NotCoordinator);
        }
        if let std::collections::hash_map::Entry::Vacant(entry) = groups.entry(group_id) {
            tracing::info!(
                group = %entry.key(),
                generation = snapshot.generation,
                members = snapshot.members.len(),
                "took the group over from its snapshot"
            );
            let group = Group::restore(self.inner.timing, snapshot, now);
            // Its offsets may have been left to expire by a coordinator that
            // saw it empty, and it has members again; or kept by one that
            // saw it gain members and went before it emptied (its snapshot
            // is of before), and it is Empty.
            let change = match group.state() {
                State::Empty => Change::Idle,
                _ => Change::Active,
            };
            writes.send(entry.key(), change, self.inner.owns.epoch());
            let slot = self.inner.start_slot(entry.key(), group);
            slot.timers.notify_one();
            entry.insert(slot);
        }
        Ok(())
    }

    /// Forgets every group `keep` rejects (another gateway coordinates it
    /// now); their parked requests are answered with a retriable error.
    /// How many were forgotten.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) -> usize {
        let mut groups = self.inner.lock();
        let before = groups.len();
        groups.retain(|id, slot| {
            let kept = keep(id);
            if !kept {
                slot.timers.notify_one();
            }
            kept
        });
        if let Some(writes) = &self.inner.writes {
            // A group forgotten here is not asked about here again.
            let mut failed = writes.failed.lock().unwrap_or_else(PoisonError::into_inner);
            failed.retain(|id, _| groups.contains_key(id));
            // Nor is a stale copy of it (they were dropped only when their
            // group was next asked for here).
            let mut superseded = writes.superseded.lock().unwrap_or_else(PoisonError::into_inner);
            superseded.retain(|id, _| groups.contains_key(id));
        }
        before - groups.len()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, HashMap<StrBytes, Slot>> {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `change` on a group (creating it if `create`), then wakes its
    /// timer task if needed, forgets the group if it turned Dead, and tells
    /// Redis when it became Empty or stopped being Empty. `None`: no such group.
    fn update<R>(
        self: &Arc<Self>,
        group_id: &StrBytes,
        create: bool,
        change: impl FnOnce(&mut Group, Instant) -> R,
    ) -> Option<R> {
        let now = Instant::now();
        let mut groups = self.lock();
        self.drop_stale(&mut groups, group_id.as_bytes());
        if create && !groups.contains_key(group_id) {
            if !self.owns.owns(group_id) {
                return None;
            }
            groups.insert(group_id.clone(), self.start_group(group_id, now));
        }
        let slot = groups.get_mut(group_id)?;
        let (before, deadline_before) = (slot.group.state(), slot.group.next_deadline());
        let result = change(&mut slot.group, now);
        let (after, deadline_after) = (slot.group.state(), slot.group.next_deadline());
        // The timer task sleeps until the old deadline: wake it only for an
        // earlier one (a later one it finds when it wakes).
        if deadline_after.is_some_and(|after| deadline_before.is_none_or(|before| after < before)) {
            slot.timers.notify_one();
        }
        // A snapshot is what a new coordinator restores as Stable (or
        // Empty): taken only in those states, so a change in the middle of a
        // rebalance is written with the rebalance's outcome.
        // A static member replaced meanwhile is renamed in the last one,
        // written again ([`Group::take_renamed`]).
        let snapshot = if matches!(after, State::Stable | State::Empty) {
            slot.group.take_snapshot()
        } else {
            slot.group.take_renamed()
        };
        if after == State::Dead {
            groups.remove(group_id);
            tracing::info!(group = %group_id, "forgot empty group");
        } else if let Some(writes) = &self.writes {
            // The snapshot first: the retention change applies its TTL.
            if let Some(snapshot) = snapshot {
                if after == State::Stable {
                    tracing::info!(group = %group_id, generation = snapshot.generation,
                        members = snapshot.members.len(), "group stabilized");
                }
                slot.snapshot_write = writes.send(
                    group_id,
                    Change::Store(
                        snapshot.generation,
                        snapshot::encode(&snapshot),
                        slot.timers.clone(),
                    ),
                    slot.epoch,
                );
            }
            writes.track(group_id, before, after, slot.epoch);
        }
        Some(result)
    }

    fn start_group(self: &Arc<Self>, group_id: &StrBytes, now: Instant) -> Slot {
        self.start_slot(group_id, Group::new(self.timing, now))
    }

    fn start_slot(self: &Arc<Self>, group_id: &StrBytes, group: Group) -> Slot {
        // A new copy has written nothing yet: what an earlier copy failed
        // to write is not its own ([`Coordinator::stored`]).
        if let Some(writes) = &self.writes {
            (writes.failed.lock().unwrap_or_else(PoisonError::into_inner)).remove(group_id);
        }
        let timers = Arc::new(Notify::new());
        tokio::spawn(run_timers(Arc::downgrade(self), group_id.clone(), timers.clone()));
        Slot {
            group,
            timers,
            snapshot_write: 0,
            epoch: self.owns.epoch(),
        }
    }

    /// Drops this gateway's copy of a group if it is from an earlier epoch,
    /// or Redis refused its snapshot for a newer one.
    fn drop_stale(&self, groups: &mut HashMap<StrBytes, Slot>, group_id: &[u8]) {
        let superseded = self.writes.as_ref().and_then(|w| {
            w.superseded
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(group_id)
        });
        let superseded = |slot: &Slot| {
            superseded
                .as_ref()
                .is_some_and(|copy| Arc::ptr_eq(copy, &slot.timers))
        };
        if groups
            .get(group_id)
            .is_some_and(|slot| superseded(slot) || slot.epoch != self.owns.epoch())
            && let Some(slot) = groups.remove(group_id)
        {
            slot.timers.notify_one();
            tracing::info!(group = %String::from_utf8_lossy(group_id), "dropped a stale copy of the group");
        }
    }

    /// The group's next deadline; `None` once the group (this incarnation
    /// of it) is gone.
    fn next_deadline(&self, group_id: &StrBytes, timers: &Arc<Notify>) -> Option<Option<Instant>> {
        let groups = self.lock();
        let slot = groups
            .get(group_id)
            .filter(|slot| Arc::ptr_eq(&slot.timers, timers))?;
        Some(slot.group.next_deadline())
    }
}

/// A group's timer task: sleeps until its next deadline (or until woken
/// because the deadlines changed) and runs what is due. Ends with the group.
async fn run_timers(inner: Weak<Inner>, group_id: StrBytes, timers: Arc<Notify>) {
    loop {
        let next = match inner.upgrade() {
            Some(inner) => inner.next_deadline(&group_id, &timers),
            None => None,
        };
        match next {
            None => return,
            Some(Some(deadline)) => {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = timers.notified() => {}
                }
            }
            Some(None) => timers.notified().await,
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if !inner.owns.owns(&group_id) {
            // No longer this gateway's (its heartbeats lapsed, or the group
            // moved before the hand-over reached it): the copy is dropped,
            // its parked requests answered NOT_COORDINATOR, rather than a
            // timer completing a rebalance whose generation the group's
            // coordinator never knows.
            let mut groups = inner.lock();
            if groups
                .get(&group_id)
                .is_some_and(|slot| Arc::ptr_eq(&slot.timers, &timers))
            {
                groups.remove(&group_id);
            }
            return;
        }
        if inner.next_deadline(&group_id, &timers).is_some() {
            inner.update(&group_id, false, |group, now| group.expire(now));
        }
    }
}

/// Waits for a parked request's answer; shutdown, or a waiter dropped
/// unanswered (a newer request of the same member replaced it), gives
/// `unanswered`.
async fn settle<T>(reply: Reply<T>, shutdown: &watch::Receiver<bool>, unanswered: T) -> T {
    let answer = match reply {
        Reply::Now(response) => return response,
        Reply::Wait(answer) => answer,
    };
    let mut shutdown = shutdown.clone();
    tokio::select! {
        answer = answer => answer.unwrap_or(unanswered),
        Ok(_) = shutdown.wait_for(|stop| *stop) => unanswered,
    }
}

/// A copy of `s` that does not share the request frame's buffer: a string
/// decoded from a request is a slice of its whole frame, and a group that
/// kept one would keep the frame (up to `broker.max_request_bytes`) alive.
fn detach(s: &StrBytes) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// The strings and bytes of a JoinGroup that a group may keep, detached.
fn detach_join(mut req: JoinGroupRequest) -> JoinGroupRequest {
    req.group_id.0 = detach(&req.group_id.0);
    req.member_id = detach(&req.member_id);
    req.group_instance_id = req.group_instance_id.as_ref().map(detach);
    req.protocol_type = detach(&req.protocol_type);
    req.reason = None;
    for protocol in &mut req.protocols {
        protocol.name = detach(&protocol.name);
        protocol.metadata = Bytes::copy_from_slice(&protocol.metadata);
    }
    req.unknown_tagged_fields.clear();
    req
}

/// Group APIs other than the admin ones need a non-empty group id.
fn invalid_group(group_id: &StrBytes) -> Option<ResponseError> {
    group_id.is_empty().then_some(ResponseError::InvalidGroupId)
}

/// How long a SyncGroup answer waits for its group's snapshot to be written.
const STORE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How a group's latest snapshot went ([`Coordinator::stored`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stored {
    Written,
    /// Not yet written after [`STORE_WAIT`], or Redis refused the write.
    Unwritten,
    /// Not written from here: the group was handed to another gateway (or
    /// another coordinator wrote a newer generation) first.
    Lost,
}

/// Counts a change as applied when dropped (after it ran, or failed).
struct Applied<'a>(&'a watch::Sender<u64>);

impl Drop for Applied<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|done| *done += 1);
    }
}

/// What Redis must learn about a group.
enum Change {
    /// Its snapshot (generation, encoded [`Snapshot`]), by the copy whose
    /// timers' handle this is.
    Store(i32, Bytes, Arc<Notify>),
    /// It became Empty: its offsets and snapshot expire after the retention.
    Emptied,
    /// Offsets were committed to it without members: as `Emptied`; the
    /// outcome goes to the commit, which has it confirmed by the replicas
    /// acks=all waits for.
    Committed(oneshot::Sender<ketch_storage::Result<Option<i64>>>),
    /// It was found Empty: as `Emptied`, unless they expire already.
    Idle,
    /// It has members again: they stay.
    Active,
}

/// A change of a group queued for [`Writes`]: the group, the change, the
/// epoch of the copy that made it, and its number.
type Queued = (StrBytes, Change, u64, u64);

/// Writes what Redis keeps of a group, in the order it happened: its
/// snapshot, and the retention of its committed offsets (kept while it has
/// members, expiring once it is Empty: Kafka's `offsets.retention.minutes`).
struct Writes {
    /// Changes of a group another gateway coordinates now are not written.
    owns: Owns,
    storage: Arc<dyn Storage>,
    retention: std::time::Duration,
    /// Started with the first change, inside the runtime.
    queue: Mutex<Option<mpsc::UnboundedSender<Queued>>>,
    /// Changes sent so far (the last one's number).
    sent: AtomicU64,
    /// The number of the last change applied (or given up on).
    done: Arc<watch::Sender<u64>>,
    /// The number of each group's last snapshot that was not written, and
    /// whether it is lost (skipped because the group was handed over, or
    /// refused because another coordinator wrote a newer generation) rather
    /// than failed (Redis erred), until one is written.
    failed: Arc<Mutex<HashMap<StrBytes, (u64, bool)>>>,
    /// Groups whose snapshot Redis refused because another coordinator
    /// wrote a newer generation meanwhile, with the copy that made it (its
    /// timers' handle): that copy is stale, and is dropped at its next use
    /// (then loaded again from Redis); a copy loaded since is not.
    superseded: Arc<Mutex<HashMap<StrBytes, Arc<Notify>>>>,
}

impl Writes {
    fn track(&self, group_id: &StrBytes, before: State, after: State, epoch: u64) {
        if before != State::Empty && after == State::Empty {
            self.send(group_id, Change::Emptied, epoch);
        } else if before == State::Empty && after != State::Empty {
            self.send(group_id, Change::Active, epoch);
        }
    }

    /// Queues a change made by a copy of the group from `epoch`; its
    /// number, which [`Writes::done`] reaches once it is applied (or skipped:
    /// a change of a copy from another epoch than the current is stale).
    fn send(&self, group_id: &StrBytes, change: Change, epoch: u64) -> u64 {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let sender = queue.get_or_insert_with(|| self.start());
        let number = self.sent.fetch_add(1, AtomicOrdering::Relaxed) + 1;
        let _ = sender.send((group_id.clone(), change, epoch, number));
        number
    }

    fn start(&self) -> mpsc::UnboundedSender<Queued> {
        let (sender, mut changes) = mpsc::unbounded_channel::<Queued>();
        let storage = self.storage.clone();
        let retention = self.retention;
        let done = self.done.clone();
        let failed = self.failed.clone();
        let superseded = self.superseded.clone();
        let owns = self.owns.clone();
        tokio::spawn(async move {
            while let Some((group_id, change, epoch, number)) = changes.recv().await {
                let _applied = Applied(&done);
                let snapshot = matches!(change, Change::Store(..));
                let mut lost = false;
                let written = if epoch != owns.epoch() || !owns.owns(&group_id) {
                    // Handed over (and forgotten here) before this was
                    // written: the group's new coordinator keeps Redis now.
                    tracing::debug!(group = %group_id, "not writing a change of a group handed over");
                    lost = true;
                    false
                } else {
                    let applied = match change {
                        Change::Emptied => storage.group_emptied(&group_id, retention).await.map(|_| true),
                        Change::Committed(answer) => {
                            let retained = storage.group_emptied(&group_id, retention).await;
                            let written = retained.is_ok();
                            // The commit tells the client of a failure.
                            let _ = answer.send(retained);
                            Ok(written)
                        }
                        Change::Idle => storage.group_idle(&group_id, retention).await.map(|()| true),
                        Change::Active => storage.group_active(&group_id).await.map(|()| true),
                        Change::Store(generation, bytes, copy) => {
                            match storage.store_group(&group_id, generation, bytes).await {
                                Ok(true) => Ok(true),
                                Ok(false) => {
                                    tracing::warn!(group = %group_id, generation,
                                        "Redis holds a newer generation of this group (another coordinator ran it meanwhile); not overwritten, and this copy is dropped");
                                    superseded
                                        .lock()
                                        .unwrap_or_else(PoisonError::into_inner)
                                        .insert(group_id.clone(), copy);
                                    lost = true;
                                    Ok(false)
                                }
                                Err(e) => Err(e),
                            }
                        }
                    };
                    applied.unwrap_or_else(|e| {
                        tracing::warn!(group = %group_id, error = %e, "cannot update the group in Redis");
                        false
                    })
                };
                if snapshot {
                    let mut failed = failed.lock().unwrap_or_else(PoisonError::into_inner);
                    if written {
                        failed.remove(&group_id);
                    } else {
                        failed.insert(group_id, (number, lost));
                    }
                }
            }
        });
        sender
    }
}

#[cfg(test)]
mod tests;
