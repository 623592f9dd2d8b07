//! A local S3-compatible server over a directory (s3s-fs), for the tiering
//! tests and the archive benchmark: `ketch-s3 --root DIR --listen ADDR
//! --bucket NAME [--access-key K --secret-key S]`. Buckets are directories
//! under the root; objects are files. Prints `ketch-s3 listening on
//! http://ADDR` once it accepts connections; SIGINT/SIGTERM stop it.
//!
//! GetObject reads the range asked for with one blocking read: s3s-fs
//! streams a file through tokio::fs 4 KiB at a time, a blocking-pool round
//! trip per 4 KiB, which cost more CPU than the ketch gateway reading from
//! it (and shared its cores: tests and benchmarks run both on one machine).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use s3s::auth::SimpleAuth;
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{Body, S3, S3Request, S3Response, S3Result, s3_error};
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
    let root = args
        .root
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", args.root.display()))?;
    let mut builder = S3ServiceBuilder::new(Objects { fs, root });
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

/// s3s-fs, with GetObject's body read at once.
struct Objects {
    fs: s3s_fs::FileSystem,
    root: PathBuf,
}

impl Objects {
    /// The file of an object, for a key s3s-fs accepted (one made only of
    /// plain path components; anything else keeps s3s-fs's own body).
    fn file(&self, bucket: &str, key: &str) -> Option<PathBuf> {
        let plain = |name: &str| {
            Path::new(name)
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
        };
        (plain(bucket) && plain(key)).then(|| self.root.join(bucket).join(key))
    }
}

/// The S3 service: GetObject read at once, every other operation listed
/// forwarded to s3s-fs.
macro_rules! objects_s3 {
    ($($op:ident: $input:ty => $output:ty;)*) => {
        #[async_trait::async_trait]
        impl S3 for Objects {
            $(
                async fn $op(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.fs.$op(req).await
                }
            )*

            async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
                self.get(req).await
            }
        }
    };
}

objects_s3! {
    create_bucket: CreateBucketInput => CreateBucketOutput;
    copy_object: CopyObjectInput => CopyObjectOutput;
    delete_bucket: DeleteBucketInput => DeleteBucketOutput;
    delete_object: DeleteObjectInput => DeleteObjectOutput;
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
    head_bucket: HeadBucketInput => HeadBucketOutput;
    head_object: HeadObjectInput => HeadObjectOutput;
    list_buckets: ListBucketsInput => ListBucketsOutput;
    list_objects: ListObjectsInput => ListObjectsOutput;
    list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
    put_object: PutObjectInput => PutObjectOutput;
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
    upload_part: UploadPartInput => UploadPartOutput;
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
    list_parts: ListPartsInput => ListPartsOutput;
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
}

impl Objects {
    /// s3s-fs's GetObject with the body read by one blocking read.
    async fn get(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let file = self.file(&req.input.bucket, &req.input.key);
        let range = req.input.range;
        // s3s-fs checks the request and answers everything but the body.
        let mut response = self.fs.get_object(req).await?;
        let (Some(file), Some(length)) = (file, response.output.content_length) else {
            return Ok(response);
        };
        let length = usize::try_from(length).map_err(|e| s3_error!(InternalError, "{e}"))?;
        let body = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let mut file = std::fs::File::open(file)?;
            match range {
                Some(Range::Int { first, .. }) => file.seek(SeekFrom::Start(first))?,
                Some(Range::Suffix { length }) => file.seek(SeekFrom::End(-(length as i64)))?,
                None => 0,
            };
            let mut body = vec![0; length];
            file.read_exact(&mut body)?;
            Ok(body)
        })
        .await
        .map_err(|e| s3_error!(InternalError, "{e}"))?
        .map_err(|e| s3_error!(InternalError, "reading the object: {e}"))?;
        response.output.body = Some(StreamingBlob::from(Body::from(body)));
        Ok(response)
    }
}
