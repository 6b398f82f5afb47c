//! Reads the server name (SNI) from a TLS ClientHello at the start of a
//! connection, without a TLS library. The input is whatever bytes have
//! arrived so far; the answer says whether more are needed. Work is linear
//! in the input, bounded by [`MAX_HELLO_LEN`] and [`MAX_RECORDS`], and no
//! input makes it panic.

/// Largest ClientHello handshake message accepted (real ones are 0.5–2 KiB,
/// a few KiB with many PSKs or post-quantum key shares).
pub const MAX_HELLO_LEN: usize = 16 * 1024;

/// Most TLS records a ClientHello may be split across.
pub const MAX_RECORDS: usize = 64;

const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ENCRYPTED_CLIENT_HELLO: u16 = 0xfe0d;
/// The draft "encrypted_server_name" extension (ESNI), treated like ECH.
const EXT_ESNI_DRAFT: u16 = 0xffce;
const NAME_TYPE_HOST_NAME: u8 = 0;

/// What the first bytes of a connection say about its TLS server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientHello {
    /// Not enough bytes yet: read more and ask again with all of them.
    NeedMore,
    /// A ClientHello naming this server (raw, not yet normalised).
    Sni(String),
    /// A well-formed ClientHello without a server_name extension.
    NoSni,
    /// A ClientHello with Encrypted Client Hello (or the ESNI draft): the
    /// visible name is only the outer, public one.
    Ech,
    /// The bytes are not the start of a TLS handshake.
    NotTls,
    /// TLS framing whose ClientHello is broken, oversized, or not a
    /// ClientHello; the reason is for logs.
    Malformed(&'static str),
}

/// Parses the ClientHello at the start of `buf` (all bytes received so far).
pub fn parse_client_hello(buf: &[u8]) -> ClientHello {
    // Early answers for a connection that is plainly not TLS.
    if let Some(&first) = buf.first() {
        if first != CONTENT_HANDSHAKE {
            return ClientHello::NotTls;
        }
    }
    if let Some(&major) = buf.get(1) {
        if major != 3 {
            return ClientHello::NotTls;
        }
    }

    // The handshake message may be split across several records; gather
    // its bytes. Borrow when it sits in one record (the usual case).
    let mut gathered: Vec<u8> = Vec::new();
    let mut pos = 0usize;
    let mut records = 0usize;
    loop {
        let Some(header) = buf.get(pos..pos + 5) else {
            return ClientHello::NeedMore;
        };
        if header[0] != CONTENT_HANDSHAKE {
            return ClientHello::Malformed("a non-handshake record arrived inside the ClientHello");
        }
        if header[1] != 3 {
            return ClientHello::Malformed("record version is not 3.x");
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 {
            return ClientHello::Malformed("empty handshake record");
        }
        if len > 16 * 1024 {
            return ClientHello::Malformed("record longer than 2^14 bytes");
        }
        records += 1;
        if records > MAX_RECORDS {
            return ClientHello::Malformed("ClientHello split across too many records");
        }
        let start = pos + 5;
        let available = &buf[start..buf.len().min(start + len)];
        let complete_record = available.len() == len;

        // Look at what we have, possibly in the middle of a record, to fail
        // early on a wrong type or an oversized length.
        let msg: &[u8] = if records == 1 {
            available
        } else {
            gathered.extend_from_slice(available);
            &gathered
        };
        if let Some(&t) = msg.first() {
            if t != HANDSHAKE_CLIENT_HELLO {
                return ClientHello::Malformed("first handshake message is not a ClientHello");
            }
        }
        if msg.len() >= 4 {
            let body_len =
                (usize::from(msg[1]) << 16) | (usize::from(msg[2]) << 8) | usize::from(msg[3]);
            if body_len > MAX_HELLO_LEN {
                return ClientHello::Malformed("ClientHello is larger than the limit");
            }
            if msg.len() >= 4 + body_len {
                return parse_body(&msg[4..4 + body_len]);
            }
        }
        if !complete_record {
            return ClientHello::NeedMore;
        }
        if records == 1 {
            gathered.extend_from_slice(available);
        }
        pos = start + len;
    }
}

/// A cursor over a byte slice whose reads fail instead of panicking.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.u8()?);
        self.take(n)
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

fn parse_body(body: &[u8]) -> ClientHello {
    match parse_body_inner(body) {
        Ok(outcome) => outcome,
        Err(reason) => ClientHello::Malformed(reason),
    }
}

fn parse_body_inner(body: &[u8]) -> Result<ClientHello, &'static str> {
    const SHORT: &str = "ClientHello is truncated";
    let mut r = Reader { buf: body };
    let version = r.take(2).ok_or(SHORT)?;
    if version[0] != 3 {
        return Err("ClientHello legacy_version is not 3.x");
    }
    r.take(32).ok_or(SHORT)?; // random
    let session_id = r.vec8().ok_or(SHORT)?;
    if session_id.len() > 32 {
        return Err("session id longer than 32 bytes");
    }
    let suites = r.vec16().ok_or(SHORT)?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err("bad cipher_suites length");
    }
    let compression = r.vec8().ok_or(SHORT)?;
    if compression.is_empty() {
        return Err("no compression methods");
    }
    if r.is_empty() {
        // No extensions at all (pre-TLS 1.2 style).
        return Ok(ClientHello::NoSni);
    }
    let extensions = r.vec16().ok_or(SHORT)?;
    if !r.is_empty() {
        return Err("bytes after the extensions");
    }

    let mut ext = Reader { buf: extensions };
    let mut seen: Vec<u16> = Vec::new();
    let mut sni: Option<String> = None;
    let mut ech = false;
    while !ext.is_empty() {
        let ty = ext.u16().ok_or("truncated extension header")?;
        let data = ext.vec16().ok_or("truncated extension")?;
        if seen.contains(&ty) {
            return Err("the same extension appears twice");
        }
        seen.push(ty);
        match ty {
            EXT_SERVER_NAME => sni = parse_server_name(data)?,
            EXT_ENCRYPTED_CLIENT_HELLO | EXT_ESNI_DRAFT => ech = true,
            _ => {}
        }
    }
    Ok(if ech {
        ClientHello::Ech
    } else if let Some(name) = sni {
        ClientHello::Sni(name)
    } else {
        ClientHello::NoSni
    })
}

