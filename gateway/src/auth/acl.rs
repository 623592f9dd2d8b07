//! Kafka's ACL model and the authorizer every request is checked by.
//!
//! Semantics follow Apache Kafka's `StandardAuthorizer`: an ACL names a
//! resource pattern (type; LITERAL name, the LITERAL wildcard `*`, or a
//! PREFIXED name), a principal (or `User:*`), a host (or `*`), an operation
//! and ALLOW or DENY. A request is allowed when no matching DENY and at
//! least one matching ALLOW exist; ALLOW of READ, WRITE, DELETE or ALTER
//! implies DESCRIBE, and ALTER_CONFIGS implies DESCRIBE_CONFIGS. A resource
//! no ACL names at all is open only with
//! `acl.allow_everyone_if_no_acl_found`. Super users are allowed everything.
//!
//! The bindings live in Redis (`ketch:{security}:acls`); every gateway keeps
//! them in memory ([`Authorizer`]) and reloads them when any gateway
//! announces a change, so checking a request costs no Redis round trip.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

/// The cluster resource's only name.
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// The literal wildcard resource name and host.
pub const WILDCARD: &str = "*";

/// Kafka's `ResourceType` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceType {
    Topic,
    Group,
    Cluster,
    TransactionalId,
    /// Delegation tokens and users (their tokens): ketch has no delegation
    /// tokens, so ACLs on these are kept and listed but never checked.
    DelegationToken,
    User,
}

impl ResourceType {
    pub const ANY: i8 = 1;

    pub fn code(self) -> i8 {
        match self {
            ResourceType::Topic => 2,
            ResourceType::Group => 3,
            ResourceType::Cluster => 4,
            ResourceType::TransactionalId => 5,
            ResourceType::DelegationToken => 6,
            ResourceType::User => 7,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        Some(match code {
            2 => ResourceType::Topic,
            3 => ResourceType::Group,
            4 => ResourceType::Cluster,
            5 => ResourceType::TransactionalId,
            6 => ResourceType::DelegationToken,
            7 => ResourceType::User,
            _ => return None,
        })
    }

    /// The operations on a resource of this type (Kafka's
    /// `AclEntry.supportedOperations`): what an ACL on it may name besides
    /// ALL, and what authorised-operation bit sets report.
    pub fn operations(self) -> &'static [Operation] {
        use Operation::*;
        match self {
            ResourceType::Topic => &[
                Read,
                Write,
                Create,
                Delete,
                Alter,
                Describe,
                DescribeConfigs,
                AlterConfigs,
            ],
            ResourceType::Group => &[Read, Delete, Describe, DescribeConfigs, AlterConfigs],
            ResourceType::Cluster => &[
                Create,
                Alter,
                Describe,
                ClusterAction,
                DescribeConfigs,
                AlterConfigs,
                IdempotentWrite,
            ],
            ResourceType::TransactionalId => &[Write, Describe],
            ResourceType::DelegationToken => &[Describe],
            ResourceType::User => &[CreateTokens, DescribeTokens],
        }
    }
}

/// Kafka's `PatternType` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PatternType {
    Literal,
    Prefixed,
}

impl PatternType {
    pub const ANY: i8 = 1;
    pub const MATCH: i8 = 2;

    pub fn code(self) -> i8 {
        match self {
            PatternType::Literal => 3,
            PatternType::Prefixed => 4,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            3 => Some(PatternType::Literal),
            4 => Some(PatternType::Prefixed),
            _ => None,
        }
    }
}

/// Kafka's `AclOperation` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
    /// Of delegation tokens (on a USER resource): kept, never checked.
    CreateTokens,
    DescribeTokens,
}

impl Operation {
    pub const ANY: i8 = 1;

