//! `ketch users`: the SCRAM users SASL authenticates against (SCRAM-SHA-256,
//! SCRAM-SHA-512, and PLAIN, which checks the same credentials). Made here
//! for the first user (a super user, who then manages the others with
//! Kafka's AlterUserScramCredentials); only the salted keys reach Redis,
//! never the password.

use std::io::{BufRead, IsTerminal};

use anyhow::{Context as _, bail};
use clap::Subcommand;
use ketch_config::Settings;
use ketch_gateway::auth::scram::{Algorithm, Credential};
use ketch_storage::{ScramChange, Store, StoreConfig};

#[derive(Debug, Subcommand)]
pub enum Action {
    /// Create or replace a user's credentials; the password is read from
    /// standard input (its first line).
    Set {
        name: String,
        /// SCRAM-SHA-256 or SCRAM-SHA-512 (repeatable); default: both.
        #[arg(long = "mechanism", value_name = "MECHANISM")]
        mechanisms: Vec<String>,
        /// PBKDF2 iterations, 4096 to 16384 [default: sasl.scram_iterations].
        #[arg(long)]
        iterations: Option<u32>,
    },
    /// Users and their mechanisms and iterations.
    List,
    /// Delete a user's credentials (of one mechanism, or all).
    Delete {
        name: String,
        #[arg(long = "mechanism", value_name = "MECHANISM")]
        mechanisms: Vec<String>,
    },
}

fn algorithms(names: &[String]) -> anyhow::Result<Vec<Algorithm>> {
    if names.is_empty() {
        return Ok(vec![Algorithm::Sha256, Algorithm::Sha512]);
    }
    names
        .iter()
        .map(|n| {
            Algorithm::from_mechanism(&n.to_ascii_uppercase())
                .with_context(|| format!("unknown mechanism {n:?}: SCRAM-SHA-256 or SCRAM-SHA-512"))
        })
        .collect()
}

fn valid_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name.chars().any(char::is_control) {
        bail!("a user name is not empty and has no control characters");
    }
    Ok(())
}

/// The password: the first line of standard input, without its line end.
fn read_password() -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprintln!("password (input is shown; pipe it in to hide it):");
    }
    let mut line = String::new();
    stdin
        .lock()
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    let password = line.trim_end_matches(['\n', '\r']).to_owned();
    if password.is_empty() {
        bail!("the password is empty (it is read from standard input)");
    }
    Ok(password)
}

pub async fn run(settings: &Settings, action: Action) -> anyhow::Result<()> {
    let store = Store::new(&StoreConfig::from_settings(settings))?;
    match action {
        Action::Set {
            name,
            mechanisms,
            iterations,
        } => {
            valid_name(&name)?;
            let algorithms = algorithms(&mechanisms)?;
            let iterations = iterations.unwrap_or(settings.sasl.scram_iterations);
            if !(Credential::MIN_ITERATIONS..=Credential::MAX_ITERATIONS).contains(&iterations) {
                bail!(
                    "--iterations must be between {} and {}",
                    Credential::MIN_ITERATIONS,
                    Credential::MAX_ITERATIONS
                );
            }
            let password = read_password()?;
            // Every mechanism's in one write: a failure leaves none changed,
            // never the user with two passwords.
            let mut changes = Vec::new();
            for alg in &algorithms {
                let credential = Credential::generate(*alg, password.as_bytes(), iterations);
                changes.push(ScramChange::Set {
                    mechanism: alg.mechanism().to_owned(),
                    user: name.clone(),
                    credential: serde_json::to_string(&credential)?,
                });
            }
            store.alter_scram_credentials(&changes).await?;
            for alg in &algorithms {
                println!(
                    "set {} credentials of {name} ({iterations} iterations)",
                    alg.mechanism()
                );
            }
        }
        Action::List => {
            println!("user\tmechanism\titerations");
            for c in store.scram_credentials().await? {
                let iterations = serde_json::from_str::<Credential>(&c.credential)
                    .map_or_else(|_| "unreadable".to_owned(), |cred| cred.iterations().to_string());
                println!("{}\t{}\t{iterations}", c.user, c.mechanism);
            }
        }
        Action::Delete { name, mechanisms } => {
            // The ones the user has, deleted in one write.
            let mut changes = Vec::new();
            for alg in algorithms(&mechanisms)? {
                if store.scram_credential(alg.mechanism(), &name).await?.is_some() {
                    changes.push(ScramChange::Delete {
                        mechanism: alg.mechanism().to_owned(),
                        user: name.clone(),
                    });
                }
            }
            if changes.is_empty() {
                bail!("{name} has no such credentials");
            }
            store.alter_scram_credentials(&changes).await?;
            for change in &changes {
                if let ScramChange::Delete { mechanism, .. } = change {
                    println!("deleted {mechanism} credentials of {name}");
                }
            }
        }
    }
    Ok(())
}
