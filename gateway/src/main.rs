//! The `ketch` binary.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use ketch_config::{Loader, LogFormat, Settings};
use tokio::sync::watch;

mod segments;
mod users;

/// jemalloc maps memory with MAP_NORESERVE where the kernel overcommits, so
/// an absurd capacity read off the wire by the protocol decoder (it sizes
/// arrays from their length fields) reserves address space instead of
/// aborting the process; the decode then fails on the missing bytes and
/// frees it. See docs/architecture.md, "Untrusted lengths". Its options
/// (one arena: decision (z)) are compiled in from `.cargo/config.toml`.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// ketch — a Kafka-protocol gateway that keeps every partition in a Redis Stream.
#[derive(Debug, Parser)]
#[command(name = "ketch", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the Kafka protocol (and HTTP health endpoints).
    ///
    /// Settings are layered: defaults, then the TOML file given with
    /// --config, then KETCH_<SECTION>_<KEY> environment variables (for
    /// example KETCH_REDIS_URL, KETCH_TOPICS_AUTO_CREATE), then these flags.
    /// Every key is listed in docs/configuration.md.
    Serve(ServeArgs),
    /// Segments the archive could not write (quarantined): list them, have
    /// them archived again, or give up on them.
    ///
    /// Takes the same settings as `serve` (--config, KETCH_* variables,
    /// --redis-url, --set).
    Segments(SegmentsArgs),
    /// How many partitions of each topic every Redis Cluster master holds
    /// (in single mode, everything is on the one server).
    ///
    /// Takes the same settings as `serve` (--config, KETCH_* variables,
    /// --redis-url, --set redis.mode=cluster).
    Placement(PlacementArgs),
    /// SCRAM users for SASL (SCRAM-SHA-256/512 and PLAIN): set (password on
    /// standard input), list, delete.
    ///
    /// Takes the same settings as `serve` (--config, KETCH_* variables,
    /// --redis-url, --set redis.mode=cluster).
    Users(UsersArgs),
}

#[derive(Debug, Args)]
struct UsersArgs {
    #[command(flatten)]
    settings: SettingsArgs,
    #[command(subcommand)]
    action: users::Action,
}

#[derive(Debug, Args)]
struct PlacementArgs {
    #[command(flatten)]
    settings: SettingsArgs,
}

/// The settings every subcommand reads.
#[derive(Debug, Args)]
struct SettingsArgs {
    /// TOML settings file. An unknown key in it is an error.
    #[arg(long, short = 'c', value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// Redis URL, redis://[user:password@]host:port[/db], or with
    /// redis.mode=cluster seed nodes separated by commas [redis.url; default
    /// redis://127.0.0.1:6379].
    #[arg(long, value_name = "URL", global = true)]
    redis_url: Option<String>,
    /// Any other setting, as section.key=value (repeatable), e.g.
    /// --set topics.auto_create=false --set fetch.max_wait=10s.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE", global = true)]
    set: Vec<String>,
}

impl SettingsArgs {
    /// The layered settings, with `flags` (section, key, value) on top.
    fn load(&self, flags: &[(&str, &str, Option<String>)]) -> anyhow::Result<Settings> {
        let mut loader = Loader::new();
        if let Some(path) = &self.config {
            loader = loader.file(path)?;
        }
        loader = loader.env(std::env::vars())?;
        loader = loader.assignments(self.set.iter().map(String::as_str))?;
        if let Some(url) = &self.redis_url {
            loader = loader.set("redis", "url", url);
        }
        for (section, key, value) in flags {
            if let Some(value) = value {
                loader = loader.set(section, key, value);
            }
        }
        Ok(loader.load()?)
    }
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    settings: SettingsArgs,
    /// Kafka listener address [broker.listen; default 0.0.0.0:9092].
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Host advertised to clients in Metadata [broker.advertised_host; default: the listen host, or 127.0.0.1].
    #[arg(long, value_name = "HOST")]
    advertised_host: Option<String>,
    /// Port advertised to clients [broker.advertised_port; default: the listen port].
    #[arg(long, value_name = "PORT")]
    advertised_port: Option<u16>,
    /// HTTP listener: /health, /ready, /metrics, the admin API and the console [http.listen; default 127.0.0.1:9644].
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<String>,
    /// This gateway's node id [broker.id; default: the lowest id no live gateway holds, claimed in Redis].
    #[arg(long, value_name = "ID")]
    node_id: Option<i32>,
}

