//! A local S3-compatible server over a directory (s3s-fs), for the tiering
//! tests and the archive benchmark: `ketch-s3 --root DIR --listen ADDR
//! --bucket NAME [--access-key K --secret-key S]`. Buckets are directories
//! under the root; objects are files. Prints `ketch-s3 listening on
//! http://ADDR` once it accepts connections; SIGINT/SIGTERM stop it.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser, Debug)]
#[command(
    name = "ketch-s3",
    version,
    about = "A local S3-compatible server over a directory"
)]
struct Args {
    /// Directory holding the buckets.
    #[arg(long)]
    root: PathBuf,
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Buckets to create at start (directories under the root).
    #[arg(long)]
    bucket: Vec<String>,
    #[arg(long, requires = "secret_key")]
    access_key: Option<String>,
    #[arg(long, requires = "access_key")]
    secret_key: Option<String>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    for bucket in &args.bucket {
        std::fs::create_dir_all(args.root.join(bucket))
            .with_context(|| format!("cannot create bucket {bucket} under {}", args.root.display()))?;
    }
    let fs = s3s_fs::FileSystem::new(&args.root).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut builder = S3ServiceBuilder::new(fs);
    if let (Some(key), Some(secret)) = (args.access_key, args.secret_key) {
        builder.set_auth(SimpleAuth::from_single(key, secret));
    }
    let service = builder.build();
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    println!("ketch-s3 listening on http://{}", listener.local_addr()?);
    let http = Builder::new(TokioExecutor::new());
    let mut term = signal(SignalKind::terminate())?;
    loop {
        let (socket, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    eprintln!("ketch-s3: accept: {e}");
                    continue;
                }
            },
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = term.recv() => return Ok(()),
        };
        let connection = http
            .serve_connection(TokioIo::new(socket), service.clone())
            .into_owned();
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}
