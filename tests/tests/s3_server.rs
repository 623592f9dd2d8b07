//! The S3 stand-in the tiering tests and the archive benchmark use
//! (`ketch-s3`): its multipart uploads, which it handles itself rather than
//! through s3s-fs, behave as S3's. Plain HTTP/1.1, unsigned requests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use ketch_tests::servers::S3Server;
use md5::{Digest, Md5};

const BUCKET: &str = "lake";
const MIB: usize = 1024 * 1024;

/// A response: status, headers (names lower-cased) and body.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The text of the first `<tag>` in an XML body.
    fn xml(&self, tag: &str) -> Option<String> {
        let text = self.text();
        let start = text.find(&format!("<{tag}>"))? + tag.len() + 2;
        let end = start + text[start..].find(&format!("</{tag}>"))?;
        Some(text[start..end].to_owned())
    }

    /// An error response's S3 code.
    fn code(&self) -> String {
        self.xml("Code")
            .unwrap_or_else(|| panic!("no error code in {}: {}", self.status, self.text()))
    }
}

fn request(server: &S3Server, method: &str, target: &str, body: &[u8]) -> Response {
    let mut stream = TcpStream::connect(("127.0.0.1", server.port())).expect("connect to ketch-s3");
    let head = format!(
        "{method} /{BUCKET}/{target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v == "chunked")
    {
        body = dechunk(&body);
    }
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line = raw.windows(2).position(|w| w == b"\r\n").expect("a chunk size");
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..line]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&raw[line + 2..line + 2 + size]);
        raw = &raw[line + 2 + size + 2..];
    }
}

fn start_upload(server: &S3Server, key: &str) -> String {
    let response = request(server, "POST", &format!("{key}?uploads"), b"");
    assert_eq!(response.status, 200, "{}", response.text());
    response.xml("UploadId").expect("an upload id")
}

/// Uploads a part; answers its ETag without quotes.
fn put_part(server: &S3Server, key: &str, upload: &str, number: i32, bytes: &[u8]) -> String {
    let response = request(
        server,
        "PUT",
        &format!("{key}?partNumber={number}&uploadId={upload}"),
        bytes,
    );
    assert_eq!(response.status, 200, "{}", response.text());
    response
        .header("etag")
        .expect("an ETag")
        .trim_matches('"')
        .to_owned()
}

fn complete(server: &S3Server, key: &str, upload: &str, parts: &[(i32, &str)]) -> Response {
    let mut body = String::from("<CompleteMultipartUpload>");
    for (number, e_tag) in parts {
        body += &format!("<Part><PartNumber>{number}</PartNumber><ETag>\"{e_tag}\"</ETag></Part>");
    }
    body += "</CompleteMultipartUpload>";
    request(
        server,
        "POST",
        &format!("{key}?uploadId={upload}"),
        body.as_bytes(),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes that differ part to part.
fn part_bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The names of the server's upload part files left in its root.
fn part_files(root: &Path) -> Vec<String> {
    std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".upload_id-"))
        .collect()
}