    pub fn code(self) -> i8 {
        match self {
            Operation::All => 2,
            Operation::Read => 3,
            Operation::Write => 4,
            Operation::Create => 5,
            Operation::Delete => 6,
            Operation::Alter => 7,
            Operation::Describe => 8,
            Operation::ClusterAction => 9,
            Operation::DescribeConfigs => 10,
            Operation::AlterConfigs => 11,
            Operation::IdempotentWrite => 12,
            Operation::CreateTokens => 13,
            Operation::DescribeTokens => 14,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        Some(match code {
            2 => Operation::All,
            3 => Operation::Read,
            4 => Operation::Write,
            5 => Operation::Create,
            6 => Operation::Delete,
            7 => Operation::Alter,
            8 => Operation::Describe,
            9 => Operation::ClusterAction,
            10 => Operation::DescribeConfigs,
            11 => Operation::AlterConfigs,
            12 => Operation::IdempotentWrite,
            13 => Operation::CreateTokens,
            14 => Operation::DescribeTokens,
            _ => return None,
        })
    }

    /// Whether an ALLOW ACL for `self` allows `requested`.
    fn allows(self, requested: Operation) -> bool {
        self == Operation::All
            || self == requested
            || requested == Operation::Describe
                && matches!(
                    self,
                    Operation::Read | Operation::Write | Operation::Delete | Operation::Alter
                )
            || requested == Operation::DescribeConfigs && self == Operation::AlterConfigs
    }

    /// Whether a DENY ACL for `self` denies `requested` (no implications).
    fn denies(self, requested: Operation) -> bool {
        self == Operation::All || self == requested
    }
}

/// Kafka's `AclPermissionType` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    Deny,
    Allow,
}

impl Permission {
    pub const ANY: i8 = 1;

    pub fn code(self) -> i8 {
        match self {
            Permission::Deny => 2,
            Permission::Allow => 3,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            2 => Some(Permission::Deny),
            3 => Some(Permission::Allow),
            _ => None,
        }
    }
}

/// One ACL: a resource pattern and an access control entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AclBinding {
    pub resource_type: ResourceType,
    pub name: String,
    pub pattern: PatternType,
    pub principal: String,
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

/// How a binding is stored: Kafka's codes, in a fixed field order so that
/// one binding always encodes to the same string (the hash field).
#[derive(Serialize, Deserialize)]
struct Stored {
    resource_type: i8,
    name: String,
    pattern: i8,
    principal: String,
    host: String,
    operation: i8,
    permission: i8,
}

/// Why an ACL cannot be created (Kafka answers INVALID_REQUEST with this).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidAcl {
    #[error("unknown resource type {0}")]
    ResourceType(i8),
    #[error("the pattern type must be LITERAL or PREFIXED, not {0}")]
    PatternType(i8),
    #[error("unknown operation {0}")]
    Operation(i8),
    #[error("the permission type must be ALLOW or DENY, not {0}")]
    Permission(i8),
    #[error("the resource name must not be empty")]
    EmptyName,
    #[error("the only valid name for the CLUSTER resource is {CLUSTER_NAME}")]
    ClusterName,
    #[error("principal `{0}` is not of the form Type:name")]
    Principal(String),
    #[error("the host must not be empty (`*` is any host)")]
    EmptyHost,
}

/// Whether `principal` is `Type:name` with both parts present.
pub fn valid_principal(principal: &str) -> bool {
    principal
        .split_once(':')
        .is_some_and(|(kind, name)| !kind.is_empty() && !name.is_empty())
}

impl AclBinding {
    /// A binding from a CreateAcls entry's fields, validated as Kafka does
    /// (which takes any operation on any resource type: an ACL no request
    /// checks is stored and listed, never used), and stricter on the
    /// principal, which must name its type.
    pub fn from_codes(
        resource_type: i8,
        name: &str,
        pattern: i8,
        principal: &str,
        host: &str,
        operation: i8,
        permission: i8,
    ) -> Result<Self, InvalidAcl> {
        let resource_type =
            ResourceType::from_code(resource_type).ok_or(InvalidAcl::ResourceType(resource_type))?;
        let pattern = PatternType::from_code(pattern).ok_or(InvalidAcl::PatternType(pattern))?;
        let operation = Operation::from_code(operation).ok_or(InvalidAcl::Operation(operation))?;
        let permission = Permission::from_code(permission).ok_or(InvalidAcl::Permission(permission))?;
        if name.is_empty() {
            return Err(InvalidAcl::EmptyName);
        }
        if resource_type == ResourceType::Cluster && name != CLUSTER_NAME {
            return Err(InvalidAcl::ClusterName);
        }
        if !valid_principal(principal) {
            return Err(InvalidAcl::Principal(principal.to_owned()));
        }
        if host.is_empty() {
            return Err(InvalidAcl::EmptyHost);
        }
        Ok(Self {
            resource_type,
            name: name.to_owned(),
            pattern,
            principal: principal.to_owned(),
            host: host.to_owned(),
            operation,
            permission,
        })
    }