/// The server_name extension (RFC 6066 §3): a list of (type, name); at most
/// one host_name. `Ok(None)` when it names no host_name.
fn parse_server_name(data: &[u8]) -> Result<Option<String>, &'static str> {
    let mut r = Reader { buf: data };
    let list = r.vec16().ok_or("truncated server_name list")?;
    if !r.is_empty() {
        return Err("bytes after the server_name list");
    }
    if list.is_empty() {
        return Err("empty server_name list");
    }
    let mut l = Reader { buf: list };
    let mut host = None;
    while !l.is_empty() {
        let ty = l.u8().ok_or("truncated server_name entry")?;
        let name = l.vec16().ok_or("truncated server_name entry")?;
        if ty != NAME_TYPE_HOST_NAME {
            continue;
        }
        if host.is_some() {
            return Err("two host_name entries in server_name");
        }
        if name.is_empty() || name.len() > 255 {
            return Err("server name is empty or longer than 255 bytes");
        }
        if !name.iter().all(|b| b.is_ascii_graphic()) {
            return Err("server name holds bytes other than printable ASCII");
        }
        // All bytes are ASCII, so this cannot fail; stay panic-free anyway.
        host = Some(String::from_utf8(name.to_vec()).map_err(|_| "server name is not ASCII")?);
    }
    Ok(host)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a ClientHello handshake message body with the given
    /// extensions (type, data).
    pub(crate) fn hello_body(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut b = vec![3, 3];
        b.extend_from_slice(&[7u8; 32]);
        b.push(32);
        b.extend_from_slice(&[9u8; 32]);
        b.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
        b.extend_from_slice(&[1, 0]);
        let mut ext = Vec::new();
        for (ty, data) in extensions {
            ext.extend_from_slice(&ty.to_be_bytes());
            ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
            ext.extend_from_slice(data);
        }
        b.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        b.extend_from_slice(&ext);
        b
    }

    pub(crate) fn sni_ext(name: &[u8]) -> (u16, Vec<u8>) {
        let mut entry = vec![0];
        entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
        entry.extend_from_slice(name);
        let mut data = (entry.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&entry);
        (0, data)
    }

    fn handshake(body: &[u8]) -> Vec<u8> {
        let mut m = vec![1];
        let n = body.len();
        m.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
        m.extend_from_slice(body);
        m
    }

    /// Wraps a handshake message into records of at most `chunk` bytes.
    pub(crate) fn records(msg: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for part in msg.chunks(chunk) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }

    pub(crate) fn client_hello(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
        records(&handshake(&hello_body(extensions)), 16384)
    }

    #[test]
    fn finds_the_server_name() {
        let hello = client_hello(&[(10, vec![0, 2, 0, 29]), sni_ext(b"api.example.test")]);
        assert_eq!(
            parse_client_hello(&hello),
            ClientHello::Sni("api.example.test".into())
        );
        // Trailing application data after the hello does not matter.
        let mut more = hello.clone();
        more.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
        assert_eq!(
            parse_client_hello(&more),
            ClientHello::Sni("api.example.test".into())
        );
    }

    #[test]
    fn every_prefix_needs_more() {
        let hello = client_hello(&[sni_ext(b"a.test")]);
        for n in 0..hello.len() {
            assert_eq!(
                parse_client_hello(&hello[..n]),
                ClientHello::NeedMore,
                "{n}"
            );
        }
        assert_eq!(
            parse_client_hello(&hello),
            ClientHello::Sni("a.test".into())
        );
    }

    #[test]
    fn split_across_records() {
        let msg = handshake(&hello_body(&[sni_ext(b"split.example.test")]));
        for chunk in [1, 3, 7, 50] {
            let data = records(&msg, chunk.max(msg.len() / MAX_RECORDS + 1));
            for n in 0..data.len() {
                assert_eq!(parse_client_hello(&data[..n]), ClientHello::NeedMore);
            }
            assert_eq!(
                parse_client_hello(&data),
                ClientHello::Sni("split.example.test".into()),
                "chunk {chunk}"
            );
        }
        let too_many = records(&msg, 1);
        assert!(matches!(
            parse_client_hello(&too_many),
            ClientHello::Malformed(_)
        ));
    }

    #[test]
    fn no_sni_and_ech() {
        assert_eq!(
            parse_client_hello(&client_hello(&[(10, vec![0, 2, 0, 29])])),
            ClientHello::NoSni
        );
        assert_eq!(parse_client_hello(&client_hello(&[])), ClientHello::NoSni);
        let ech = client_hello(&[sni_ext(b"public.example"), (0xfe0d, vec![0, 1, 2])]);
        assert_eq!(parse_client_hello(&ech), ClientHello::Ech);
        let esni = client_hello(&[(0xffce, vec![1])]);
        assert_eq!(parse_client_hello(&esni), ClientHello::Ech);
        // A hello with no extensions block at all.
        let mut body = hello_body(&[]);
        body.truncate(body.len() - 2);
        assert_eq!(
            parse_client_hello(&records(&handshake(&body), 16384)),
            ClientHello::NoSni
        );
    }

    #[test]
    fn not_tls() {
        assert_eq!(
            parse_client_hello(b"GET / HTTP/1.1\r\n"),
            ClientHello::NotTls
        );
        assert_eq!(parse_client_hello(b"SSH-2.0-OpenSSH"), ClientHello::NotTls);
        assert_eq!(parse_client_hello(&[22, 4, 1]), ClientHello::NotTls);
        assert_eq!(parse_client_hello(&[0x80, 0x2e, 1]), ClientHello::NotTls);
        assert_eq!(parse_client_hello(&[22]), ClientHello::NeedMore);
    }

    #[test]
    fn malformed() {
        let bad = |exts: &[(u16, Vec<u8>)]| parse_client_hello(&client_hello(exts));
        assert!(matches!(
            bad(&[sni_ext(b"a"), sni_ext(b"b")]),
            ClientHello::Malformed(_)
        ));
        assert!(matches!(bad(&[sni_ext(b"")]), ClientHello::Malformed(_)));
        assert!(matches!(bad(&[sni_ext(b"a b")]), ClientHello::Malformed(_)));
        assert!(matches!(
            bad(&[sni_ext(&[0xc3, 0xa9])]),
            ClientHello::Malformed(_)
        ));
        assert!(matches!(bad(&[(0, vec![0, 0])]), ClientHello::Malformed(_)));
        assert!(matches!(
            bad(&[(0, vec![0, 9, 0])]),
            ClientHello::Malformed(_)
        ));
        // Two host_name entries in one list.
        let mut list = Vec::new();
        for n in [b"a.test", b"b.test"] {
            list.push(0);
            list.extend_from_slice(&(n.len() as u16).to_be_bytes());
            list.extend_from_slice(n);
        }
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&list);
        assert!(matches!(bad(&[(0, data)]), ClientHello::Malformed(_)));
        // Other name types are skipped.
        let mut list = vec![1, 0, 1, b'x'];
        list.extend_from_slice(&[0, 0, 6]);
        list.extend_from_slice(b"c.test");
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&list);
        assert_eq!(bad(&[(0, data)]), ClientHello::Sni("c.test".into()));

        // Wrong handshake type, oversized length, empty record, alert inside.
        assert!(matches!(
            parse_client_hello(&[22, 3, 1, 0, 4, 2, 0, 0, 0]),
            ClientHello::Malformed(_)
        ));
        assert!(matches!(
            parse_client_hello(&[22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff]),
            ClientHello::Malformed(_)
        ));
        assert!(matches!(
            parse_client_hello(&[22, 3, 1, 0, 0]),
            ClientHello::Malformed(_)
        ));
        assert!(matches!(
            parse_client_hello(&[22, 3, 1, 0x40, 0x01]),
            ClientHello::Malformed(_)
        ));
        let msg = handshake(&hello_body(&[sni_ext(b"a.test")]));
        let mut data = records(&msg[..10], 10);
        data.extend_from_slice(&[21, 3, 3, 0, 2, 2, 40]);
        assert!(matches!(
            parse_client_hello(&data),
            ClientHello::Malformed(_)
        ));
        // Truncated body inside a complete message.
        let mut body = hello_body(&[sni_ext(b"a.test")]);
        body.truncate(40);
        assert!(matches!(
            parse_client_hello(&records(&handshake(&body), 16384)),
            ClientHello::Malformed(_)
        ));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A cheap deterministic sweep; the cargo-fuzz target goes further.
        let hello = client_hello(&[sni_ext(b"x.example.test"), (0x2b, vec![2, 3, 4])]);
        let mut state = 0x1234_5678u32;
        for _ in 0..20_000 {
            let mut data = hello.clone();
            for _ in 0..3 {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
                let i = (state as usize >> 8) % data.len();
                data[i] = (state >> 24) as u8;
            }
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let cut = (state as usize >> 4) % (data.len() + 1);
            let _ = parse_client_hello(&data[..cut]);
        }
    }
}
