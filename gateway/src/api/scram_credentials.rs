//! DescribeUserScramCredentials and AlterUserScramCredentials (API keys 50
//! and 51, KIP-554): the SCRAM users SASL authenticates against, kept in
//! Redis (salt, iterations, stored and server keys; never a password).
//! Describing takes DESCRIBE on the cluster, altering ALTER.

use std::collections::HashSet;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
};
use ketch_storage::{ScramChange, StoredCredential};

use super::{Client, cluster_authorized, error_code, str_bytes};
use crate::Context;
use crate::auth::acl::Operation;
use crate::auth::scram::{Algorithm, Credential};

pub async fn describe(
    ctx: &Context,
    client: &Client,
    request: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let response = DescribeUserScramCredentialsResponse::default();
    if !cluster_authorized(ctx, client, Operation::Describe) {
        return response
            .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
            .with_error_message(Some(str_bytes("Authorization failed.")));
    }
    let all = match ctx.storage.scram_credentials().await {
        Ok(all) => all,
        Err(e) => {
            return response
                .with_error_code(error_code(&e))
                .with_error_message(Some(str_bytes(e.to_string())));
        }
    };
    let info = |c: &StoredCredential| {
        let alg = Algorithm::from_mechanism(&c.mechanism)?;
        let credential: Credential = serde_json::from_str(&c.credential).ok()?;
        Some(
            CredentialInfo::default()
                .with_mechanism(alg.kafka_type())
                .with_iterations(credential.iterations() as i32),
        )
    };
    let of_user = |user: &str| -> Vec<CredentialInfo> {
        all.iter().filter(|c| c.user == user).filter_map(info).collect()
    };
    // Null or empty: every user (as Kafka reads it).
    let named = request.users.filter(|users| !users.is_empty());
    let results = match named {
        None => {
            let mut users: Vec<&str> = all.iter().map(|c| c.user.as_str()).collect();
            users.dedup();
            users
                .into_iter()
                .map(|user| {
                    DescribeUserScramCredentialsResult::default()
                        .with_user(str_bytes(user))
                        .with_credential_infos(of_user(user))
                })
                .collect()
        }
        Some(names) => {
            let mut seen = HashSet::new();
            let duplicated: HashSet<String> = names
                .iter()
                .filter(|n| !seen.insert(n.name.to_string()))
                .map(|n| n.name.to_string())
                .collect();
            let mut answered = HashSet::new();
            names
                .into_iter()
                .filter(|n| answered.insert(n.name.to_string()))
                .map(|n| {
                    let result = DescribeUserScramCredentialsResult::default().with_user(n.name.clone());
                    let infos = of_user(&n.name);
                    if duplicated.contains(n.name.as_str()) {
                        result
                            .with_error_code(ResponseError::DuplicateResource.code())
                            .with_error_message(Some(str_bytes(format!(
                                "Cannot describe SCRAM credentials for the same user twice in a single request: {}",
                                n.name.as_str()
                            ))))
                    } else if infos.is_empty() {
                        result
                            .with_error_code(ResponseError::ResourceNotFound.code())
                            .with_error_message(Some(str_bytes(format!(
                                "Attempt to describe a user credential that does not exist: {}",
                                n.name.as_str()
                            ))))
                    } else {
                        result.with_credential_infos(infos)
                    }
                })
                .collect()
        }
    };
    response.with_results(results)
}

/// Why one alteration is refused: (error, message).
type Refusal = (ResponseError, String);

