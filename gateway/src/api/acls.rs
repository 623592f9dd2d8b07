//! CreateAcls, DescribeAcls and DeleteAcls (API keys 30, 29, 31; versions
//! 1–3, KIP-290 pattern types): the ACLs every gateway enforces, kept in
//! Redis. Creating and deleting take ALTER on the cluster, describing
//! DESCRIBE; without `acl.enabled` they answer SECURITY_DISABLED, as a
//! Kafka broker without an authorizer does.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest,
    DescribeAclsResponse,
};

use super::{Client, cluster_authorized, error_code, str_bytes};
use crate::Context;
use crate::auth::acl::{AclBinding, AclFilter, Operation};

const NO_AUTHORIZER: &str = "No Authorizer is configured (acl.enabled = false).";

/// Why a whole request is refused: (error code, message).
fn refused(ctx: &Context, client: &Client, op: Operation) -> Option<(i16, String)> {
    if !ctx.security.acls.enabled() {
        return Some((ResponseError::SecurityDisabled.code(), NO_AUTHORIZER.to_owned()));
    }
    if !cluster_authorized(ctx, client, op) {
        return Some((
            ResponseError::ClusterAuthorizationFailed.code(),
            "Authorization failed.".to_owned(),
        ));
    }
    None
}

pub async fn create(ctx: &Context, client: &Client, request: CreateAclsRequest) -> CreateAclsResponse {
    if let Some((code, message)) = refused(ctx, client, Operation::Alter) {
        let results = request
            .creations
            .iter()
            .map(|_| {
                AclCreationResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(message.clone())))
            })
            .collect();
        return CreateAclsResponse::default().with_results(results);
    }
    let parsed: Vec<Result<AclBinding, String>> = request
        .creations
        .iter()
        .map(|c| {
            AclBinding::from_codes(
                c.resource_type,
                &c.resource_name,
                c.resource_pattern_type,
                &c.principal,
                &c.host,
                c.operation,
                c.permission_type,
            )
            .map_err(|e| format!("Invalid ACL creation: {e}"))
        })
        .collect();
    let valid: Vec<String> = parsed.iter().flatten().map(AclBinding::encode).collect();
    let stored = ctx.storage.add_acls(&valid).await.map(|_| ());
    if stored.is_ok() {
        reload(ctx).await;
        for b in parsed.iter().flatten() {
            tracing::info!(principal = %client.principal, acl = ?b, "ACL created");
        }
    }
    let results = parsed
        .into_iter()
        .map(|p| match (p, &stored) {
            (Err(message), _) => AclCreationResult::default()
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(str_bytes(message))),
            (Ok(_), Err(e)) => AclCreationResult::default()
                .with_error_code(error_code(e))
                .with_error_message(Some(str_bytes(e.to_string()))),
            (Ok(_), Ok(())) => AclCreationResult::default(),
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

pub fn describe(ctx: &Context, client: &Client, request: DescribeAclsRequest) -> DescribeAclsResponse {
    if let Some((code, message)) = refused(ctx, client, Operation::Describe) {
        return DescribeAclsResponse::default()
            .with_error_code(code)
            .with_error_message(Some(str_bytes(message)));
    }
    let filter = match AclFilter::from_codes(
        request.resource_type_filter,
        request.resource_name_filter.as_deref(),
        request.pattern_type_filter,
        request.principal_filter.as_deref(),
        request.host_filter.as_deref(),
        request.operation,
        request.permission_type,
    ) {
        Ok(filter) => filter,
        Err(e) => {
            return DescribeAclsResponse::default()
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(str_bytes(format!("Invalid ACL filter: {e}"))));
        }
    };
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    let mut matching = ctx.security.acls.matching(&filter);
    matching.sort_by(|a, b| {
        (a.resource_type.code(), &a.name, a.pattern.code()).cmp(&(
            b.resource_type.code(),
            &b.name,
            b.pattern.code(),
        ))
    });
    for b in matching {
        let description = AclDescription::default()
            .with_principal(str_bytes(b.principal.clone()))
            .with_host(str_bytes(b.host.clone()))
            .with_operation(b.operation.code())
            .with_permission_type(b.permission.code());
        match resources.last_mut() {
            Some(r)
                if r.resource_type == b.resource_type.code()
                    && r.resource_name.as_str() == b.name
                    && r.pattern_type == b.pattern.code() =>
            {
                r.acls.push(description)
            }
            _ => resources.push(
                DescribeAclsResource::default()
                    .with_resource_type(b.resource_type.code())
                    .with_resource_name(str_bytes(b.name.clone()))
                    .with_pattern_type(b.pattern.code())
                    .with_acls(vec![description]),
            ),
        }
    }
    DescribeAclsResponse::default().with_resources(resources)
}

