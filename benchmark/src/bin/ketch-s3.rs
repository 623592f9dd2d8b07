//! A local S3-compatible server over a directory (s3s-fs), for the tiering
//! tests and the archive benchmark: `ketch-s3 --root DIR --listen ADDR
//! --bucket NAME [--access-key K --secret-key S]`. Buckets are directories
//! under the root; objects are files. Prints `ketch-s3 listening on
//! http://ADDR` once it accepts connections; SIGINT/SIGTERM stop it.
//!
//! Tests and benchmarks run this server on the machine, and the cores, of
//! the gateways they measure, so three operations are its own rather than
//! s3s-fs's, which cost more CPU than the gateway talking to them:
//!
//! - GetObject reads the range asked for with one blocking read (s3s-fs
//!   streams a file through tokio::fs 4 KiB at a time, a blocking-pool
//!   round trip per 4 KiB);
//! - UploadPart takes the part's body, then hashes and writes it in one
//!   blocking call (s3s-fs writes it through tokio::fs, a round trip per
//!   chunk of the body);
//! - CompleteMultipartUpload joins the parts with the kernel's file copy
//!   and takes the object's ETag from the parts' MD5s, kept from their
//!   upload, as S3 does (s3s-fs reads every part back, hashing it again,
//!   and writes it out 64 KiB at a time: MD5 was 45% of this server's CPU
//!   while ketch archived).
//!
//! They keep s3s-fs's files (s3s-fs 0.14.1's layout, pinned in Cargo.toml),
//! so every other operation, forwarded to s3s-fs, sees their parts and
//! objects.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use clap::Parser;
use futures::TryStreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use s3s::auth::{Credentials, SimpleAuth};
use s3s::crypto::{Checksum, Md5};
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{Body, S3, S3Request, S3Response, S3Result, s3_error};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use uuid::Uuid;

/// Every part of an upload but the last is at least this long (S3's limit).
const MIN_PART: u64 = 5 * 1024 * 1024;

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
    let mut builder = S3ServiceBuilder::new(Objects {
        fs,
        root,
        parts: Mutex::default(),
        temp_files: AtomicU64::new(0),
    });
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

/// s3s-fs, with GetObject's body read at once and multipart uploads
/// written and joined in blocking calls.
struct Objects {
    fs: s3s_fs::FileSystem,
    root: PathBuf,
    /// Each part's MD5 from its upload, by upload and part number, until
    /// the upload completes or is aborted. A part this server did not
    /// hash (copied by UploadPartCopy, or uploaded before a restart) is
    /// hashed when the upload completes.
    parts: Mutex<HashMap<(Uuid, i32), [u8; 16]>>,
    /// Numbers this server's temporary files.
    temp_files: AtomicU64,
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

    /// Where s3s-fs keeps an upload's part.
    fn part_file(&self, upload: Uuid, part: i32) -> PathBuf {
        self.root.join(format!(".upload_id-{upload}.part-{part}"))
    }

    /// Where s3s-fs keeps who started an upload (its access key, as JSON).
    fn upload_file(&self, upload: Uuid) -> PathBuf {
        self.root.join(format!(".upload-{upload}.json"))
    }

    /// Where s3s-fs keeps an object's attributes (content type, user
    /// metadata…), or an upload's until it completes.
    fn attributes_file(&self, bucket: &str, key: &str, upload: Option<Uuid>) -> PathBuf {
        let upload = upload.map(|u| format!(".upload-{u}")).unwrap_or_default();
        self.root.join(format!(
            ".bucket-{}.object-{}{upload}.metadata.json",
            URL_SAFE_NO_PAD.encode(bucket),
            URL_SAFE_NO_PAD.encode(key)
        ))
    }

    /// Where s3s-fs keeps an object's ETag (and checksums), as JSON.
    fn info_file(&self, bucket: &str, key: &str) -> PathBuf {
        self.root.join(format!(
            ".bucket-{}.object-{}.internal.json",
            URL_SAFE_NO_PAD.encode(bucket),
            URL_SAFE_NO_PAD.encode(key)
        ))
    }

    /// A fresh temporary file's name, one s3s-fs removes when it starts.
    fn temp_file(&self) -> PathBuf {
        let n = self.temp_files.fetch_add(1, Ordering::Relaxed);
        self.root.join(format!(".tmp.ketch-s3-{n}.internal.part"))
    }