pub async fn alter(
    ctx: &Context,
    client: &Client,
    request: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let allowed = cluster_authorized(ctx, client, Operation::Alter);
    // One alteration per user and request, as Kafka's controller takes
    // them (`ScramControlManager.alterCredentials`): deletions first, then
    // upsertions, each checked when met. A user named again after an
    // accepted alteration gets DUPLICATE_RESOURCE and nothing of it is
    // changed; one whose first alteration was refused keeps that error.
    // The accepted changes are then written in one atomic write: all of
    // them, or (Redis failing) none. One result per user.
    let alterations = request
        .deletions
        .iter()
        .map(|d| (d.name.as_str(), Alteration::Delete(d)))
        .chain(
            request
                .upsertions
                .iter()
                .map(|u| (u.name.as_str(), Alteration::Upsert(u))),
        );
    let mut users: Vec<(&str, Result<Option<ScramChange>, Refusal>)> = Vec::new();
    for (user, alteration) in alterations {
        match users.iter_mut().find(|(named, _)| *named == user) {
            Some((_, Err(_))) => {}
            Some((_, outcome)) => {
                *outcome = Err((
                    ResponseError::DuplicateResource,
                    format!("A user credential cannot be altered twice in the same request: {user}"),
                ));
            }
            None => {
                let change = match alteration {
                    Alteration::Delete(d) => deletion(ctx, allowed, d).await,
                    Alteration::Upsert(u) => upsertion(allowed, u),
                };
                users.push((user, change.map(Some)));
            }
        }
    }
    let changes: Vec<ScramChange> = users
        .iter_mut()
        .filter_map(|(_, outcome)| outcome.as_mut().ok().and_then(Option::take))
        .collect();
    let written = ctx.storage.alter_scram_credentials(&changes).await;
    for change in &changes {
        let (ScramChange::Set { mechanism, user, .. } | ScramChange::Delete { mechanism, user }) = change;
        match (&written, change) {
            (Err(_), _) => {}
            (Ok(()), ScramChange::Set { .. }) => {
                tracing::info!(principal = %client.principal, %user, mechanism, "SCRAM credential set");
            }
            (Ok(()), ScramChange::Delete { .. }) => {
                tracing::info!(principal = %client.principal, %user, mechanism, "SCRAM credential deleted");
            }
        }
    }
    let results = users
        .into_iter()
        .map(|(user, outcome)| {
            let outcome = outcome.and_then(|_| {
                written
                    .as_ref()
                    .map_err(|e| (ResponseError::KafkaStorageError, e.to_string()))
                    .copied()
            });
            let result = AlterUserScramCredentialsResult::default().with_user(str_bytes(user));
            match outcome {
                Ok(()) => result,
                Err((error, message)) => result
                    .with_error_code(error.code())
                    .with_error_message(Some(str_bytes(message))),
            }
        })
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}

/// One user's alteration in a request.
enum Alteration<'a> {
    Delete(&'a ScramCredentialDeletion),
    Upsert(&'a ScramCredentialUpsertion),
}

/// A deletion checked: RESOURCE_NOT_FOUND for a credential that does not
/// exist (read now; deleting one that went meanwhile changes nothing).
async fn deletion(ctx: &Context, allowed: bool, d: &ScramCredentialDeletion) -> Result<ScramChange, Refusal> {
    let alg = check(allowed, &d.name, d.mechanism)?;
    match ctx.storage.scram_credential(alg.mechanism(), &d.name).await {
        Ok(Some(_)) => Ok(ScramChange::Delete {
            mechanism: alg.mechanism().to_owned(),
            user: d.name.to_string(),
        }),
        Ok(None) => Err((
            ResponseError::ResourceNotFound,
            format!(
                "Attempt to delete a user credential that does not exist: {} {}",
                d.name.as_str(),
                alg.mechanism()
            ),
        )),
        Err(e) => Err((ResponseError::KafkaStorageError, e.to_string())),
    }
}

/// An upsertion checked, its credential derived.
fn upsertion(allowed: bool, u: &ScramCredentialUpsertion) -> Result<ScramChange, Refusal> {
    let alg = check(allowed, &u.name, u.mechanism)?;
    let iterations = u32::try_from(u.iterations).unwrap_or(0);
    if !(Credential::MIN_ITERATIONS..=Credential::MAX_ITERATIONS).contains(&iterations) {
        return Err((
            ResponseError::UnacceptableCredential,
            format!(
                "Iterations must be between {} and {}, not {}",
                Credential::MIN_ITERATIONS,
                Credential::MAX_ITERATIONS,
                u.iterations
            ),
        ));
    }
    if u.salt.is_empty() || u.salted_password.is_empty() {
        return Err((
            ResponseError::UnacceptableCredential,
            "The salt and the salted password must not be empty".to_owned(),
        ));
    }
    let credential = Credential::from_salted_password(alg, &u.salted_password, &u.salt, iterations);
    Ok(ScramChange::Set {
        mechanism: alg.mechanism().to_owned(),
        user: u.name.to_string(),
        credential: serde_json::to_string(&credential).expect("a credential serializes"),
    })
}

/// The checks every alteration passes first: ALTER on the cluster, a user
/// name, a known mechanism.
fn check(allowed: bool, user: &str, mechanism: i8) -> Result<Algorithm, Refusal> {
    check_user(allowed, user)?;
    Algorithm::from_kafka_type(mechanism).ok_or_else(|| {
        (
            ResponseError::UnsupportedSaslMechanism,
            format!("Unknown SCRAM mechanism {mechanism}"),
        )
    })
}

/// ALTER on the cluster, and a user name.
fn check_user(allowed: bool, user: &str) -> Result<(), Refusal> {
    if !allowed {
        return Err((
            ResponseError::ClusterAuthorizationFailed,
            "Authorization failed.".to_owned(),
        ));
    }
    if user.is_empty() {
        return Err((
            ResponseError::UnacceptableCredential,
            "Username must not be empty".to_owned(),
        ));
    }
    Ok(())
}