    /// The string stored in Redis.
    pub fn encode(&self) -> String {
        serde_json::to_string(&Stored {
            resource_type: self.resource_type.code(),
            name: self.name.clone(),
            pattern: self.pattern.code(),
            principal: self.principal.clone(),
            host: self.host.clone(),
            operation: self.operation.code(),
            permission: self.permission.code(),
        })
        .expect("a binding serializes")
    }

    /// A stored binding; `None` when it is not one (logged by the caller).
    pub fn decode(stored: &str) -> Option<Self> {
        let s: Stored = serde_json::from_str(stored).ok()?;
        Self::from_codes(
            s.resource_type,
            &s.name,
            s.pattern,
            &s.principal,
            &s.host,
            s.operation,
            s.permission,
        )
        .ok()
    }

    /// Whether this binding's pattern covers the resource `name` (what
    /// [`Snapshot::covering`] finds by looking names up).
    #[cfg(test)]
    fn covers(&self, name: &str) -> bool {
        match self.pattern {
            PatternType::Literal => self.name == name || self.name == WILDCARD,
            PatternType::Prefixed => name.starts_with(&self.name),
        }
    }

    fn applies_to(&self, principal: &str, host: &str) -> bool {
        (self.principal == principal || self.principal == "User:*") && host_matches(&self.host, host)
    }
}

/// Whether an ACL's host covers a client's address: `*`, the same text,
/// or the same address however written. Kafka compares the ACL's text with
/// Java's form of the address, which gives an IPv4 client of a dual-stack
/// listener as plain IPv4 and IPv6 uncompressed; comparing addresses
/// matches both Java's forms and the usual ones.
fn host_matches(acl_host: &str, client: &str) -> bool {
    use std::net::IpAddr;
    acl_host == WILDCARD
        || acl_host == client
        || match (acl_host.parse::<IpAddr>(), client.parse::<IpAddr>()) {
            (Ok(acl), Ok(client)) => acl.to_canonical() == client.to_canonical(),
            _ => false,
        }
}

/// A DescribeAcls or DeleteAcls filter.
#[derive(Debug, Clone)]
pub struct AclFilter {
    /// `None`: any resource type.
    pub resource_type: Option<ResourceType>,
    pub name: Option<String>,
    pub pattern: PatternFilter,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Option<Operation>,
    pub permission: Option<Permission>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternFilter {
    Any,
    /// Bindings that would apply to the filter's (literal) name.
    Match,
    Exactly(PatternType),
}

impl AclFilter {
    /// A filter from a request's fields; `Err` names what is invalid.
    pub fn from_codes(
        resource_type: i8,
        name: Option<&str>,
        pattern: i8,
        principal: Option<&str>,
        host: Option<&str>,
        operation: i8,
        permission: i8,
    ) -> Result<Self, InvalidAcl> {
        let resource_type = match resource_type {
            ResourceType::ANY => None,
            code => Some(ResourceType::from_code(code).ok_or(InvalidAcl::ResourceType(code))?),
        };
        let pattern = match pattern {
            PatternType::ANY => PatternFilter::Any,
            PatternType::MATCH => PatternFilter::Match,
            code => {
                PatternFilter::Exactly(PatternType::from_code(code).ok_or(InvalidAcl::PatternType(code))?)
            }
        };
        let operation = match operation {
            Operation::ANY => None,
            code => Some(Operation::from_code(code).ok_or(InvalidAcl::Operation(code))?),
        };
        let permission = match permission {
            Permission::ANY => None,
            code => Some(Permission::from_code(code).ok_or(InvalidAcl::Permission(code))?),
        };
        Ok(Self {
            resource_type,
            name: name.map(str::to_owned),
            pattern,
            principal: principal.map(str::to_owned),
            host: host.map(str::to_owned),
            operation,
            permission,
        })
    }

