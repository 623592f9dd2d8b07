//! The coordinator as clients see it, on a paused clock: every timer fires
//! when the runtime has nothing else to do, so no test sleeps in real time.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    GroupId, HeartbeatRequest, JoinGroupRequest, JoinGroupResponse, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use ketch_config::GroupsSettings;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::*;

const SESSION_TIMEOUT_MS: i32 = 10_000;
const RANGE: &[&str] = &["range"];

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_owned())
}

fn code(error: ResponseError) -> i16 {
    error.code()
}

struct Harness {
    groups: Coordinator,
    stop: watch::Sender<bool>,
    shutdown: watch::Receiver<bool>,
}

impl Harness {
    fn new() -> Self {
        Self::over(Coordinator::new(&GroupsSettings::default()))
    }

    /// A coordinator writing snapshots to `storage`, owning the groups
    /// `owns` says it does: one gateway of several.
    fn with_storage(storage: Arc<dyn Storage>, owns: Owns) -> Self {
        Self::over(Coordinator::with_storage(
            &GroupsSettings::default(),
            storage,
            owns,
        ))
    }

    fn over(groups: Coordinator) -> Self {
        let (stop, shutdown) = watch::channel(false);
        Self {
            groups,
            stop,
            shutdown,
        }
    }

    fn spawn_join(&self, req: JoinGroupRequest, version: i16) -> JoinHandle<JoinGroupResponse> {
        let (groups, shutdown) = (self.groups.clone(), self.shutdown.clone());
        let joiner = Joiner {
            client_id: s("client"),
            client_host: s("/10.0.0.1"),
            version,
        };
        tokio::spawn(async move { groups.join(req, joiner, &shutdown).await })
    }

    async fn join(&self, req: JoinGroupRequest) -> JoinGroupResponse {
        self.spawn_join(req, 9).await.expect("join task")
    }

    /// A member id from the MEMBER_ID_REQUIRED round trip.
    async fn member_id(&self) -> StrBytes {
        let response = self.join(join_request("", RANGE)).await;
        assert_eq!(response.error_code, code(ResponseError::MemberIdRequired));
        response.member_id
    }

    fn spawn_sync(&self, req: SyncGroupRequest) -> JoinHandle<SyncGroupResponse> {
        let (groups, shutdown) = (self.groups.clone(), self.shutdown.clone());
        tokio::spawn(async move { groups.sync(req, &shutdown).await })
    }

    async fn sync(&self, req: SyncGroupRequest) -> SyncGroupResponse {
        self.spawn_sync(req).await.expect("sync task")
    }

    fn heartbeat(&self, member_id: &StrBytes, generation: i32) -> i16 {
        let req = HeartbeatRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_member_id(member_id.clone())
            .with_generation_id(generation);
        now(self.groups.heartbeat(&req))
    }

    fn describe_state(&self) -> String {
        let described = now(self.groups.describe("g")).unwrap().expect("group in memory");
        described.group_state.to_string()
    }

    /// Two dynamic members through join and sync: (leader, follower, generation).
    /// Static members of instances "one" and "two", joined and synced
    /// (assignments "1" and "2"): their join answers and the generation.
    async fn stable_static_pair(&self) -> (JoinGroupResponse, JoinGroupResponse, i32) {
        let joins = ["one", "two"].map(|instance| self.spawn_join(static_join("", instance), 9));
        let [one, two] = joins;
        let (one, two) = (one.await.unwrap(), two.await.unwrap());
        let generation = one.generation_id;
        let (leader, follower) = if one.member_id == one.leader {
            (&one, &two)
        } else {
            (&two, &one)
        };
        let follower_sync = self.spawn_sync(sync_request(&follower.member_id, generation, &[]));
        let assignments = [(&one.member_id, "1"), (&two.member_id, "2")];
        self.sync(sync_request(&leader.member_id, generation, &assignments))
            .await;
        follower_sync.await.unwrap();
        (one, two, generation)
    }

    async fn stable_pair(&self) -> (StrBytes, StrBytes, i32) {
        let (a, b) = (self.member_id().await, self.member_id().await);
        let joins = [a, b].map(|id| self.spawn_join(join_request(&id, RANGE), 9));
        let [a, b] = joins;
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        let (leader, follower) = if a.member_id == a.leader { (a, b) } else { (b, a) };
        let generation = leader.generation_id;
        let follower_sync = self.spawn_sync(sync_request(&follower.member_id, generation, &[]));
        let assignments = [(&leader.member_id, "A"), (&follower.member_id, "B")];
        self.sync(sync_request(&leader.member_id, generation, &assignments))
            .await;
        follower_sync.await.unwrap();
        (leader.member_id, follower.member_id, generation)
    }
}

fn join_request(member_id: &str, protocols: &[&str]) -> JoinGroupRequest {
    let protocols = protocols
        .iter()
        .map(|name| {
            JoinGroupRequestProtocol::default()
                .with_name(s(name))
                .with_metadata(Bytes::from(format!("{member_id}/{name}")))
        })
        .collect();
    JoinGroupRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_member_id(s(member_id))
        .with_session_timeout_ms(SESSION_TIMEOUT_MS)
        .with_rebalance_timeout_ms(60_000)
        .with_protocol_type(s("consumer"))
        .with_protocols(protocols)
}

fn static_join(member_id: &str, instance_id: &str) -> JoinGroupRequest {
    join_request(member_id, RANGE).with_group_instance_id(Some(s(instance_id)))
}

