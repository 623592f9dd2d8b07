//! The PROXY protocol header a TCP load balancer (HAProxy's `send-proxy`,
//! `send-proxy-v2`; AWS NLB, Envoy…) writes first on each connection it
//! opens to a gateway, naming the client it carries: without it, every
//! client would come from the balancer's address, and host-based ACLs,
//! per-address limits and quotas would see only that.
//!
//! Both versions are read (the spec: haproxy.org/download/2.9/doc/proxy-protocol.txt):
//!
//! - v1, text: `PROXY TCP4 <src> <dst> <sport> <dport>\r\n` (or `TCP6`, or
//!   `UNKNOWN …`), at most 107 bytes;
//! - v2, binary: a 12-byte signature, version and command, family, the
//!   length of what follows, then the addresses and any TLVs (skipped).
//!
//! A `LOCAL` (v2) or `UNKNOWN` (v1) header — the balancer's own health
//! check — keeps the socket's peer address. Nothing past the header is
//! read: what follows is the client's first bytes (its TLS handshake on a
//! TLS listener).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::io::{AsyncRead, AsyncReadExt};

const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// v1's longest line, `\r\n` included.
const V1_MAX: usize = 107;
/// Past this, a v2 header's TLVs are more than any balancer sends.
const V2_MAX_LENGTH: usize = 4096;

/// Reads the header at the start of `stream`; the client address it names
/// (`peer` itself for a health check's header), or why it is refused.
pub async fn read_header<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer: SocketAddr,
) -> Result<SocketAddr, String> {
    let mut start = [0u8; 5];
    read(stream, &mut start).await?;
    if &start == b"PROXY" {
        return read_v1(stream, peer).await;
    }
    if start[..] == V2_SIGNATURE[..5] {
        return read_v2(stream, peer).await;
    }
    Err("the connection did not begin with a PROXY protocol header".to_owned())
}

async fn read<S: AsyncRead + Unpin>(stream: &mut S, into: &mut [u8]) -> Result<(), String> {
    stream
        .read_exact(into)
        .await
        .map(|_| ())
        .map_err(|e| format!("reading the PROXY protocol header: {e}"))
}

async fn read_v1<S: AsyncRead + Unpin>(stream: &mut S, peer: SocketAddr) -> Result<SocketAddr, String> {
    // Byte by byte to the line's end: nothing after it may be taken.
    let mut line = b"PROXY".to_vec();
    while !line.ends_with(b"\r\n") {
        if line.len() >= V1_MAX {
            return Err("a PROXY protocol v1 header longer than 107 bytes".to_owned());
        }
        let mut byte = [0u8; 1];
        read(stream, &mut byte).await?;
        line.push(byte[0]);
    }
    let text = std::str::from_utf8(&line[..line.len() - 2])
        .map_err(|_| "a PROXY protocol v1 header that is not text".to_owned())?;
    parse_v1(text, peer)
}

fn parse_v1(text: &str, peer: SocketAddr) -> Result<SocketAddr, String> {
    let bad = || format!("a malformed PROXY protocol v1 header: {text:?}");
    let fields: Vec<&str> = text.split(' ').collect();
    match fields[..] {
        ["PROXY", "UNKNOWN", ..] => Ok(peer),
        [
            "PROXY",
            family @ ("TCP4" | "TCP6"),
            source,
            _destination,
            port,
            _destination_port,
        ] => {
            let ip: IpAddr = source.parse().map_err(|_| bad())?;
            if ip.is_ipv4() != (family == "TCP4") {
                return Err(bad());
            }
            let port: u16 = port.parse().map_err(|_| bad())?;
            Ok(SocketAddr::new(ip, port))
        }
        _ => Err(bad()),
    }
}

async fn read_v2<S: AsyncRead + Unpin>(stream: &mut S, peer: SocketAddr) -> Result<SocketAddr, String> {
    let mut rest = [0u8; 11];
    read(stream, &mut rest).await?;
    if rest[..7] != V2_SIGNATURE[5..] {
        return Err("the connection did not begin with a PROXY protocol header".to_owned());
    }
    let (version_command, family) = (rest[7], rest[8]);
    let length = usize::from(u16::from_be_bytes([rest[9], rest[10]]));
    if version_command >> 4 != 2 {
        return Err(format!(
            "PROXY protocol version {} (2 is read)",
            version_command >> 4
        ));
    }
    if length > V2_MAX_LENGTH {
        return Err(format!("a PROXY protocol v2 header of {length} bytes"));
    }
    let mut body = vec![0u8; length];
    read(stream, &mut body).await?;
    parse_v2(version_command & 0x0F, family, &body, peer)
}

