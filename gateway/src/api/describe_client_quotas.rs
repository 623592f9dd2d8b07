//! DescribeClientQuotas (API key 48, versions 0–1; KIP-546): the quotas
//! stored in Redis that match a filter, read fresh (a change made through
//! any gateway is seen at once). Needs DESCRIBE_CONFIGS on the cluster, as
//! in Kafka. Filter components match an entity type's exact name
//! (match type 0), its default entity (1) or any entity that has the type
//! (2); `strict` keeps only entities with no other types. A bad filter
//! fails the request with INVALID_REQUEST, an unknown entity type with
//! UNSUPPORTED_VERSION, and Kafka's messages.

use std::collections::HashMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{DescribeClientQuotasRequest, DescribeClientQuotasResponse, RequestHeader};

use super::{Client, cluster_authorized, error_code, str_bytes};
use crate::Context;
use crate::auth::acl::Operation;
use crate::quotas::{CLIENT_ID, Entity, IP, Table, USER};

const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_SPECIFIED: i8 = 2;

/// A request's filter: per entity type, the name it must have (`None`: the
/// default entity), or only that it has the type.
#[derive(Debug, Default)]
struct Filter {
    exact: HashMap<String, Option<String>>,
    specified: Vec<String>,
    strict: bool,
}

impl Filter {
    /// The filter of a request; `Err` is (error, message) as Kafka answers.
    fn of(request: &DescribeClientQuotasRequest) -> Result<Self, (ResponseError, String)> {
        let invalid = |message: String| Err((ResponseError::InvalidRequest, message));
        let mut filter = Filter {
            strict: request.strict,
            ..Filter::default()
        };
        for component in &request.components {
            let kind = component.entity_type.to_string();
            let name = component._match.as_ref().map(|m| m.to_string());
            if kind.is_empty() {
                return invalid("Invalid empty entity type.".to_owned());
            }
            if filter.exact.contains_key(&kind) || filter.specified.contains(&kind) {
                return invalid(format!(
                    "Entity type {kind} cannot appear more than once in the filter."
                ));
            }
            if ![USER, CLIENT_ID, IP].contains(&kind.as_str()) {
                return Err((
                    ResponseError::UnsupportedVersion,
                    format!("Unsupported entity type {kind}"),
                ));
            }
            match (component.match_type, name) {
                (MATCH_EXACT, None) => {
                    return invalid(
                        "Request specified MATCH_TYPE_EXACT, but set match string to null.".to_owned(),
                    );
                }
                (MATCH_EXACT, name) => {
                    // An address in the one spelling quotas are kept in
                    // (`::ffff:10.0.0.1` is 10.0.0.1), so the name it was
                    // set by finds it.
                    let name = match name {
                        Some(ip) if kind == IP => Some(
                            ip.parse::<std::net::IpAddr>()
                                .map_or(ip, |a| a.to_canonical().to_string()),
                        ),
                        other => other,
                    };
                    filter.exact.insert(kind, name);
                }
                (MATCH_DEFAULT, None) => {
                    filter.exact.insert(kind, None);
                }
                (MATCH_SPECIFIED, None) => filter.specified.push(kind),
                (MATCH_DEFAULT, Some(_)) => {
                    return invalid(
                        "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.".to_owned(),
                    );
                }
                (MATCH_SPECIFIED, Some(_)) => {
                    return invalid(
                        "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."
                            .to_owned(),
                    );
                }
                (other, _) => return invalid(format!("Unknown match type {other}")),
            }
        }
        let names =
            |kind: &str| filter.exact.contains_key(kind) || filter.specified.iter().any(|k| k == kind);
        if names(IP) && (names(USER) || names(CLIENT_ID)) {
            return invalid(
                "Invalid entity filter component combination. IP filter component should not be used with user \
                 or clientId filter component."
                    .to_owned(),
            );
        }
        Ok(filter)
    }

    fn matches(&self, entity: &Entity) -> bool {
        let parts = entity.parts();
        if self.strict && parts.len() != self.exact.len() + self.specified.len() {
            return false;
        }
        let name_of = |kind: &str| parts.iter().find(|(k, _)| *k == kind).map(|(_, name)| *name);
        self.exact
            .iter()
            .all(|(kind, name)| name_of(kind).is_some_and(|n| n == name.as_deref()))
            && self.specified.iter().all(|kind| name_of(kind).is_some())
    }
}

pub async fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    request: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let response = DescribeClientQuotasResponse::default();
    if !cluster_authorized(ctx, client, Operation::DescribeConfigs) {
        return response.with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    let filter = match Filter::of(&request) {
        Ok(filter) => filter,
        Err((error, message)) => {
            return response
                .with_error_code(error.code())
                .with_error_message(Some(str_bytes(message)));
        }
    };
    let table = match ctx.storage.client_quotas().await {
        Ok((version, stored)) => Table::from_stored(version, stored),
        Err(e) => {
            return response
                .with_error_code(error_code(&e))
                .with_error_message(Some(str_bytes(e.to_string())));
        }
    };
    let mut entities: Vec<_> = table.entities.iter().filter(|(e, _)| filter.matches(e)).collect();
    entities.sort_by(|a, b| a.0.cmp(b.0));
    let entries = entities
        .into_iter()
        .map(|(entity, values)| {
            let mut values: Vec<_> = values.iter().collect();
            values.sort_by(|a, b| a.0.cmp(b.0));
            EntryData::default()
                .with_entity(
                    entity
                        .parts()
                        .into_iter()
                        .map(|(kind, name)| {
                            EntityData::default()
                                .with_entity_type(str_bytes(kind))
                                .with_entity_name(name.map(str_bytes))
                        })
                        .collect(),
                )
                .with_values(
                    values
                        .into_iter()
                        .map(|(key, value)| {
                            ValueData::default()
                                .with_key(str_bytes(key.as_str()))
                                .with_value(*value)
                        })
                        .collect(),
                )
        })
        .collect();
    response.with_entries(Some(entries))
}