fn sync_request(
    member_id: &StrBytes,
    generation: i32,
    assignments: &[(&StrBytes, &str)],
) -> SyncGroupRequest {
    let assignments = assignments
        .iter()
        .map(|(id, assignment)| {
            SyncGroupRequestAssignment::default()
                .with_member_id((*id).clone())
                .with_assignment(Bytes::from(assignment.to_string()))
        })
        .collect();
    SyncGroupRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_member_id(member_id.clone())
        .with_generation_id(generation)
        .with_assignments(assignments)
}

#[tokio::test(start_paused = true)]
async fn member_id_required_round_trip() {
    let h = Harness::new();
    let first = h.join(join_request("", RANGE)).await;
    assert_eq!(first.error_code, code(ResponseError::MemberIdRequired));
    assert!(first.member_id.starts_with("client-"), "{:?}", first.member_id);

    let started = Instant::now();
    let joined = h.join(join_request(&first.member_id, RANGE)).await;
    assert_eq!(joined.error_code, 0);
    assert_eq!(joined.member_id, first.member_id);
    assert_eq!(joined.leader, first.member_id);
    assert_eq!(joined.generation_id, 1);
    assert_eq!(joined.protocol_name.as_deref(), Some("range"));
    assert_eq!(joined.members.len(), 1);
    // The initial rebalance waited for more members.
    assert_eq!(started.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn before_v4_a_member_joins_without_the_round_trip() {
    let h = Harness::new();
    let joined = h.spawn_join(join_request("", RANGE), 3).await.unwrap();
    assert_eq!(joined.error_code, 0);
    assert!(joined.member_id.starts_with("client-"));
    assert_eq!(joined.generation_id, 1);
}

#[tokio::test(start_paused = true)]
async fn session_timeout_out_of_bounds_is_refused() {
    let h = Harness::new();
    let too_short = join_request("", RANGE).with_session_timeout_ms(1_000);
    let response = h.join(too_short).await;
    assert_eq!(response.error_code, code(ResponseError::InvalidSessionTimeout));
}

#[tokio::test(start_paused = true)]
async fn two_members_get_one_leader_and_the_same_generation() {
    let h = Harness::new();
    let (a, b) = (h.member_id().await, h.member_id().await);
    let started = Instant::now();
    let first = h.spawn_join(join_request(&a, RANGE), 9);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let second = h.spawn_join(join_request(&b, RANGE), 9);
    let (first, second) = (first.await.unwrap(), second.await.unwrap());

    assert_eq!((first.error_code, second.error_code), (0, 0));
    assert_eq!(first.generation_id, second.generation_id);
    assert_eq!(first.leader, second.leader);
    assert_eq!(first.leader, a, "the first member to join leads");
    assert_eq!(first.members.len(), 2, "the leader gets every member");
    assert!(second.members.is_empty());
    // A member arriving during the initial delay extends it once.
    assert_eq!(started.elapsed(), Duration::from_secs(6));
}

#[tokio::test(start_paused = true)]
async fn sync_gives_each_member_its_assignment_from_the_leader() {
    let h = Harness::new();
    let (a, b) = (h.member_id().await, h.member_id().await);
    let joins = [&a, &b].map(|id| h.spawn_join(join_request(id, RANGE), 9));
    let [first, second] = joins;
    let generation = first.await.unwrap().generation_id;
    second.await.unwrap();

    let follower = h.spawn_sync(sync_request(&b, generation, &[]));
    tokio::task::yield_now().await;
    assert!(!follower.is_finished(), "a follower waits for the leader");
    let leader = h
        .sync(sync_request(&a, generation, &[(&a, "A"), (&b, "B")]))
        .await;
    let follower = follower.await.unwrap();

    assert_eq!((leader.error_code, follower.error_code), (0, 0));
    assert_eq!(&leader.assignment[..], b"A");
    assert_eq!(&follower.assignment[..], b"B");
    assert_eq!(follower.protocol_name.as_deref(), Some("range"));
    // Stable: a late SyncGroup gets the stored assignment at once.
    let again = h.sync(sync_request(&b, generation, &[])).await;
    assert_eq!(&again.assignment[..], b"B");
    assert_eq!(h.describe_state(), "Stable");
}

#[tokio::test(start_paused = true)]
async fn heartbeat_and_sync_during_a_rebalance_are_told_to_rejoin() {
    let h = Harness::new();
    let (leader, _, generation) = h.stable_pair().await;
    assert_eq!(h.heartbeat(&leader, generation), 0);

    let newcomer = h.member_id().await;
    let _parked = h.spawn_join(join_request(&newcomer, RANGE), 9);
    tokio::task::yield_now().await;

    assert_eq!(
        h.heartbeat(&leader, generation),
        code(ResponseError::RebalanceInProgress)
    );
    let sync = h.sync(sync_request(&leader, generation, &[])).await;
    assert_eq!(sync.error_code, code(ResponseError::RebalanceInProgress));
    assert_eq!(
        h.heartbeat(&leader, generation + 1),
        code(ResponseError::IllegalGeneration)
    );
    assert_eq!(
        h.heartbeat(&s("nobody"), generation),
        code(ResponseError::UnknownMemberId)
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_member_is_removed_after_its_session_timeout() {
    let h = Harness::new();
    let (leader, follower, generation) = h.stable_pair().await;
    // Only the leader heartbeats, every 3 s; the follower's 10 s session ends.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(h.heartbeat(&leader, generation), 0);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        h.heartbeat(&leader, generation),
        code(ResponseError::RebalanceInProgress)
    );
    assert_eq!(
        h.heartbeat(&follower, generation),
        code(ResponseError::UnknownMemberId)
    );

    let rejoined = h.join(join_request(&leader, RANGE)).await;
    assert_eq!(rejoined.generation_id, generation + 1);
    assert_eq!(rejoined.members.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_static_member_gets_its_assignment_without_a_rebalance() {
    let h = Harness::new();
    let (one, two, generation) = h.stable_static_pair().await;

    // Instance "two" restarts: it forgot its member id.
    let restarted = h.join(static_join("", "two")).await;
    assert_eq!(restarted.error_code, 0);
    assert_ne!(restarted.member_id, two.member_id);
    assert!(restarted.member_id.starts_with("two-"));
    assert_eq!(restarted.generation_id, generation, "no rebalance");
    let synced = h.sync(sync_request(&restarted.member_id, generation, &[])).await;
    assert_eq!(&synced.assignment[..], b"2");
    assert_eq!(
        h.heartbeat(&one.member_id, generation),
        0,
        "the other member is undisturbed"
    );
    assert_eq!(h.describe_state(), "Stable");

    // The old incarnation is fenced.
    let stale = HeartbeatRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_member_id(two.member_id.clone())
        .with_group_instance_id(Some(s("two")))
        .with_generation_id(generation);
    assert_eq!(
        now(h.groups.heartbeat(&stale)),
        code(ResponseError::FencedInstanceId)
    );
    let stale_join = h.join(static_join(&two.member_id, "two")).await;
    assert_eq!(stale_join.error_code, code(ResponseError::FencedInstanceId));
}

/// Two static members through join and sync: (leader, follower, generation).
async fn stable_static_pair(h: &Harness) -> (JoinGroupResponse, JoinGroupResponse, i32) {
    let joins = ["one", "two"].map(|instance| h.spawn_join(static_join("", instance), 9));
    let [one, two] = joins;
    let (one, two) = (one.await.unwrap(), two.await.unwrap());
    let generation = one.generation_id;
    let (leader, follower) = if one.member_id == one.leader {
        (one, two)
    } else {
        (two, one)
    };
    let follower_sync = h.spawn_sync(sync_request(&follower.member_id, generation, &[]));
    let assignments = [(&leader.member_id, "1"), (&follower.member_id, "2")];
    h.sync(sync_request(&leader.member_id, generation, &assignments))
        .await;
    follower_sync.await.unwrap();
    (leader, follower, generation)
}

#[tokio::test(start_paused = true)]
async fn a_static_leader_that_misses_the_rebalance_leads_it_when_it_rejoins() {
    let h = Harness::new();
    let (leader, follower, generation) = stable_static_pair(&h).await;
    let instance = |r: &JoinGroupResponse| {
        if r.member_id.starts_with("one-") {
            "one"
        } else {
            "two"
        }
    };
    // The follower is removed by instance id: a rebalance begins. The
    // leader keeps its session alive but does not rejoin within the
    // rebalance timeout (60 s) ...
    let leaving = vec![MemberIdentity::default().with_group_instance_id(Some(s(instance(&follower))))];
    assert_eq!(now(h.groups.leave(&s("g"), leaving)).unwrap()[0].error_code, 0);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(70) {
        tokio::time::sleep(Duration::from_secs(3)).await;
        h.heartbeat(&leader.member_id, generation);
    }
    assert_eq!(h.describe_state(), "PreparingRebalance");
    // ... then restarts, forgetting its member id: it is every member the
    // group has, so the rebalance completes with it leading.
    let rejoined = tokio::time::timeout(
        Duration::from_secs(600),
        h.join(static_join("", instance(&leader))),
    )
    .await
    .expect("the rebalance completes");
    assert_eq!(rejoined.error_code, 0);
    assert_eq!(rejoined.leader, rejoined.member_id);
    assert_eq!(rejoined.generation_id, generation + 1);
    assert_eq!(rejoined.members.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_static_member_replaced_while_it_waits_for_a_rebalance_needs_no_heartbeat() {
    let h = Harness::new();
    let (leader, follower, generation) = stable_static_pair(&h).await;
    // A new static member starts a rebalance; the leader rejoins, the
    // follower does not (it keeps its session alive), so the join phase
    // waits for it up to the rebalance timeout (60 s).
    let first = h.spawn_join(static_join("", "three"), 9);
    let leader_instance = if leader.member_id.starts_with("one-") {
        "one"
    } else {
        "two"
    };
    let leader_join = h.spawn_join(static_join(&leader.member_id, leader_instance), 9);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The new member's process restarts and joins again under a new
    // member id, then waits without heartbeats for longer than its session
    // timeout (10 s): a member waiting for a rebalance needs none.
    let again = h.spawn_join(static_join("", "three"), 9);
    let started = Instant::now();
    while !again.is_finished() {
        tokio::time::sleep(Duration::from_secs(3)).await;
        h.heartbeat(&follower.member_id, generation);
    }
    assert_eq!(
        first.await.unwrap().error_code,
        code(ResponseError::FencedInstanceId),
        "the first incarnation is fenced"
    );
    let again = again.await.unwrap();
    assert_eq!(again.error_code, 0, "after {:?}", started.elapsed());
    assert!(
        started.elapsed() >= Duration::from_secs(55),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(again.generation_id, generation + 1);
    assert_eq!(leader_join.await.unwrap().error_code, 0);
}

/// Leaving a group the coordinator does not know is the request's
/// UNKNOWN_MEMBER_ID, as Kafka answers it (`classicGroupLeave`: "Group …
/// not found"), not an answer per member; a group known only by its
/// committed offsets is an Empty group, whose members are each unknown.
#[tokio::test(start_paused = true)]
async fn leaving_an_unknown_group_is_unknown_member_id() {
    let memory = Arc::new(crate::memory::MemoryStorage::default());
    let storage: Arc<dyn Storage> = memory.clone();
    let yes = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let h = Harness::with_storage(storage.clone(), owning(&yes));
    let leaving = || vec![MemberIdentity::default().with_member_id(s("m-1"))];
    assert_eq!(
        h.groups.leave(&s("g"), leaving()).await,
        Err(code(ResponseError::UnknownMemberId))
    );
    let offset = ketch_storage::CommittedOffset::new(5, -1, None);
    storage
        .commit_offsets("g", &[(("t".to_owned(), 0), offset)])
        .await
        .expect("committed");
    let answered = h.groups.leave(&s("g"), leaving()).await.expect("per member");
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].error_code, code(ResponseError::UnknownMemberId));
}

#[tokio::test(start_paused = true)]
async fn leaving_triggers_a_rebalance_and_answers_each_member() {
    let h = Harness::new();
    let (leader, follower, generation) = h.stable_pair().await;
    let leaving = vec![
        MemberIdentity::default().with_member_id(follower.clone()),
        MemberIdentity::default().with_member_id(s("nobody")),
    ];
    let responses = now(h.groups.leave(&s("g"), leaving)).unwrap();
    assert_eq!(responses[0].error_code, 0);
    assert_eq!(responses[1].error_code, code(ResponseError::UnknownMemberId));
    assert_eq!(
        h.heartbeat(&leader, generation),
        code(ResponseError::RebalanceInProgress)
    );

    // Everyone left has rejoined: the join phase ends at once.
    let started = Instant::now();
    let rejoined = h.join(join_request(&leader, RANGE)).await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(
        (rejoined.generation_id, rejoined.members.len()),
        (generation + 1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_static_member_leaves_by_instance_id() {
    let h = Harness::new();
    let joined = h.join(static_join("", "one")).await;
    let leaving = vec![MemberIdentity::default().with_group_instance_id(Some(s("one")))];
    let responses = now(h.groups.leave(&s("g"), leaving)).unwrap();
    assert_eq!(responses[0].error_code, 0);
    assert_eq!(
        h.heartbeat(&joined.member_id, joined.generation_id),
        code(ResponseError::UnknownMemberId)
    );
}

/// Members with these protocol preferences join a new group at once.
async fn join_all(h: &Harness, preferences: &[&[&str]]) -> Vec<JoinGroupResponse> {
    let joins: Vec<_> = preferences
        .iter()
        .map(|p| h.spawn_join(join_request("", p), 3))
        .collect();
    let mut responses = Vec::new();
    for join in joins {
        responses.push(join.await.unwrap());
    }
    responses
}

#[tokio::test(start_paused = true)]
async fn the_protocol_is_the_one_most_members_prefer() {
    let h = Harness::new();
    let both: &[&str] = &["range", "roundrobin"];
    let responses = join_all(&h, &[both, both, &["roundrobin", "range"]]).await;
    for response in responses {
        assert_eq!(response.protocol_name.as_deref(), Some("range"));
    }
}

#[tokio::test(start_paused = true)]
async fn the_protocol_is_one_every_member_supports() {
    let h = Harness::new();
    let both: &[&str] = &["range", "roundrobin"];
    let responses = join_all(&h, &[both, both, &["roundrobin"]]).await;
    for response in responses {
        assert_eq!(response.protocol_name.as_deref(), Some("roundrobin"));
    }

    let unshared = h.spawn_join(join_request("", &["range"]), 3).await.unwrap();
    assert_eq!(
        unshared.error_code,
        code(ResponseError::InconsistentGroupProtocol)
    );
    let other_type = join_request("", &["roundrobin"]).with_protocol_type(s("connect"));
    let other_type = h.spawn_join(other_type, 3).await.unwrap();
    assert_eq!(
        other_type.error_code,
        code(ResponseError::InconsistentGroupProtocol)
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_answers_a_parked_join() {
    let h = Harness::new();
    let id = h.member_id().await;
    let parked = h.spawn_join(join_request(&id, RANGE), 9);
    tokio::task::yield_now().await;
    h.stop.send(true).unwrap();
    let response = parked.await.unwrap();
    assert_eq!(response.error_code, code(ResponseError::NotCoordinator));
}

/// A group another gateway coordinates now is given up: its parked
/// JoinGroups and SyncGroups are NOT_COORDINATOR, as Kafka answers those of
/// a group it unloads, and the clients find the new coordinator.
#[tokio::test(start_paused = true)]
async fn a_group_given_up_answers_its_parked_requests_not_coordinator() {
    // Two members joined; the follower's SyncGroup waits for the leader's.
    let h = Harness::new();
    let (a, b) = (h.member_id().await, h.member_id().await);
    let joins = [&a, &b].map(|id| h.spawn_join(join_request(id, RANGE), 9));
    let [a, b] = joins;
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let follower = if a.member_id == a.leader { b } else { a };
    let parked_sync = h.spawn_sync(sync_request(&follower.member_id, follower.generation_id, &[]));
    tokio::task::yield_now().await;
    assert!(!parked_sync.is_finished());
    assert_eq!(h.groups.retain(|_| false), 1);
    assert_eq!(
        parked_sync.await.unwrap().error_code,
        code(ResponseError::NotCoordinator)
    );

    // A new member's JoinGroup waits for the rebalance it starts.
    let h = Harness::new();
    h.stable_pair().await;
    let newcomer = h.member_id().await;
    let parked_join = h.spawn_join(join_request(&newcomer, RANGE), 9);
    tokio::task::yield_now().await;
    assert!(!parked_join.is_finished());
    assert_eq!(h.groups.retain(|_| false), 1);
    assert_eq!(
        parked_join.await.unwrap().error_code,
        code(ResponseError::NotCoordinator)
    );
}

#[tokio::test(start_paused = true)]
async fn only_an_empty_group_is_deleted() {
    let h = Harness::new();
    let (leader, follower, _) = h.stable_pair().await;
    assert_eq!(now(h.groups.delete("g")), Err(NotDeleted::NonEmpty));
    let leaving = [leader, follower].map(|id| MemberIdentity::default().with_member_id(id));
    now(h.groups.leave(&s("g"), leaving.to_vec())).unwrap();
    assert_eq!(h.describe_state(), "Empty");
    assert_eq!(now(h.groups.delete("g")), Ok(()));
    assert_eq!(now(h.groups.delete("g")), Err(NotDeleted::Unknown));
}

/// A member that only commits (no heartbeats) keeps its session while the
/// group is Stable, as in Kafka's classic protocol; one that does neither
/// is expired.
#[tokio::test(start_paused = true)]
async fn offset_commits_keep_a_members_session() {
    let h = Harness::new();
    let (leader, follower, generation) = h.stable_pair().await;
    let half = Duration::from_millis(SESSION_TIMEOUT_MS as u64 / 2);
    for _ in 0..6 {
        tokio::time::sleep(half).await;
        assert_eq!(
            now(h
                .groups
                .validate_offset_commit("g", &leader, None, generation, Some(9))),
            Ok(())
        );
        assert_eq!(h.heartbeat(&follower, generation), 0);
    }
    assert_eq!(h.heartbeat(&leader, generation), 0, "three sessions on, alive");
    assert_eq!(h.describe_state(), "Stable");
    // The follower stops too: expired after its session.
    tokio::time::sleep(half * 3).await;
    assert_ne!(h.heartbeat(&follower, generation), 0);
}

/// While the group completes a rebalance (joined, not yet synced), a
/// consumer's commit is REBALANCE_IN_PROGRESS but a transactional one of the
/// new generation is taken, as in Kafka: the Java producer takes
/// REBALANCE_IN_PROGRESS from TxnOffsetCommit as fatal.
#[tokio::test(start_paused = true)]
async fn a_transactional_commit_is_taken_while_the_rebalance_completes() {
    let h = Harness::new();
    let (a, b) = (h.member_id().await, h.member_id().await);
    let joins = [&a, &b].map(|id| h.spawn_join(join_request(id, RANGE), 9));
    let [first, second] = joins;
    let (first, _) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(h.describe_state(), "CompletingRebalance");
    let generation = first.generation_id;
    let commit = |version| {
        now(h
            .groups
            .validate_offset_commit("g", &first.member_id, None, generation, version))
    };
    assert_eq!(commit(Some(9)), Err(code(ResponseError::RebalanceInProgress)));
    assert_eq!(commit(None), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn offset_commits_are_checked_against_the_generation() {
    let h = Harness::new();
    let (leader, _, generation) = h.stable_pair().await;
    assert_eq!(
        now(h
            .groups
            .validate_offset_commit("g", &leader, None, generation, Some(9))),
        Ok(())
    );
    let stale = now(h
        .groups
        .validate_offset_commit("g", &leader, None, generation - 1, Some(9)));
    assert_eq!(stale, Err(code(ResponseError::IllegalGeneration)));
    let outsider = now(h
        .groups
        .validate_offset_commit("g", &StrBytes::default(), None, -1, Some(9)));
    assert_eq!(outsider, Err(code(ResponseError::UnknownMemberId)));
    assert_eq!(
        now(h
            .groups
            .validate_offset_commit("other", &StrBytes::default(), None, -1, Some(9))),
        Ok(())
    );
    // A generation for a group that does not exist: GROUP_ID_NOT_FOUND
    // from v9 on, ILLEGAL_GENERATION before and for transactional commits.
    let unknown = |version| {
        now(h
            .groups
            .validate_offset_commit("other", &leader, None, 3, version))
    };
    assert_eq!(unknown(Some(9)), Err(code(ResponseError::GroupIdNotFound)));
    assert_eq!(unknown(Some(8)), Err(code(ResponseError::IllegalGeneration)));
    assert_eq!(unknown(None), Err(code(ResponseError::IllegalGeneration)));
}

#[tokio::test(start_paused = true)]
async fn a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_removed() {
    let h = Harness::new();
    let (leader, follower, generation) = h.stable_pair().await;
    let newcomer = h.member_id().await;
    let started = Instant::now();
    let newcomer_join = h.spawn_join(join_request(&newcomer, RANGE), 9);
    let leader_join = h.spawn_join(join_request(&leader, RANGE), 9);
    // The follower keeps its session alive but never rejoins.
    while !leader_join.is_finished() {
        tokio::time::sleep(Duration::from_secs(3)).await;
        h.heartbeat(&follower, generation);
    }
    let (leader_join, newcomer_join) = (leader_join.await.unwrap(), newcomer_join.await.unwrap());
    assert!(
        started.elapsed() >= Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(leader_join.members.len(), 2);
    assert_eq!(newcomer_join.generation_id, generation + 1);
    assert_eq!(
        h.heartbeat(&follower, generation + 1),
        code(ResponseError::UnknownMemberId)
    );
}

#[tokio::test(start_paused = true)]
async fn an_empty_group_is_forgotten_after_the_offsets_retention() {
    let h = Harness::new();
    let joined = h.join(join_request("", RANGE)).await;
    let joined = h.join(join_request(&joined.member_id, RANGE)).await;
    let leaving = vec![MemberIdentity::default().with_member_id(joined.member_id)];
    now(h.groups.leave(&s("g"), leaving)).unwrap();
    assert_eq!(h.describe_state(), "Empty");
    let retention = GroupsSettings::default().offsets_retention.get();
    tokio::time::sleep(retention + Duration::from_secs(1)).await;
    assert!(now(h.groups.describe("g")).unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_group_only_an_unknown_member_asked_for_is_forgotten_with_its_pending_member() {
    let h = Harness::new();
    // v4+: a member without an id gets one with MEMBER_ID_REQUIRED and never
    // comes back.
    let first = h.join(join_request("", RANGE)).await;
    assert_eq!(first.error_code, code(ResponseError::MemberIdRequired));
    assert!(
        now(h.groups.describe("g")).unwrap().is_some(),
        "its member id is pending"
    );
    tokio::time::sleep(Duration::from_millis(SESSION_TIMEOUT_MS as u64 + 1_000)).await;
    assert!(
        now(h.groups.describe("g")).unwrap().is_none(),
        "a group nobody joined must not outlive the pending member id"
    );
}

#[tokio::test(start_paused = true)]
async fn a_group_keeps_no_slice_of_the_request_frame() {
    let h = Harness::new();
    let frame = Bytes::from(b"gmember-idrangemetadata".to_vec());
    let slice = |from: usize, to: usize| StrBytes::try_from(frame.slice(from..to)).unwrap();
    let request = JoinGroupRequest::default()
        .with_group_id(GroupId(slice(0, 1)))
        .with_session_timeout_ms(SESSION_TIMEOUT_MS)
        .with_rebalance_timeout_ms(SESSION_TIMEOUT_MS)
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(slice(10, 15))
                .with_metadata(frame.slice(15..)),
        ]);
    let joined = h.spawn_join(request, 3).await.unwrap();
    assert_eq!(joined.error_code, 0);
    assert!(
        frame.is_unique(),
        "the group still holds a slice of the request frame"
    );
}

/// The answer of a coordinator call that needs no I/O (no storage here).
fn now<T>(call: impl std::future::Future<Output = T>) -> T {
    use futures::FutureExt;
    call.now_or_never()
        .expect("a coordinator without storage answers at once")
}

struct Owning(Arc<std::sync::atomic::AtomicBool>);

impl Ownership for Owning {
    fn owns(&self, _: &str) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn owning(owns: &Arc<std::sync::atomic::AtomicBool>) -> Owns {
    Arc::new(Owning(owns.clone()))
}

/// A restarted static member that takes its old member id over in a Stable
/// group is answered once the snapshot is written, as Kafka answers it once
/// the group's metadata is. Unwritten, it is COORDINATOR_NOT_AVAILABLE: told
/// success, the next coordinator would restore the old member id from Redis
/// and fence the new one (FENCED_INSTANCE_ID, fatal to the Java consumer).
/// Joining again once the snapshot can be written, it is taken over there.
#[tokio::test(start_paused = true)]
async fn a_static_member_taking_over_is_answered_once_the_group_is_written() {
    let memory = Arc::new(crate::memory::MemoryStorage::default());
    let storage: Arc<dyn Storage> = memory.clone();
    let yes = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let first = Harness::with_storage(storage.clone(), owning(&yes));
    let (_, _, generation) = first.stable_static_pair().await;

    // Instance "two" restarts while Redis refuses the group's snapshot.
    memory.refuse_group_stores(true);
    let refused = first.join(static_join("", "two")).await;
    assert_eq!(refused.error_code, code(ResponseError::CoordinatorNotAvailable));
    memory.refuse_group_stores(false);
    let restarted = first.join(static_join("", "two")).await;
    assert_eq!(restarted.error_code, 0);
    assert_eq!(restarted.generation_id, generation, "no rebalance");

    // Another gateway takes the group over from Redis: the new incarnation
    // is the member it knows.
    let second = Harness::with_storage(storage.clone(), owning(&yes));
    let heartbeat = HeartbeatRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_member_id(restarted.member_id.clone())
        .with_group_instance_id(Some(s("two")))
        .with_generation_id(generation);
    assert_eq!(now(second.groups.heartbeat(&heartbeat)), 0);
}

/// A static member replaced in the middle of a rebalance (its process
/// restarted) is known by its new member id to the next coordinator, should
/// the group change coordinator before the rebalance's outcome is written:
/// the last snapshot is written again with the member renamed. Before, the
/// next coordinator restored the old member id and fenced the new one
/// (FENCED_INSTANCE_ID, fatal to the Java consumer).
#[tokio::test(start_paused = true)]
async fn a_static_member_replaced_during_a_rebalance_is_not_fenced_by_the_next_coordinator() {
    let memory = Arc::new(crate::memory::MemoryStorage::default());
    let storage: Arc<dyn Storage> = memory.clone();
    let yes = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let first = Harness::with_storage(storage.clone(), owning(&yes));
    let (one, _, generation) = first.stable_static_pair().await;

    // A dynamic member joins: a rebalance begins. Instance "two" restarts
    // meanwhile, under a new member id; "one" rejoins.
    let newcomer = first.member_id().await;
    let joins = [
        first.spawn_join(join_request(&newcomer, RANGE), 9),
        first.spawn_join(static_join("", "two"), 9),
        first.spawn_join(static_join(&one.member_id, "one"), 9),
    ];
    let mut answers = Vec::new();
    for join in joins {
        answers.push(join.await.unwrap());
    }
    let restarted = answers[1].clone();
    assert_eq!(restarted.error_code, 0);
    assert_eq!(restarted.generation_id, generation + 1);
    assert_eq!(first.describe_state(), "CompletingRebalance");
    tokio::time::sleep(Duration::from_millis(10)).await;

    // Another gateway takes the group over before the rebalance completes:
    // the new incarnation is refused as a member of an older generation
    // would be, and joins again, not fenced.
    let second = Harness::with_storage(storage.clone(), owning(&yes));
    let sync = second
        .sync(
            sync_request(&restarted.member_id, restarted.generation_id, &[])
                .with_group_instance_id(Some(s("two"))),
        )
        .await;
    assert_eq!(sync.error_code, code(ResponseError::IllegalGeneration));
    let rejoined = second.join(static_join(&restarted.member_id, "two")).await;
    assert_eq!(rejoined.error_code, 0);
    assert_eq!(rejoined.member_id, restarted.member_id);
}

/// A group timer that fires after this gateway stopped owning the group
/// (its heartbeats lapsed, the hand-over not processed yet) completes
/// nothing: the copy is dropped and its parked joins are answered
/// NOT_COORDINATOR, rather than told a generation the group's coordinator
/// never knows.
#[tokio::test(start_paused = true)]
async fn a_timer_of_a_group_no_longer_owned_completes_nothing() {
    let storage: Arc<dyn Storage> = Arc::new(crate::memory::MemoryStorage::default());
    let owned = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let h = Harness::with_storage(storage, owning(&owned));
    let (leader, _, _) = h.stable_pair().await;
    // A new member starts a rebalance and the leader rejoins; the follower
    // does not, so the join phase waits for its session to expire (10 s).
    let newcomer = h.member_id().await;
    let joins = [
        h.spawn_join(join_request(&newcomer, RANGE), 9),
        h.spawn_join(join_request(&leader, RANGE), 9),
    ];
    tokio::time::sleep(Duration::from_secs(1)).await;
    owned.store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(70)).await;
    for join in joins {
        assert_eq!(
            join.await.unwrap().error_code,
            code(ResponseError::NotCoordinator)
        );
    }
}

/// A SyncGroup that reaches a coordinator which cannot load the group
/// (Redis failing, after a hand-over) is REBALANCE_IN_PROGRESS, as from
/// Kafka: the member joins again. COORDINATOR_LOAD_IN_PROGRESS, which the
/// Java consumer's SyncGroup does not handle, ended its poll loop.
#[tokio::test(start_paused = true)]
async fn a_sync_the_coordinator_cannot_load_the_group_for_is_rebalance_in_progress() {
    let memory = Arc::new(crate::memory::MemoryStorage::default());
    let storage: Arc<dyn Storage> = memory.clone();
    let yes = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let first = Harness::with_storage(storage.clone(), owning(&yes));
    let (_, follower, generation) = first.stable_pair().await;
    // Another gateway takes the group over while Redis fails its reads.
    let second = Harness::with_storage(storage.clone(), owning(&yes));
    memory.refuse_group_loads(true);
    let answer = second.sync(sync_request(&follower, generation, &[])).await;
    assert_eq!(answer.error_code, code(ResponseError::RebalanceInProgress));
    memory.refuse_group_loads(false);
    let answer = second.sync(sync_request(&follower, generation, &[])).await;
    assert_eq!(answer.error_code, 0);
}

/// A group deleted right after its last members left stays deleted: the
/// Empty snapshot queued when they left is written before DeleteGroups
/// deletes the group from Redis, not after (which would bring it back).
#[tokio::test(start_paused = true)]
async fn a_deleted_group_is_not_written_back_by_its_queued_snapshot() {
    let memory = Arc::new(crate::memory::MemoryStorage::default());
    let storage: Arc<dyn Storage> = memory.clone();
    let yes = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let h = Harness::with_storage(storage.clone(), owning(&yes));
    let (leader, follower, _) = h.stable_pair().await;
    let leaving = [leader, follower].map(|id| MemberIdentity::default().with_member_id(id));
    now(h.groups.leave(&s("g"), leaving.to_vec())).unwrap();
    assert_eq!(h.groups.delete("g").await, Ok(()));
    storage.delete_group_offsets("g").await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        storage.load_group("g").await.unwrap().is_none(),
        "the snapshot came back"
    );
    assert!(h.groups.describe("g").await.unwrap().is_none());
}

/// A copy whose snapshot Redis refuses (another coordinator wrote a newer
/// generation meanwhile) is dropped, and the group loaded again from Redis,
/// not kept until its next rebalance.
#[tokio::test(start_paused = true)]
async fn a_copy_redis_holds_a_newer_generation_of_is_loaded_again() {
    let memory = Arc::new(crate::memory::MemoryStorage::default());
    let storage: Arc<dyn Storage> = memory.clone();
    let yes = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let h = Harness::with_storage(storage.clone(), owning(&yes));
    let (leader, follower, generation) = h.stable_pair().await;
    // Another coordinator's newer generation (its snapshot as this one
    // wrote it: Stable, two members).
    let stored = storage.load_group("g").await.unwrap().expect("stored");
    assert!(storage.store_group("g", generation + 5, stored).await.unwrap());
    // Here both members leave: the Empty snapshot is refused.
    let leaving = [leader, follower].map(|id| MemberIdentity::default().with_member_id(id));
    now(h.groups.leave(&s("g"), leaving.to_vec())).unwrap();
    assert_eq!(h.describe_state(), "Empty");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let described = h.groups.describe("g").await.unwrap().expect("loaded again");
    assert_eq!(described.group_state.as_str(), "Stable");
    assert_eq!(described.members.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_new_coordinator_takes_a_stable_group_over_at_its_generation_and_refuses_older_commits() {
    let storage: Arc<dyn Storage> = Arc::new(crate::memory::MemoryStorage::default());
    let yes = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let first = Harness::with_storage(storage.clone(), owning(&yes));
    let (leader, follower, generation) = first.stable_pair().await;

    // SyncGroup was answered once the snapshot was stored: another
    // gateway loads the group from it, Stable at the same generation.
    let second = Harness::with_storage(storage.clone(), owning(&yes));
    assert_eq!(second.heartbeat(&leader, generation), 0);
    assert_eq!(second.heartbeat(&follower, generation), 0);
    assert_eq!(second.describe_state(), "Stable");
    let described = now(second.groups.describe("g")).unwrap().expect("loaded");
    assert_eq!(described.members.len(), 2);
    assert!(
        described.members.iter().all(|m| !m.member_assignment.is_empty()),
        "assignments restored"
    );
    assert_eq!(
        now(second
            .groups
            .validate_offset_commit("g", &leader, None, generation - 1, Some(9))),
        Err(code(ResponseError::IllegalGeneration))
    );
    assert_eq!(
        now(second
            .groups
            .validate_offset_commit("g", &leader, None, generation, Some(9))),
        Ok(())
    );
}

#[tokio::test(start_paused = true)]
async fn a_coordinator_that_lost_a_group_neither_loads_it_nor_overwrites_what_the_new_one_keeps() {
    let storage: Arc<dyn Storage> = Arc::new(crate::memory::MemoryStorage::default());
    let owned = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let old = Harness::with_storage(storage.clone(), owning(&owned));
    let (leader, _, generation) = old.stable_pair().await;

    // Another gateway coordinates the group now. Before the old one is
    // told, its copy's members' sessions run out (no heartbeats reach it):
    // the timer drops the copy rather than empty the group at a newer
    // generation.
    owned.store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(SESSION_TIMEOUT_MS as u64 * 2)).await;
    assert_eq!(old.groups.retain(|_| false), 0, "the stale copy dropped");
    let yes = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let new = Harness::with_storage(storage.clone(), owning(&yes));
    assert_eq!(
        new.heartbeat(&leader, generation),
        0,
        "Redis still has the Stable generation"
    );

    // Forgotten, it is not loaded again while another gateway owns it.
    assert_eq!(now(old.groups.describe("g")), Err(ResponseError::NotCoordinator));
    assert_ne!(old.heartbeat(&leader, generation), 0);
    assert_eq!(
        now(old.groups.describe("g")),
        Err(ResponseError::NotCoordinator),
        "not loaded back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_commit_to_an_empty_group_expires_its_offsets_in_order_with_its_changes() {
    let memory = Arc::new(crate::memory::MemoryStorage::default());
    let storage: Arc<dyn Storage> = memory.clone();
    let yes = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let h = Harness::with_storage(storage, owning(&yes));
    // A standalone commit: the group has no members, its offsets expire.
    assert!(matches!(h.groups.retain_committed("g").await, Some(Ok(()))));
    assert_eq!(memory.expiring("g"), Some(true));
    // Members join: the expiry, queued first, is undone after it.
    let (leader, _, _) = h.stable_pair().await;
    h.groups.stored(&s("g")).await;
    assert_eq!(memory.expiring("g"), Some(false));
    // A commit while it has members leaves its offsets kept.
    assert!(matches!(h.groups.retain_committed("g").await, Some(Ok(()))));
    assert_eq!(memory.expiring("g"), Some(false));
    assert!(!leader.is_empty());
    // Handed over before its expiry is written: the commit is not told
    // it stands (the new coordinator writes it when the client retries).
    yes.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(matches!(
        h.groups.retain_committed("other").await,
        Some(Err(ketch_storage::StorageError::Unavailable(_)))
    ));
    assert_eq!(memory.expiring("other"), None, "not written");
}

/// A SyncGroup whose generation is not written because the group was
/// handed to another gateway first (its write skipped: the new coordinator
/// loads the generation before) is NOT_COORDINATOR, as Kafka answers the
/// SyncGroups of a group it unloads: told success, the members would start
/// on a generation the next coordinator does not know, and be told
/// ILLEGAL_GENERATION there (their partitions lost, their commits failed).
#[tokio::test(start_paused = true)]
async fn a_sync_whose_generation_a_hand_over_kept_unwritten_is_not_coordinator() {
    let memory = Arc::new(crate::memory::MemoryStorage::default());
    let storage: Arc<dyn Storage> = memory.clone();
    let owned = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let h = Harness::with_storage(storage, owning(&owned));
    let (a, b) = (h.member_id().await, h.member_id().await);
    let joins = [a, b].map(|id| h.spawn_join(join_request(&id, RANGE), 9));
    let [a, b] = joins;
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let (leader, follower) = if a.member_id == a.leader { (a, b) } else { (b, a) };
    let generation = leader.generation_id;
    let follower_sync = h.spawn_sync(sync_request(&follower.member_id, generation, &[]));
    tokio::task::yield_now().await;
    // The group is handed over before the leader's assignment is written.
    owned.store(false, std::sync::atomic::Ordering::SeqCst);
    let assignments = [(&leader.member_id, "A"), (&follower.member_id, "B")];
    let answer = h
        .sync(sync_request(&leader.member_id, generation, &assignments))
        .await;
    assert_eq!(answer.error_code, code(ResponseError::NotCoordinator));
    let answer = follower_sync.await.unwrap();
    assert_eq!(answer.error_code, code(ResponseError::NotCoordinator));
}