impl ServeArgs {
    fn settings(&self) -> anyhow::Result<Settings> {
        let flags: [(&str, &str, Option<String>); 5] = [
            ("broker", "listen", self.listen.clone()),
            ("broker", "advertised_host", self.advertised_host.clone()),
            (
                "broker",
                "advertised_port",
                self.advertised_port.map(|p| p.to_string()),
            ),
            ("http", "listen", self.http_listen.clone()),
            ("broker", "id", self.node_id.map(|id| id.to_string())),
        ];
        self.settings.load(&flags)
    }
}

#[derive(Debug, Args)]
struct SegmentsArgs {
    #[command(flatten)]
    settings: SettingsArgs,
    #[command(subcommand)]
    action: segments::Action,
}

fn init_logging(settings: &Settings) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&settings.log.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match settings.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Serve(args) => args,
        Command::Segments(args) => return segments_command(args),
        Command::Placement(args) => return placement_command(args),
        Command::Users(args) => {
            return admin_command("users", &args.settings, |settings| async move {
                users::run(&settings, args.action).await
            });
        }
    };
    let settings = match args.settings() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("ketch: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    init_logging(&settings);
    if let Err(e) = ketch_gateway::metrics::install() {
        eprintln!("ketch: cannot install the metrics recorder: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if settings.broker.worker_threads > 0 {
        runtime.worker_threads(settings.broker.worker_threads);
    }
    let runtime = runtime.enable_all().build().expect("tokio runtime");
    match runtime.block_on(serve(settings)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ketch: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs an admin subcommand: its settings loaded (exit 2 when they are
/// bad), then `run` on a runtime; its error is printed under `name`.
fn admin_command<F>(
    name: &str,
    settings: &SettingsArgs,
    run: impl FnOnce(Settings) -> F,
) -> std::process::ExitCode
where
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let settings = match settings.load(&[]) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("ketch: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    // Warnings on stderr (a change the Redis replicas did not confirm, a
    // record that cannot be read), plain text: a command's own output is
    // on stdout.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    match runtime.block_on(run(settings)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let text = format!("{e:#}");
            eprintln!("ketch {name}: {text}");
            if text.contains("MOVED") || text.contains("CROSSSLOT") {
                eprintln!(
                    "ketch {name}: the server is part of a Redis Cluster: add --set redis.mode=cluster"
                );
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn segments_command(args: SegmentsArgs) -> std::process::ExitCode {
    admin_command("segments", &args.settings, |settings| async move {
        segments::run(&settings, args.action).await
    })
}

fn placement_command(args: PlacementArgs) -> std::process::ExitCode {
    admin_command("placement", &args.settings, |settings| async move {
        let store = ketch_storage::Store::new(&ketch_storage::StoreConfig::from_settings(&settings))?;
        let placement = store.placement().await?;
        println!("master\ttopic\tpartitions");
        for (master, topics) in placement {
            for (topic, partitions) in topics {
                println!("{master}\t{topic}\t{partitions}");
            }
        }
        Ok(())
    })
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    // Installed before the listeners open, so a signal that arrives as soon
    // as ketch logs "serving" already shuts it down gracefully.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // SIGHUP reloads the TLS files (`auth::tls`, docs/security.md); by
    // default it ends a process, so one sent to every ketch (a deploy
    // hook) would kill those without TLS, undrained. Caught here, it never
    // does.
    let mut hangup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            tracing::info!(
                "SIGHUP received: it reloads the TLS files, when TLS is configured; it does not stop ketch"
            );
        }
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let delay = settings.broker.shutdown_delay.get();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        // Draining: `/ready` answers 503 while everything else still
        // serves, so a load balancer takes this gateway out before its
        // listeners close (its health check's interval × fall must be
        // below the delay). A second signal cuts it short.
        if !delay.is_zero() {
            ketch_gateway::DRAINING.store(true, std::sync::atomic::Ordering::SeqCst);
            tracing::info!(
                "signal received; /ready answers 503 for broker.shutdown_delay ({delay:?}) before shutting down (signal again to shut down now)"
            );
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    ketch_gateway::run(settings, stop_rx).await?;
    tracing::info!("ketch stopped");
    Ok(())
}
