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

/// The v0 answer to an ApiVersions request of a version ketch does not
/// know: UNSUPPORTED_VERSION and the versions of ApiVersions alone, as
/// Kafka's `ApiVersionsRequest.getErrorResponse` answers (the client asks
/// again at a version listed there).
pub fn unsupported_version_response(correlation_id: i32) -> Bytes {
    let mut answer = response(ResponseError::UnsupportedVersion.code());
    answer
        .api_keys
        .retain(|api| api.api_key == ApiKey::ApiVersions as i16);
    let body = ResponseKind::ApiVersions(answer);
    crate::server::encode_response(ApiKey::ApiVersions, 0, correlation_id, &body)
        .expect("ApiVersions v0 always encodes")
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::ResponseHeader;
    use kafka_protocol::protocol::Decodable;

    use super::*;

    #[test]
    fn an_unknown_version_is_told_the_versions_of_api_versions_alone() {
        let mut answer = unsupported_version_response(7);
        // Its size first.
        bytes::Buf::advance(&mut answer, 4);
        let header = ResponseHeader::decode(&mut answer, 0).expect("header");
        let answer = ApiVersionsResponse::decode(&mut answer, 0).expect("answer");
        assert_eq!((header.correlation_id, answer.error_code), (7, 35));
        let keys: Vec<i16> = answer.api_keys.iter().map(|k| k.api_key).collect();
        assert_eq!(keys, [ApiKey::ApiVersions as i16]);
    }

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
