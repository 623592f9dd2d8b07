//! ListGroups (API key 16, versions 0–5): the groups this gateway
//! coordinates — those in memory and those known only by their committed
//! offsets in Redis, which are Empty. v4 filters by state (KIP-518), v5 by
//! type (KIP-848: every ketch group is "classic").

use std::collections::HashSet;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{GroupId, ListGroupsRequest, ListGroupsResponse, RequestHeader};
use kafka_protocol::protocol::StrBytes;

use super::Client;
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::group::{Listing, State};

/// The only group type ketch has.
const CLASSIC: &str = "classic";

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: ListGroupsRequest,
) -> ListGroupsResponse {
    let wanted_type = |t: &StrBytes| t.eq_ignore_ascii_case(CLASSIC);
    if !req.types_filter.is_empty() && !req.types_filter.iter().any(wanted_type) {
        return ListGroupsResponse::default();
    }
    let mut response = if !client.forwarded && ctx.membership.behind_shared_address(&client.listener) {
        list_everywhere(ctx, client, header, req).await
    } else {
        list_here(ctx, req).await
    };
    // DESCRIBE on the cluster lists every group; otherwise those the client
    // may describe.
    if !super::cluster_authorized(ctx, client, Operation::Describe) {
        response.groups.retain(|g| {
            super::authorized(ctx, client, Operation::Describe, ResourceType::Group, &g.group_id)
        });
    }
    response
}

/// Behind a load balancer a client asks one gateway for the groups of
/// every gateway behind that address: this one's, and each other's, asked
/// over the internal channel. Gateways the listener advertises at
/// addresses of their own are left out: the client asks them itself (an
/// admin client asks every broker Metadata lists), and would list their
/// groups twice.
async fn list_everywhere(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: ListGroupsRequest,
) -> ListGroupsResponse {
    let others: Vec<String> = (ctx.membership.sharing_my_address(&client.listener).into_iter())
        .filter_map(|n| n.internal_address())
        .collect();
    let asked = others
        .iter()
        .map(|to| super::forward(ctx, client, header, &req, to));
    let (mine, theirs) = tokio::join!(list_here(ctx, req.clone()), futures::future::join_all(asked));
    let mut response = mine;
    for answer in theirs {
        match answer {
            Ok(listed) if listed.error_code == 0 => response.groups.extend(listed.groups),
            Ok(listed) => return ListGroupsResponse::default().with_error_code(listed.error_code),
            Err(code) => return ListGroupsResponse::default().with_error_code(code),
        }
    }
    response
}

/// The groups this gateway coordinates.
async fn list_here(ctx: &Context, req: ListGroupsRequest) -> ListGroupsResponse {
    let mut groups = ctx.groups.list();
    match ctx.storage.groups_with_offsets().await {
        Ok(with_offsets) => groups.extend(only_offsets(&groups, with_offsets)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list groups with committed offsets");
            return ListGroupsResponse::default()
                .with_error_code(ResponseError::CoordinatorLoadInProgress.code());
        }
    }
    let listed = groups
        .into_iter()
        .filter(|g| in_states(g.state, &req.states_filter))
        .filter(|g| ctx.membership.coordinates(&g.group_id))
        .map(listed)
        .collect();
    ListGroupsResponse::default().with_groups(listed)
}

/// Groups known only by their committed offsets: Empty, of unknown type.
fn only_offsets(in_memory: &[Listing], with_offsets: Vec<String>) -> Vec<Listing> {
    let known: HashSet<&str> = in_memory.iter().map(|g| &*g.group_id).collect();
    with_offsets
        .into_iter()
        .filter(|id| !known.contains(id.as_str()))
        .map(|id| Listing {
            group_id: StrBytes::from_string(id),
            state: State::Empty,
            protocol_type: StrBytes::default(),
        })
        .collect()
}

/// Kafka matches state names trimmed and without regard to case; no
/// filter is all.
fn in_states(state: State, filter: &[StrBytes]) -> bool {
    filter.is_empty() || filter.iter().any(|s| s.trim().eq_ignore_ascii_case(state.name()))
}

fn listed(group: Listing) -> ListedGroup {
    ListedGroup::default()
        .with_group_id(GroupId(group.group_id))
        .with_protocol_type(group.protocol_type)
        .with_group_state(StrBytes::from_static_str(group.state.name()))
        .with_group_type(StrBytes::from_static_str(CLASSIC))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_filter_ignores_case() {
        let filter = [StrBytes::from_static_str("stable")];
        assert!(in_states(State::Stable, &filter));
        assert!(in_states(State::Stable, &[StrBytes::from_static_str(" Stable ")]));
        assert!(!in_states(State::Empty, &filter));
        assert!(in_states(State::Empty, &[]));
    }

    #[test]
    fn groups_with_offsets_only_are_listed_empty_once() {
        let in_memory = [Listing {
            group_id: StrBytes::from_static_str("a"),
            state: State::Stable,
            protocol_type: StrBytes::from_static_str("consumer"),
        }];
        let extra = only_offsets(&in_memory, vec!["a".into(), "b".into()]);
        assert_eq!(extra.len(), 1);
        assert_eq!(&*extra[0].group_id, "b");
        assert_eq!(extra[0].state, State::Empty);
    }
}
