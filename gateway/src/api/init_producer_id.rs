//! InitProducerId (v0–v5) for idempotent producers (KIP-98; KIP-360 lets a
//! producer bump its epoch after an error). Ids come from a Redis counter
//! shared by all gateways; each partition checks a producer's epoch and
//! sequences in the append script. Transactions are not supported: a
//! request with a transactional id is refused.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId, RequestHeader};

use super::{Client, cluster_authorized, error_code};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

pub async fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let response = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    if request.transactional_id.is_some() {
        return response.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    // An idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE
    // on some topic (KIP-679).
    let acls = &ctx.security.acls;
    if acls.enabled()
        && !cluster_authorized(ctx, client, Operation::IdempotentWrite)
        && !acls.authorize_any(
            &client.principal,
            &client.peer.ip().to_string(),
            Operation::Write,
            ResourceType::Topic,
        )
    {
        return response.with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    // KIP-360: an idempotent producer that hit an error bumps its epoch,
    // keeping its id while the epoch has room.
    if request.producer_id.0 >= 0 && request.producer_epoch >= 0 && request.producer_epoch < i16::MAX - 1 {
        return response
            .with_producer_id(request.producer_id)
            .with_producer_epoch(request.producer_epoch + 1);
    }
    match ctx.storage.new_producer_id().await {
        Ok(id) => response.with_producer_id(ProducerId(id)).with_producer_epoch(0),
        Err(e) => response.with_error_code(error_code(&e)),
    }
}
