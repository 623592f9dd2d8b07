//! ApiVersions (KIP-35, KIP-511): the APIs and versions ketch implements.
//!
//! A request whose version ketch does not know is answered at v0 with
//! UNSUPPORTED_VERSION and the supported list, so the client can retry with
//! a version both sides speak.

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseKind,
};

use super::SUPPORTED_APIS;
use crate::Context;

pub fn handle(_ctx: &Context, _header: &RequestHeader, _request: ApiVersionsRequest) -> ApiVersionsResponse {
    response(0)
}

fn response(error_code: i16) -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(error_code)
        .with_api_keys(
            SUPPORTED_APIS
                .iter()
                .map(|(key, min, max)| {
                    ApiVersion::default()
                        .with_api_key(*key as i16)
                        .with_min_version(*min)
                        .with_max_version(*max)
                })
                .collect(),
        )
}

/// The v0 answer to an ApiVersions request of a version ketch does not know.
pub fn unsupported_version_response(correlation_id: i32) -> Bytes {
    let body = ResponseKind::ApiVersions(response(ResponseError::UnsupportedVersion.code()));
    crate::server::encode_response(ApiKey::ApiVersions, 0, correlation_id, &body)
        .expect("ApiVersions v0 always encodes")
}