    /// The upload exists and was started with these credentials.
    async fn check_upload(&self, credentials: Option<&Credentials>, upload_id: &str) -> S3Result<Uuid> {
        let upload = Uuid::parse_str(upload_id).map_err(|_| s3_error!(NoSuchUpload))?;
        let owner = match tokio::fs::read(self.upload_file(upload)).await {
            Ok(owner) => owner,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(s3_error!(NoSuchUpload)),
            Err(e) => return Err(s3_error!(InternalError, "reading the upload: {e}")),
        };
        let owner: Option<String> = serde_json::from_slice(&owner)
            .map_err(|e| s3_error!(InternalError, "reading the upload: {e}"))?;
        if owner.as_deref() != credentials.map(|c| c.access_key.as_str()) {
            return Err(s3_error!(AccessDenied));
        }
        Ok(upload)
    }
}

/// The S3 service: GetObject, UploadPart, CompleteMultipartUpload and
/// AbortMultipartUpload here, every other operation listed forwarded to
/// s3s-fs.
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

            async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
                self.put_part(req).await
            }

            async fn complete_multipart_upload(
                &self,
                req: S3Request<CompleteMultipartUploadInput>,
            ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
                self.complete(req).await
            }

            async fn abort_multipart_upload(
                &self,
                req: S3Request<AbortMultipartUploadInput>,
            ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
                let upload = Uuid::parse_str(&req.input.upload_id).ok();
                let response = self.fs.abort_multipart_upload(req).await?;
                self.forget_parts(upload);
                Ok(response)
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
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
    list_parts: ListPartsInput => ListPartsOutput;
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

impl Objects {
    /// UploadPart: the body taken whole, then hashed and written to the
    /// part's file (through a temporary one) in one blocking call.
    async fn put_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let UploadPartInput {
            body,
            upload_id,
            part_number,
            ..
        } = req.input;
        if !(1..=10_000).contains(&part_number) {
            return Err(s3_error!(
                InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive"
            ));
        }
        let mut body = body.ok_or_else(|| s3_error!(IncompleteBody))?;
        let upload = self.check_upload(req.credentials.as_ref(), &upload_id).await?;
        let mut chunks = Vec::new();
        while let Some(chunk) = body
            .try_next()
            .await
            .map_err(|e| s3_error!(IncompleteBody, "reading the part: {e}"))?
        {
            chunks.push(chunk);
        }
        let (temp, file) = (self.temp_file(), self.part_file(upload, part_number));
        let md5 = tokio::task::spawn_blocking(move || write_part(&chunks, &temp, &file))
            .await
            .map_err(|e| s3_error!(InternalError, "{e}"))?
            .map_err(|e| s3_error!(InternalError, "writing the part: {e}"))?;
        lock(&self.parts).insert((upload, part_number), md5);
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(ETag::Strong(hex(&md5))),
            ..Default::default()
        }))
    }

    /// CompleteMultipartUpload: the parts checked, joined into the object
    /// by the kernel's file copy, and the object's ETag made from their
    /// MD5s (S3's: the MD5 of the parts' MD5s, then `-` and their count).
    /// A refused completion changes nothing: the upload stays open.
    /// Conditional completions (If-Match, If-None-Match) and keys s3s-fs
    /// would refuse go to s3s-fs.
    async fn complete(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let object = self.file(&req.input.bucket, &req.input.key);
        let (Some(object), None, None) = (object, &req.input.if_match, &req.input.if_none_match) else {
            let upload = Uuid::parse_str(&req.input.upload_id).ok();
            let response = self.fs.complete_multipart_upload(req).await?;
            self.forget_parts(upload);
            return Ok(response);
        };
        let CompleteMultipartUploadInput {
            multipart_upload,
            bucket,
            key,
            upload_id,
            ..
        } = req.input;
        let upload = self.check_upload(req.credentials.as_ref(), &upload_id).await?;
        let listed = multipart_upload.and_then(|u| u.parts).unwrap_or_default();
        if listed.is_empty() {
            return Err(s3_error!(InvalidPart, "You must specify at least one part"));
        }
        let mut parts = Vec::with_capacity(listed.len());
        {
            let known = lock(&self.parts);
            for (index, part) in listed.iter().enumerate() {
                let number = part
                    .part_number
                    .ok_or_else(|| s3_error!(InvalidRequest, "a part without its number"))?;
                if usize::try_from(number).ok() != Some(index + 1) {
                    return Err(s3_error!(
                        InvalidPartOrder,
                        "parts must be listed 1, 2, 3… in order"
                    ));
                }
                let md5 = known.get(&(upload, number)).copied();
                if let (Some(md5), Some(e_tag)) = (md5, &part.e_tag)
                    && e_tag.value() != hex(&md5)
                {
                    return Err(s3_error!(InvalidPart, "part {number} has another ETag"));
                }
                parts.push((number, self.part_file(upload, number), md5));
            }
        }
        let temp = self.temp_file();
        let md5s = tokio::task::spawn_blocking(move || join_parts(&parts, &temp, &object))
            .await
            .map_err(|e| s3_error!(InternalError, "{e}"))??;
        let mut all = Md5::new();
        for md5 in &md5s {
            all.update(md5);
        }
        let e_tag = format!("{}-{}", hex(&all.finalize()), md5s.len());
        self.finish_upload(upload, &bucket, &key, &e_tag)
            .await
            .map_err(|e| s3_error!(InternalError, "completing the upload: {e}"))?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(bucket),
            key: Some(key),
            e_tag: Some(ETag::Strong(e_tag)),
            ..Default::default()
        }))
    }

    /// After the object is in place: the upload closed, its attributes
    /// made the object's, the object's ETag kept.
    async fn finish_upload(&self, upload: Uuid, bucket: &str, key: &str, e_tag: &str) -> io::Result<()> {
        self.forget_parts(Some(upload));
        remove_if_there(&self.upload_file(upload)).await?;
        let attributes = self.attributes_file(bucket, key, Some(upload));
        if tokio::fs::try_exists(&attributes).await? {
            tokio::fs::rename(&attributes, self.attributes_file(bucket, key, None)).await?;
        }
        let info = serde_json::json!({ "e_tag": e_tag }).to_string();
        let temp = self.temp_file();
        tokio::fs::write(&temp, info).await?;
        tokio::fs::rename(&temp, self.info_file(bucket, key)).await
    }

    fn forget_parts(&self, upload: Option<Uuid>) {
        if let Some(upload) = upload {
            lock(&self.parts).retain(|(u, _), _| *u != upload);
        }
    }
}

