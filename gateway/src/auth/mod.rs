//! Authentication and authorisation: TLS and mTLS, SASL (SCRAM, PLAIN,
//! OAUTHBEARER) and ACLs.

pub mod jwt;
pub mod oauthbearer;
pub mod scram;
pub mod x509;