#[test]
fn a_multipart_upload_joins_its_parts_under_s3s_etag() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start_unsigned(&dir.path().join("s3"), BUCKET);
    let key = "warehouse/db/t/data/file.parquet";
    let upload = start_upload(&server, key);
    let parts = [
        part_bytes(1, 5 * MIB),
        part_bytes(2, 5 * MIB + 3),
        part_bytes(3, 1000),
    ];
    let mut e_tags = Vec::new();
    for (i, bytes) in parts.iter().enumerate() {
        let e_tag = put_part(&server, key, &upload, i as i32 + 1, bytes);
        assert_eq!(e_tag, hex(&Md5::digest(bytes)), "a part's ETag is its MD5");
        e_tags.push(e_tag);
    }

    let listed: Vec<(i32, &str)> = (1..).zip(e_tags.iter().map(String::as_str)).collect();
    let done = complete(&server, key, &upload, &listed);
    assert_eq!(done.status, 200, "{}", done.text());
    let mut md5s = Md5::new();
    for bytes in &parts {
        md5s.update(Md5::digest(bytes));
    }
    let expected = format!("{}-3", hex(&md5s.finalize()));
    assert_eq!(
        done.xml("ETag").unwrap().trim_matches('"').replace("&quot;", ""),
        expected
    );

    let whole = parts.concat();
    let got = request(&server, "GET", key, b"");
    assert_eq!(got.status, 200);
    assert!(got.body == whole, "the object is its parts in order");
    assert_eq!(got.header("etag"), Some(format!("\"{expected}\"").as_str()));
    let head = request(&server, "HEAD", key, b"");
    assert_eq!(head.header("etag"), Some(format!("\"{expected}\"").as_str()));
    assert_eq!(
        head.header("content-length"),
        Some(whole.len().to_string().as_str())
    );
    assert!(part_files(server.root()).is_empty(), "the parts are gone");
    assert_eq!(complete(&server, key, &upload, &listed).code(), "NoSuchUpload");
}

#[test]
fn a_refused_completion_writes_nothing_and_leaves_the_upload_open() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start_unsigned(&dir.path().join("s3"), BUCKET);
    let key = "refused";
    let upload = start_upload(&server, key);
    let small = part_bytes(1, 1000);
    let large = part_bytes(2, 5 * MIB);
    let small_tag = put_part(&server, key, &upload, 1, &small);
    let large_tag = put_part(&server, key, &upload, 2, &large);
    let object = server.bucket_dir().join(key);

    let cases: [(&[(i32, &str)], &str); 5] = [
        // A part other than the last under 5 MiB.
        (&[(1, &small_tag), (2, &large_tag)], "EntityTooSmall"),
        // Parts out of order.
        (&[(2, &large_tag), (1, &small_tag)], "InvalidPartOrder"),
        // An ETag that is not the part's.
        (&[(1, &large_tag), (2, &large_tag)], "InvalidPart"),
        // A part never uploaded.
        (
            &[(1, &small_tag), (2, &large_tag), (3, &small_tag)],
            "InvalidPart",
        ),
        // No parts.
        (&[], "InvalidPart"),
    ];
    for (parts, code) in cases {
        let refused = complete(&server, key, &upload, parts);
        assert_eq!(refused.code(), code, "completing with {parts:?}");
        assert!(!object.exists(), "a refused completion wrote the object ({code})");
        assert_eq!(part_files(server.root()).len(), 2, "the parts stay ({code})");
    }
    assert_eq!(
        complete(&server, key, "not-an-upload", &[(1, &small_tag)]).code(),
        "NoSuchUpload"
    );

    // The same upload, its small part uploaded again at full size, completes.
    let first = part_bytes(3, 5 * MIB);
    let first_tag = put_part(&server, key, &upload, 1, &first);
    let done = complete(&server, key, &upload, &[(1, &first_tag), (2, &large_tag)]);
    assert_eq!(done.status, 200, "{}", done.text());
    assert!(std::fs::read(&object).unwrap() == [first, large].concat());
}

#[test]
fn an_aborted_upload_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start_unsigned(&dir.path().join("s3"), BUCKET);
    let key = "aborted";
    let upload = start_upload(&server, key);
    let e_tag = put_part(&server, key, &upload, 1, &part_bytes(1, 1000));
    let aborted = request(&server, "DELETE", &format!("{key}?uploadId={upload}"), b"");
    assert_eq!(aborted.status, 204, "{}", aborted.text());
    assert!(part_files(server.root()).is_empty());
    assert_eq!(
        complete(&server, key, &upload, &[(1, &e_tag)]).code(),
        "NoSuchUpload"
    );
    let put = request(
        &server,
        "PUT",
        &format!("{key}?partNumber=2&uploadId={upload}"),
        b"late",
    );
    assert_eq!(put.code(), "NoSuchUpload");
    assert!(!server.bucket_dir().join(key).exists());
}
