//! AlterClientQuotas (API key 49, versions 0–1; KIP-546): sets and removes
//! quotas of user, client-id and ip entities, checked as Kafka's controller
//! checks them (entity types and combinations, the keys each takes, values
//! above 0, whole numbers for byte and connection rates) with its messages.
//! The valid entries of a request are stored together in Redis and
//! announced to every gateway (`quotas::keep_current`); `validate_only`
//! stores nothing. Needs ALTER_CONFIGS on the cluster, as in Kafka. An
//! audit line (`ketch::audit`) per changed entity.

use std::collections::HashSet;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_client_quotas_response::{EntityData, EntryData};
use kafka_protocol::messages::{AlterClientQuotasRequest, AlterClientQuotasResponse, RequestHeader};

use super::{Client, cluster_authorized, error_code, str_bytes};
use crate::Context;
use crate::auth::acl::Operation;
use crate::quotas::{self, Entity};

pub async fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    request: AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    let allowed = cluster_authorized(ctx, client, Operation::AlterConfigs);
    let mut results: Vec<Result<(), (i16, String)>> = Vec::with_capacity(request.entries.len());
    let mut changes = Vec::new();
    // What each valid entry changes, for its audit line.
    let mut audit = Vec::new();
    let mut seen = HashSet::new();
    for entry in &request.entries {
        if !allowed {
            results.push(Err((
                ResponseError::ClusterAuthorizationFailed.code(),
                "ALTER_CONFIGS on the cluster is required".to_owned(),
            )));
            continue;
        }
        let parts = entry
            .entity
            .iter()
            .map(|e| (e.entity_type.as_str(), e.entity_name.as_deref()));
        let entity = match Entity::from_parts(parts) {
            Ok(entity) => entity,
            Err(message) => {
                results.push(Err((ResponseError::InvalidRequest.code(), message)));
                continue;
            }
        };
        if !seen.insert(entity.clone()) {
            results.push(Err((
                ResponseError::InvalidRequest.code(),
                format!("Ignoring duplicate entity {}", entity.describe()),
            )));
            continue;
        }
        let mut keys = HashSet::new();
        let checked: Result<Vec<_>, String> = entry
            .ops
            .iter()
            .filter_map(|op| {
                let key = op.key.as_str();
                if !keys.insert(key) {
                    return Some(Err(format!(
                        "Duplicate quota key {key} not updating quota for this entity {}",
                        entity.describe()
                    )));
                }
                if op.remove {
                    // Not validated, as by Kafka; a key the entity cannot
                    // hold is not held, so there is nothing to remove.
                    return entity.holds(key).then(|| Ok(quotas::change(&entity, key, None)));
                }
                Some(
                    quotas::check_value(&entity, key, op.value)
                        .map(|()| quotas::change(&entity, key, Some(op.value))),
                )
            })
            .collect();
        match checked {
            Ok(entity_changes) => {
                audit.push((entity.describe(), entity_changes.clone()));
                changes.extend(entity_changes);
                results.push(Ok(()));
            }
            Err(message) => results.push(Err((ResponseError::InvalidRequest.code(), message))),
        }
    }
    if !request.validate_only && !changes.is_empty() {
        match ctx.storage.change_client_quotas(&changes).await {
            Ok(version) => {
                for (entity, entity_changes) in audit {
                    let change: Vec<String> = entity_changes
                        .iter()
                        .map(|c| match &c.value {
                            Some(value) => format!("{}={value}", c.key),
                            None => format!("{} removed", c.key),
                        })
                        .collect();
                    tracing::info!(target: "ketch::audit", principal = %client.principal, client = %client.peer,
                        entity, change = change.join(", "), version, "client quotas changed");
                }
                // This gateway applies them at once (the others on the announcement).
                if let Err(e) = quotas::reload(ctx).await {
                    tracing::warn!(error = %e, "cannot reload the client quotas");
                }
            }
            Err(e) => {
                let code = error_code(&e);
                for result in results.iter_mut().filter(|r| r.is_ok()) {
                    *result = Err((code, e.to_string()));
                }
            }
        }
    }
    let entries = request
        .entries
        .iter()
        .zip(results)
        .map(|(entry, result)| {
            let entity = entry
                .entity
                .iter()
                .map(|e| {
                    EntityData::default()
                        .with_entity_type(e.entity_type.clone())
                        .with_entity_name(e.entity_name.clone())
                })
                .collect();
            let (code, message) = match result {
                Ok(()) => (0, None),
                Err((code, message)) => (code, Some(str_bytes(message))),
            };
            EntryData::default()
                .with_error_code(code)
                .with_error_message(message)
                .with_entity(entity)
        })
        .collect();
    AlterClientQuotasResponse::default().with_entries(entries)
}