/// Writes a file through `temp`: `write` fills it, then it is renamed to
/// `dest` (its directory made). On any error `temp` is removed and `dest`
/// is untouched.
fn replace_file<T>(
    temp: &Path,
    dest: &Path,
    write: impl FnOnce(&mut File) -> io::Result<T>,
) -> io::Result<T> {
    let placed = (|| {
        let value = write(&mut File::create(temp)?)?;
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::rename(temp, dest)?;
        Ok(value)
    })();
    if placed.is_err() {
        let _ = std::fs::remove_file(temp);
    }
    placed
}

/// Hashes and writes a part's body to its file (through `temp`).
fn write_part(chunks: &[Bytes], temp: &Path, file: &Path) -> io::Result<[u8; 16]> {
    replace_file(temp, file, |out| {
        let mut md5 = Md5::new();
        for chunk in chunks {
            md5.update(chunk);
            out.write_all(chunk)?;
        }
        Ok(md5.finalize())
    })
}

/// Joins the parts into `object` (through `temp`), then removes the parts;
/// answers their MD5s (hashing any not known). Every part is checked
/// before anything is written: each uploaded, each but the last at least
/// [`MIN_PART`] long.
fn join_parts(
    parts: &[(i32, PathBuf, Option<[u8; 16]>)],
    temp: &Path,
    object: &Path,
) -> S3Result<Vec<[u8; 16]>> {
    let mut lengths = Vec::with_capacity(parts.len());
    for (number, file, _) in parts {
        lengths.push(match std::fs::metadata(file) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(s3_error!(InvalidPart, "part {number} was not uploaded"));
            }
            Err(e) => return Err(s3_error!(InternalError, "reading a part: {e}")),
        });
    }
    for (index, ((number, _, _), length)) in parts.iter().zip(lengths).enumerate() {
        if index + 1 < parts.len() && length < MIN_PART {
            return Err(s3_error!(
                EntityTooSmall,
                "part {number} is {length} bytes; every part but the last must be at least {MIN_PART}"
            ));
        }
    }
    let md5s = replace_file(temp, object, |out| {
        let mut md5s = Vec::with_capacity(parts.len());
        for (_, file, md5) in parts {
            // File to file: the kernel copies (copy_file_range), no read
            // into this process.
            io::copy(&mut File::open(file)?, out)?;
            md5s.push(match md5 {
                Some(md5) => *md5,
                None => hash_file(file)?,
            });
        }
        Ok(md5s)
    })
    .map_err(|e| s3_error!(InternalError, "joining the parts: {e}"))?;
    for (_, file, _) in parts {
        let _ = std::fs::remove_file(file);
    }
    Ok(md5s)
}

fn hash_file(file: &Path) -> io::Result<[u8; 16]> {
    let mut md5 = Md5::new();
    let mut reader = File::open(file)?;
    let mut buf = vec![0; 1 << 20];
    loop {
        match reader.read(&mut buf)? {
            0 => return Ok(md5.finalize()),
            n => md5.update(&buf[..n]),
        }
    }
}

async fn remove_if_there(file: &Path) -> io::Result<()> {
    match tokio::fs::remove_file(file).await {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
