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

pub fn handle(_ctx: &Context, header: &RequestHeader, request: ApiVersionsRequest) -> ApiVersionsResponse {
    if !valid(header.request_api_version, &request) {
        return ApiVersionsResponse::default().with_error_code(ResponseError::InvalidRequest.code());
    }
    response(0)
}

/// Whether the request is answered without an error: from v3 the client
/// names its software (KIP-511), and Kafka refuses a name or version that
/// is not letters, digits, `-` and `.` between a letter or digit at each
/// end.
pub fn valid(version: i16, request: &ApiVersionsRequest) -> bool {
    version < 3
        || software_name_valid(&request.client_software_name)
            && software_name_valid(&request.client_software_version)
}

/// Kafka's `[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?`.
fn software_name_valid(name: &str) -> bool {
    let bytes = name.as_bytes();
    let end = |b: &u8| b.is_ascii_alphanumeric();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            end(first) && end(last) && bytes.iter().all(|b| end(b) || *b == b'-' || *b == b'.')
        }
        _ => false,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn software_names_are_checked_as_kafka_checks_them() {
        for good in [
            "librdkafka",
            "apache-kafka-java",
            "2.14.0",
            "a",
            "confluent-kafka-python",
        ] {
            assert!(software_name_valid(good), "{good}");
        }
        for bad in ["", "my client", "-x", "x.", "2.0+git", "é"] {
            assert!(!software_name_valid(bad), "{bad}");
        }
    }
}