    pub fn matches(&self, b: &AclBinding) -> bool {
        let name_matches = match (&self.name, self.pattern) {
            (None, _) => true,
            (Some(name), PatternFilter::Match) => match b.pattern {
                PatternType::Literal => b.name == *name || b.name == WILDCARD,
                PatternType::Prefixed => name.starts_with(&b.name),
            },
            (Some(name), _) => b.name == *name,
        };
        let pattern_matches = match self.pattern {
            PatternFilter::Any => true,
            // MATCH with no name: every literal and prefixed binding.
            PatternFilter::Match => true,
            PatternFilter::Exactly(p) => b.pattern == p,
        };
        self.resource_type.is_none_or(|t| t == b.resource_type)
            && name_matches
            && pattern_matches
            && self.principal.as_ref().is_none_or(|p| *p == b.principal)
            && self.host.as_ref().is_none_or(|h| *h == b.host)
            && self.operation.is_none_or(|o| o == b.operation)
            && self.permission.is_none_or(|p| p == b.permission)
    }
}

/// The bindings one gateway knows, as of one ACL version.
#[derive(Debug, Default)]
struct Snapshot {
    version: u64,
    bindings: Vec<AclBinding>,
    /// Positions in `bindings`, by resource type and pattern type, then by
    /// the name or prefix they name: a check looks up the resource's name,
    /// the wildcard and its prefixes, instead of going over every binding
    /// (thousands of topics with an ACL or two each made every produce and
    /// fetch of every topic scan them all), as Kafka's authorizer looks
    /// its ACLs up by resource.
    by_name: HashMap<(ResourceType, PatternType), HashMap<String, Vec<usize>>>,
    /// The lengths of the prefixes bindings name, by resource type: only
    /// prefixes of those lengths are looked up.
    prefix_lengths: HashMap<ResourceType, std::collections::BTreeSet<usize>>,
}

impl Snapshot {
    fn new(version: u64, bindings: Vec<AclBinding>) -> Self {
        let mut by_name: HashMap<(ResourceType, PatternType), HashMap<String, Vec<usize>>> = HashMap::new();
        let mut prefix_lengths: HashMap<ResourceType, std::collections::BTreeSet<usize>> = HashMap::new();
        for (i, b) in bindings.iter().enumerate() {
            (by_name.entry((b.resource_type, b.pattern)).or_default())
                .entry(b.name.clone())
                .or_default()
                .push(i);
            if b.pattern == PatternType::Prefixed {
                prefix_lengths
                    .entry(b.resource_type)
                    .or_default()
                    .insert(b.name.len());
            }
        }
        Self {
            version,
            bindings,
            by_name,
            prefix_lengths,
        }
    }

    /// The bindings of `resource_type` whose pattern covers `name`
    /// ([`AclBinding::covers`]): its literal name, the literal wildcard,
    /// and the prefixes of it.
    fn covering<'a>(
        &'a self,
        resource_type: ResourceType,
        name: &'a str,
    ) -> impl Iterator<Item = &'a AclBinding> {
        let literal = self.by_name.get(&(resource_type, PatternType::Literal));
        let prefixed = self.by_name.get(&(resource_type, PatternType::Prefixed));
        let literal_names = std::iter::once(name).chain((name != WILDCARD).then_some(WILDCARD));
        let prefixes = (self.prefix_lengths.get(&resource_type).into_iter().flatten())
            .filter_map(move |&len| name.get(..len));
        let found = literal_names
            .filter_map(move |n| literal.and_then(|m| m.get(n)))
            .chain(prefixes.filter_map(move |p| prefixed.and_then(|m| m.get(p))));
        found.flatten().map(|&i| &self.bindings[i])
    }
}

/// Checks requests against the ACLs; cheap to clone.
#[derive(Clone)]
pub struct Authorizer {
    enabled: bool,
    super_users: Arc<Vec<String>>,
    allow_if_no_acl: bool,
    snapshot: Arc<RwLock<Arc<Snapshot>>>,
    /// True once the ACLs have been read from Redis: until then no request
    /// of a principal other than a super user is served.
    loaded: Arc<std::sync::atomic::AtomicBool>,
    /// Held while the ACLs are read and installed, so that of two loads
    /// the one that read last installs last (the snapshot never goes back
    /// to an older set).
    loading: Arc<tokio::sync::Mutex<()>>,
}

impl Authorizer {
    pub fn new(settings: &ketch_config::AclSettings) -> Self {
        Self {
            enabled: settings.enabled,
            super_users: Arc::new(
                settings
                    .super_users
                    .iter()
                    .map(|u| ketch_config::security::normalize_principal(u))
                    .collect(),
            ),
            allow_if_no_acl: settings.allow_everyone_if_no_acl_found,
            snapshot: Arc::default(),
            loaded: Arc::default(),
            loading: Arc::default(),
        }
    }

    /// Whether requests of `principal` may be served: ACLs off, a super
    /// user, or the ACLs loaded.
    pub fn ready_for(&self, principal: &str) -> bool {
        !self.enabled
            || self.loaded.load(std::sync::atomic::Ordering::Acquire)
            || self.is_super_user(principal)
    }