pub async fn delete(ctx: &Context, client: &Client, request: DeleteAclsRequest) -> DeleteAclsResponse {
    if let Some((code, message)) = refused(ctx, client, Operation::Alter) {
        let results = request
            .filters
            .iter()
            .map(|_| {
                DeleteAclsFilterResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(message.clone())))
            })
            .collect();
        return DeleteAclsResponse::default().with_filter_results(results);
    }
    // What another gateway created a moment ago is deleted too.
    reload(ctx).await;
    let matched: Vec<Result<Vec<AclBinding>, String>> = request
        .filters
        .iter()
        .map(|f| {
            AclFilter::from_codes(
                f.resource_type_filter,
                f.resource_name_filter.as_deref(),
                f.pattern_type_filter,
                f.principal_filter.as_deref(),
                f.host_filter.as_deref(),
                f.operation,
                f.permission_type,
            )
            .map(|filter| ctx.security.acls.matching(&filter))
            .map_err(|e| format!("Invalid ACL filter: {e}"))
        })
        .collect();
    let mut doomed: Vec<String> = matched
        .iter()
        .flatten()
        .flatten()
        .map(AclBinding::encode)
        .collect();
    doomed.sort();
    doomed.dedup();
    let removed = ctx.storage.remove_acls(&doomed).await.map(|_| ());
    if removed.is_ok() {
        reload(ctx).await;
        for b in matched.iter().flatten().flatten() {
            tracing::info!(principal = %client.principal, acl = ?b, "ACL deleted");
        }
    }
    let results = matched
        .into_iter()
        .map(|m| match (m, &removed) {
            (Err(message), _) => DeleteAclsFilterResult::default()
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(str_bytes(message))),
            (Ok(_), Err(e)) => DeleteAclsFilterResult::default()
                .with_error_code(error_code(e))
                .with_error_message(Some(str_bytes(e.to_string()))),
            (Ok(bindings), Ok(())) => DeleteAclsFilterResult::default().with_matching_acls(
                bindings
                    .into_iter()
                    .map(|b| {
                        DeleteAclsMatchingAcl::default()
                            .with_resource_type(b.resource_type.code())
                            .with_resource_name(str_bytes(b.name))
                            .with_pattern_type(b.pattern.code())
                            .with_principal(str_bytes(b.principal))
                            .with_host(str_bytes(b.host))
                            .with_operation(b.operation.code())
                            .with_permission_type(b.permission.code())
                    })
                    .collect(),
            ),
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}

/// Reads the ACLs from Redis into this gateway's authorizer (logged on
/// failure: the gateway keeps what it had, and the watcher tries again).
pub async fn reload(ctx: &Context) {
    if let Err(e) = ctx.security.acls.load(ctx.storage.acls()).await {
        tracing::warn!(error = %e, "cannot read the ACLs");
    }
}

/// Keeps this gateway's ACLs current (see [`crate::storage::keep_current`]).
/// Runs until shutdown.
pub async fn keep_current(ctx: std::sync::Arc<Context>) {
    let channel = ctx.storage.acl_channel();
    let kept = crate::storage::Kept {
        what: "ACLs",
        channel,
        stored: |ctx| ctx.storage.acl_version(),
        held: |ctx| ctx.security.acls.version(),
        load: |ctx| {
            Box::pin(async move {
                let (version, bindings) = ctx.security.acls.load(ctx.storage.acls()).await?;
                Ok(format!("{bindings} bindings, version {version}"))
            })
        },
        tick: |_| {},
        check_every: std::time::Duration::from_secs(5),
    };
    crate::storage::keep_current(ctx, kept).await
}