fn parse_v2(command: u8, family: u8, body: &[u8], peer: SocketAddr) -> Result<SocketAddr, String> {
    match command {
        // LOCAL: the balancer's own connection (a health check).
        0 => return Ok(peer),
        1 => {}
        other => return Err(format!("PROXY protocol v2 command {other}")),
    }
    let short = || "a PROXY protocol v2 header too short for its addresses".to_owned();
    // The high nibble is the address family, the low one the transport;
    // only the source address and port are used.
    match family >> 4 {
        // AF_UNSPEC: nothing known of the client.
        0 => Ok(peer),
        1 => {
            let b = body.get(..12).ok_or_else(short)?;
            let ip = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
            Ok(SocketAddr::new(IpAddr::V4(ip), u16::from_be_bytes([b[8], b[9]])))
        }
        2 => {
            let b = body.get(..36).ok_or_else(short)?;
            let octets: [u8; 16] = b[..16].try_into().expect("16 bytes");
            Ok(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(octets)),
                u16::from_be_bytes([b[32], b[33]]),
            ))
        }
        // AF_UNIX: no IP address to speak of.
        3 => Ok(peer),
        other => Err(format!("PROXY protocol v2 address family {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> SocketAddr {
        "10.0.0.1:40000".parse().unwrap()
    }

    async fn header(bytes: &[u8]) -> (Result<SocketAddr, String>, Vec<u8>) {
        let mut stream = bytes;
        let read = read_header(&mut stream, peer()).await;
        (read, stream.to_vec())
    }

    fn v2(command: u8, family: u8, body: &[u8]) -> Vec<u8> {
        let mut out = V2_SIGNATURE.to_vec();
        out.push(0x20 | command);
        out.push(family);
        out.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    #[tokio::test]
    async fn v1_names_the_client_and_leaves_what_follows() {
        let (read, rest) = header(b"PROXY TCP4 192.0.2.7 10.0.0.9 51234 9092\r\n\0\0\0\x10").await;
        assert_eq!(read, Ok("192.0.2.7:51234".parse().unwrap()));
        assert_eq!(rest, b"\0\0\0\x10");
        let (read, _) = header(b"PROXY TCP6 2001:db8::7 2001:db8::9 4000 9092\r\n").await;
        assert_eq!(read, Ok("[2001:db8::7]:4000".parse().unwrap()));
        let (read, rest) = header(b"PROXY UNKNOWN\r\nX").await;
        assert_eq!(read, Ok(peer()));
        assert_eq!(rest, b"X");
    }

    #[tokio::test]
    async fn v2_names_the_client_skips_its_tlvs_and_leaves_what_follows() {
        let mut body = vec![192, 0, 2, 7, 10, 0, 0, 9];
        body.extend_from_slice(&51234u16.to_be_bytes());
        body.extend_from_slice(&9092u16.to_be_bytes());
        body.extend_from_slice(&[0x04, 0x00, 0x02, 0xAB, 0xCD]); // a TLV
        let mut bytes = v2(1, 0x11, &body);
        bytes.extend_from_slice(b"next");
        let (read, rest) = header(&bytes).await;
        assert_eq!(read, Ok("192.0.2.7:51234".parse().unwrap()));
        assert_eq!(rest, b"next");

        let mut body = "2001:db8::7".parse::<Ipv6Addr>().unwrap().octets().to_vec();
        body.extend_from_slice(&"2001:db8::9".parse::<Ipv6Addr>().unwrap().octets());
        body.extend_from_slice(&4000u16.to_be_bytes());
        body.extend_from_slice(&9092u16.to_be_bytes());
        let (read, _) = header(&v2(1, 0x21, &body)).await;
        assert_eq!(read, Ok("[2001:db8::7]:4000".parse().unwrap()));
        // A health check's LOCAL header keeps the socket's peer.
        let (read, rest) = header(&[v2(0, 0x00, &[]), b"x".to_vec()].concat()).await;
        assert_eq!(read, Ok(peer()));
        assert_eq!(rest, b"x");
    }

    #[tokio::test]
    async fn anything_else_is_refused() {
        // A Kafka request without the header (a client that bypassed the
        // balancer), a truncated header, bad fields.
        for bytes in [
            &b"\0\0\0\x10\0\x12\0\x03"[..],
            b"PROXY TCP4 192.0.2.7",
            b"PROXY TCP4 192.0.2.7 10.0.0.9 port 9092\r\n",
            b"PROXY TCP4 2001:db8::7 10.0.0.9 1 9092\r\n",
            b"PROXY TCP5 192.0.2.7 10.0.0.9 1 9092\r\n",
            b"\r\n\r\n\0\r\nQUIX\n\x21\x11\0\x0c",
        ] {
            let (read, _) = header(bytes).await;
            assert!(read.is_err(), "{bytes:?}: {read:?}");
        }
        let (read, _) = header(&v2(1, 0x11, &[1, 2, 3])).await;
        assert!(read.is_err(), "{read:?}");
        let long = [b"PROXY ".to_vec(), vec![b'x'; 200]].concat();
        let (read, _) = header(&long).await;
        assert!(read.is_err(), "{read:?}");
    }
}