    /// Reads the ACLs with `read` and installs them, one load at a time;
    /// returns the version and the number of bindings read.
    pub async fn load<F, E>(&self, read: F) -> Result<(u64, usize), E>
    where
        F: std::future::Future<Output = Result<(u64, Vec<String>), E>>,
    {
        let _one = self.loading.lock().await;
        let (version, bindings) = read.await?;
        self.replace(version, &bindings);
        Ok((version, bindings.len()))
    }

    /// Whether requests are checked at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn is_super_user(&self, principal: &str) -> bool {
        self.super_users.iter().any(|s| s == principal)
    }

    /// The ACL version this gateway holds.
    pub fn version(&self) -> u64 {
        self.snapshot.read().expect("acl lock").version
    }

    /// Replaces the bindings with those read from Redis at `version`.
    pub fn replace(&self, version: u64, stored: &[String]) {
        let mut bindings = Vec::with_capacity(stored.len());
        for s in stored {
            match AclBinding::decode(s) {
                Some(b) => bindings.push(b),
                None => tracing::warn!(binding = %s, "ignoring an ACL binding this gateway cannot read"),
            }
        }
        *self.snapshot.write().expect("acl lock") = Arc::new(Snapshot::new(version, bindings));
        self.loaded.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Every binding a filter matches.
    pub fn matching(&self, filter: &AclFilter) -> Vec<AclBinding> {
        let snapshot = self.snapshot.read().expect("acl lock").clone();
        snapshot
            .bindings
            .iter()
            .filter(|b| filter.matches(b))
            .cloned()
            .collect()
    }

    /// The bindings to check `principal` against, or the answer without
    /// them: allowed with ACLs off or for a super user, refused before the
    /// ACLs were first loaded.
    fn bindings_for(&self, principal: &str) -> Result<Arc<Snapshot>, bool> {
        if !self.enabled || self.is_super_user(principal) {
            return Err(true);
        }
        if !self.loaded.load(std::sync::atomic::Ordering::Acquire) {
            return Err(false);
        }
        Ok(self.snapshot.read().expect("acl lock").clone())
    }

    /// Whether `principal` connecting from `host` may perform `op` on the
    /// resource.
    pub fn authorize(
        &self,
        principal: &str,
        host: &str,
        op: Operation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        let snapshot = match self.bindings_for(principal) {
            Ok(snapshot) => snapshot,
            Err(decided) => return decided,
        };
        let mut any_for_resource = false;
        let mut allowed = false;
        for b in snapshot.covering(resource_type, name) {
            any_for_resource = true;
            if !b.applies_to(principal, host) {
                continue;
            }
            match b.permission {
                Permission::Deny if b.operation.denies(op) => return false,
                Permission::Allow if b.operation.allows(op) => allowed = true,
                _ => {}
            }
        }
        allowed || !any_for_resource && self.allow_if_no_acl
    }

    /// Whether `principal` may perform `op` on some resource of
    /// `resource_type`, as InitProducerId checks idempotent producers (WRITE
    /// on any topic): Kafka's `authorizeByResourceType`. A resource no ACL
    /// names (checked as Kafka does, by the name `hardcode`) allows it
    /// under `acl.allow_everyone_if_no_acl_found`; otherwise an ALLOW of
    /// the operation (or ALL) on the literal `*`, or on a name or prefix no
    /// DENY covers: a DENY of the same literal name, of a prefix of it, or
    /// of the literal `*`, which denies everything.
    pub fn authorize_any(
        &self,
        principal: &str,
        host: &str,
        op: Operation,
        resource_type: ResourceType,
    ) -> bool {
        if self.authorize(principal, host, op, resource_type, "hardcode") {
            return true;
        }
        let snapshot = match self.bindings_for(principal) {
            Ok(snapshot) => snapshot,
            Err(decided) => return decided,
        };
        let mut denied: HashSet<(PatternType, &str)> = HashSet::new();
        let mut allowed: Vec<(PatternType, &str)> = Vec::new();
        let mut allowed_everywhere = false;
        for b in snapshot.bindings.iter().filter(|b| {
            b.resource_type == resource_type
                && b.applies_to(principal, host)
                && (b.operation == op || b.operation == Operation::All)
        }) {
            let wildcard = b.pattern == PatternType::Literal && b.name == WILDCARD;
            match b.permission {
                Permission::Deny if wildcard => return false,
                Permission::Deny => {
                    denied.insert((b.pattern, &b.name));
                }
                Permission::Allow if wildcard => allowed_everywhere = true,
                Permission::Allow => allowed.push((b.pattern, &b.name)),
            }
        }
        allowed_everywhere
            || allowed.iter().any(|&(pattern, name)| {
                let literal_denied =
                    pattern == PatternType::Literal && denied.contains(&(PatternType::Literal, name));
                let prefix_denied = name
                    .char_indices()
                    .map(|(i, c)| &name[..i + c.len_utf8()])
                    .any(|prefix| denied.contains(&(PatternType::Prefixed, prefix)));
                !literal_denied && !prefix_denied
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lookup_finds_the_bindings_a_scan_finds() {
        let b = |resource_type, name: &str, pattern| AclBinding {
            resource_type,
            name: name.to_owned(),
            pattern,
            principal: "User:alice".to_owned(),
            host: WILDCARD.to_owned(),
            operation: Operation::Read,
            permission: Permission::Allow,
        };
        use PatternType::{Literal, Prefixed};
        use ResourceType::{Group, Topic};
        let bindings = vec![
            b(Topic, "a", Literal),
            b(Topic, "a", Literal),
            b(Topic, WILDCARD, Literal),
            b(Topic, "", Prefixed),
            b(Topic, "a", Prefixed),
            b(Topic, "ab", Prefixed),
            b(Topic, "é", Prefixed),
            b(Topic, "abc", Literal),
            b(Group, "a", Literal),
            b(Group, "a", Prefixed),
        ];
        let snapshot = Snapshot::new(1, bindings.clone());
        for resource_type in [Topic, Group, ResourceType::Cluster] {
            for name in ["a", "ab", "abc", "abd", "b", WILDCARD, "é", "éa", "", "e"] {
                let mut scanned: Vec<&AclBinding> = bindings
                    .iter()
                    .filter(|b| b.resource_type == resource_type && b.covers(name))
                    .collect();
                let mut found: Vec<&AclBinding> = snapshot.covering(resource_type, name).collect();
                scanned.sort_by_key(|b| (b.name.clone(), b.pattern.code()));
                found.sort_by_key(|b| (b.name.clone(), b.pattern.code()));
                assert_eq!(found, scanned, "{resource_type:?} {name:?}");
            }
        }
    }

    fn acl(
        resource_type: ResourceType,
        name: &str,
        pattern: PatternType,
        principal: &str,
        op: Operation,
        permission: Permission,
    ) -> AclBinding {
        AclBinding {
            resource_type,
            name: name.to_owned(),
            pattern,
            principal: principal.to_owned(),
            host: WILDCARD.to_owned(),
            operation: op,
            permission,
        }
    }

    fn acl_from(
        resource_type: ResourceType,
        name: &str,
        principal: &str,
        host: &str,
        op: Operation,
        permission: Permission,
    ) -> AclBinding {
        AclBinding {
            host: host.to_owned(),
            ..acl(
                resource_type,
                name,
                PatternType::Literal,
                principal,
                op,
                permission,
            )
        }
    }

    fn authorizer(allow_if_no_acl: bool, bindings: &[AclBinding]) -> Authorizer {
        let a = Authorizer::new(&ketch_config::AclSettings {
            enabled: true,
            super_users: vec!["admin".to_owned()],
            allow_everyone_if_no_acl_found: allow_if_no_acl,
        });
        let stored: Vec<String> = bindings.iter().map(AclBinding::encode).collect();
        a.replace(1, &stored);
        a
    }

    use Operation::*;
    use PatternType::*;
    use Permission::*;
    use ResourceType::*;

    #[test]
    fn allow_deny_wildcards_prefixes_and_implied_describe() {
        let a = authorizer(
            false,
            &[
                acl(Topic, "orders", Literal, "User:alice", Read, Allow),
                acl(Topic, "logs-", Prefixed, "User:*", Write, Allow),
                acl(Topic, "logs-secret", Literal, "User:bob", All, Deny),
                acl(Group, "*", Literal, "User:alice", Read, Allow),
            ],
        );
        let ok = |p: &str, op, t, n: &str| a.authorize(p, "10.0.0.1", op, t, n);
        assert!(ok("User:alice", Read, Topic, "orders"));
        assert!(
            ok("User:alice", Describe, Topic, "orders"),
            "READ implies DESCRIBE"
        );
        assert!(!ok("User:alice", Write, Topic, "orders"));
        assert!(!ok("User:bob", Read, Topic, "orders"));
        assert!(ok("User:bob", Write, Topic, "logs-app"), "prefix, any user");
        assert!(!ok("User:bob", Write, Topic, "logs-secret"), "DENY wins");
        assert!(ok("User:carol", Write, Topic, "logs-secret"));
        assert!(ok("User:alice", Read, Group, "anything"), "literal wildcard");
        assert!(!ok("User:alice", Delete, Group, "anything"));
        assert!(
            !ok("User:alice", Read, Topic, "unnamed"),
            "no ACL, not allowed by default"
        );
        assert!(ok("User:admin", Delete, Cluster, CLUSTER_NAME), "super user");
    }

    #[test]
    fn allow_everyone_if_no_acl_found_opens_only_resources_without_acls() {
        let a = authorizer(true, &[acl(Topic, "orders", Literal, "User:alice", Read, Allow)]);
        assert!(a.authorize("User:bob", "h", Write, Topic, "other"));
        assert!(!a.authorize("User:bob", "h", Read, Topic, "orders"));
    }

    #[test]
    fn hosts_must_match_unless_wildcard() {
        let mut b = acl(Topic, "t", Literal, "User:alice", Read, Allow);
        b.host = "10.0.0.1".to_owned();
        let a = authorizer(false, &[b]);
        assert!(a.authorize("User:alice", "10.0.0.1", Read, Topic, "t"));
        assert!(!a.authorize("User:alice", "10.0.0.2", Read, Topic, "t"));
    }

    #[test]
    fn nothing_but_super_users_before_the_acls_are_loaded() {
        let a = Authorizer::new(&ketch_config::AclSettings {
            enabled: true,
            super_users: vec!["User:admin".to_owned()],
            allow_everyone_if_no_acl_found: true,
        });
        assert!(!a.authorize("User:x", "h", Read, Topic, "t"));
        assert!(a.authorize("User:admin", "h", Read, Topic, "t"));
        a.replace(1, &[]);
        assert!(a.authorize("User:x", "h", Read, Topic, "t"));
    }

    #[test]
    fn write_on_any_topic() {
        let a = authorizer(false, &[acl(Topic, "t-", Prefixed, "User:alice", Write, Allow)]);
        assert!(a.authorize_any("User:alice", "h", Write, Topic));
        assert!(!a.authorize_any("User:bob", "h", Write, Topic));
        let a = authorizer(
            false,
            &[
                acl(Topic, "t-", Prefixed, "User:alice", Write, Allow),
                acl(Topic, "*", Literal, "User:alice", Write, Deny),
            ],
        );
        assert!(!a.authorize_any("User:alice", "h", Write, Topic));
        // A prefix denied covers the allowed prefix it starts; a literal
        // denied only the same literal.
        let a = authorizer(
            false,
            &[
                acl(Topic, "t-", Prefixed, "User:alice", Write, Allow),
                acl(Topic, "t", Prefixed, "User:alice", Write, Deny),
            ],
        );
        assert!(!a.authorize_any("User:alice", "h", Write, Topic));
        let a = authorizer(
            false,
            &[
                acl(Topic, "t-1", Literal, "User:alice", Write, Allow),
                acl(Topic, "t-1", Literal, "User:alice", All, Deny),
                acl(Topic, "t-2", Literal, "User:alice", All, Allow),
                acl(Topic, "t-", Literal, "User:alice", Write, Deny),
            ],
        );
        assert!(a.authorize_any("User:alice", "h", Write, Topic), "t-2");
        // With allow-everyone, a principal may write where no ACL names
        // the topic, whatever other topics' and the cluster's ACLs say.
        let a = authorizer(
            true,
            &[
                acl(Topic, "secret", Literal, "User:bob", Read, Allow),
                acl(Cluster, CLUSTER_NAME, Literal, "User:bob", Describe, Allow),
            ],
        );
        assert!(a.authorize_any("User:alice", "h", Write, Topic));
    }

    #[test]
    fn hosts_match_by_address_however_written() {
        let a = authorizer(
            false,
            &[
                acl_from(Topic, "t", "User:alice", "10.0.0.5", Read, Deny),
                acl_from(Topic, "t", "User:alice", "2001:db8:0:0:0:0:0:5", Read, Allow),
                acl_from(Topic, "t", "User:alice", "*", Describe, Allow),
            ],
        );
        assert!(!a.authorize("User:alice", "::ffff:10.0.0.5", Read, Topic, "t"));
        assert!(a.authorize("User:alice", "::ffff:10.0.0.5", Describe, Topic, "t"));
        assert!(a.authorize("User:alice", "2001:db8::5", Read, Topic, "t"));
        assert!(!a.authorize("User:alice", "2001:db8::6", Read, Topic, "t"));
    }

    #[test]
    fn the_operations_of_each_resource_type_are_kafkas() {
        // What a Kafka broker without an authorizer reports as authorised
        // operations (bit n: operation code n).
        let bits = |t: ResourceType| t.operations().iter().fold(0, |b, op| b | 1 << op.code());
        assert_eq!(bits(Group), 0b1101_0100_1000);
        assert_eq!(bits(Cluster), 0b1_1111_1010_0000);
        assert_eq!(bits(Topic), 0b1101_1111_1000);
    }

    #[test]
    fn invalid_bindings_are_refused_with_a_reason() {
        let e = AclBinding::from_codes(4, "other", 3, "User:a", "*", 7, 3).unwrap_err();
        assert_eq!(e, InvalidAcl::ClusterName);
        // Kafka takes any operation on any resource type, and a prefixed
        // cluster ACL.
        assert!(AclBinding::from_codes(3, "g", 3, "User:a", "*", 4, 3).is_ok());
        assert!(AclBinding::from_codes(4, CLUSTER_NAME, 4, "User:a", "*", 7, 3).is_ok());
        let e = AclBinding::from_codes(2, "t", 3, "alice", "*", 3, 3).unwrap_err();
        assert!(matches!(e, InvalidAcl::Principal(_)));
        let e = AclBinding::from_codes(2, "t", 1, "User:a", "*", 3, 3).unwrap_err();
        assert_eq!(e, InvalidAcl::PatternType(1));
        let b = AclBinding::from_codes(2, "t", 4, "User:a", "*", 3, 2).unwrap();
        assert_eq!(AclBinding::decode(&b.encode()), Some(b));
    }

    #[test]
    fn filters_match_by_every_field_and_match_patterns_by_what_applies() {
        let bindings = [
            acl(Topic, "orders", Literal, "User:a", Read, Allow),
            acl(Topic, "ord", Prefixed, "User:b", Write, Allow),
            acl(Topic, "*", Literal, "User:c", Read, Deny),
            acl(Group, "orders", Literal, "User:a", Read, Allow),
        ];
        let a = authorizer(false, &bindings);
        let f = AclFilter::from_codes(2, Some("orders"), PatternType::MATCH, None, None, 1, 1).unwrap();
        assert_eq!(a.matching(&f).len(), 3);
        let f = AclFilter::from_codes(2, Some("orders"), 3, None, None, 1, 1).unwrap();
        assert_eq!(a.matching(&f), vec![bindings[0].clone()]);
        let f = AclFilter::from_codes(1, None, 1, Some("User:a"), None, 1, 1).unwrap();
        assert_eq!(a.matching(&f).len(), 2);
        let f = AclFilter::from_codes(1, None, 1, None, None, 1, 2).unwrap();
        assert_eq!(a.matching(&f), vec![bindings[2].clone()]);
        // DELEGATION_TOKEN and USER filters are valid; no binding here is
        // of either.
        for resource_type in [6, 7] {
            let f = AclFilter::from_codes(resource_type, None, 1, None, None, 1, 1).unwrap();
            assert!(a.matching(&f).is_empty());
        }
        assert!(AclFilter::from_codes(8, None, 1, None, None, 1, 1).is_err());
        // Kafka's ACLs on a user's delegation tokens are kept and listed.
        let tokens = AclBinding::from_codes(7, "User:bob", 3, "User:alice", "*", 13, 3).unwrap();
        assert_eq!(AclBinding::decode(&tokens.encode()), Some(tokens.clone()));
        let a = authorizer(false, std::slice::from_ref(&tokens));
        let f = AclFilter::from_codes(7, None, 1, None, None, 13, 1).unwrap();
        assert_eq!(a.matching(&f), vec![tokens]);
        let f = AclFilter::from_codes(1, None, 1, None, None, 14, 1).unwrap();
        assert!(a.matching(&f).is_empty());
        assert!(AclFilter::from_codes(1, None, 1, None, None, 15, 1).is_err());
    }
}
