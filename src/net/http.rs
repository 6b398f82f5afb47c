//! HTTP/1.x request heads as the egress proxy sees them: the method, target
//! and destination host of each request ([`parse_request_head`]), and the
//! request boundaries on a kept-alive connection ([`RequestFramer`], which
//! follows Content-Length and chunked bodies), so that every request's Host
//! is checked and not just the first. A request whose absolute URI names a
//! different host than its Host header is refused, as are the ambiguous
//! framings that request smuggling relies on. No I/O; bounded work.

use crate::net::host::{parse_host, HostError, HostPort};

/// Largest request head (request line and headers) accepted.
pub const MAX_HEAD_LEN: usize = 16 * 1024;
/// Most header fields in one head.
pub const MAX_HEADERS: usize = 128;
/// Longest chunk-size line (with extensions).
const MAX_CHUNK_LINE: usize = 1024;
/// Most bytes of trailer fields after a chunked body.
const MAX_TRAILERS: usize = 16 * 1024;

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("request head is larger than {MAX_HEAD_LEN} bytes")]
    HeadTooLarge,
    #[error("more than {MAX_HEADERS} header fields")]
    TooManyHeaders,
    #[error("not an HTTP/1.x request line")]
    BadRequestLine,
    #[error("unsupported HTTP version (only HTTP/1.0 and HTTP/1.1)")]
    BadVersion,
    #[error("request target is not origin, absolute, authority or asterisk form")]
    BadTarget,
    #[error("absolute URI scheme is not http or https")]
    BadScheme,
    #[error("user information in the request URI is not allowed")]
    UserInfo,
    #[error("line ends with a bare LF or CR; HTTP needs CRLF")]
    BareLineEnding,
    #[error("malformed header field line")]
    BadHeader,
    #[error("obsolete line folding in a header")]
    ObsFold,
    #[error("HTTP/1.1 request without a Host header")]
    MissingHost,
    #[error("more than one Host header")]
    DuplicateHost,
    #[error("bad host: {0}")]
    BadHost(#[from] HostError),
    #[error("the request URI names a different host than the Host header")]
    HostMismatch,
    #[error("bad or conflicting Content-Length")]
    BadContentLength,
    #[error("Transfer-Encoding is not chunked-last, or came with Content-Length or in HTTP/1.0")]
    BadTransferEncoding,
    #[error("malformed chunked body")]
    BadChunk,
    #[error("chunk trailers are larger than {MAX_TRAILERS} bytes")]
    TrailersTooLarge,
}

/// HTTP/1.0 or HTTP/1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

/// How the request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    Length(u64),
    Chunked,
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub target: String,
    pub version: Version,
    /// Where the request says it goes: the absolute URI's or CONNECT's
    /// authority (checked against Host) or the Host header. `None` only for
    /// an HTTP/1.0 origin-form request without Host.
    pub host: Option<HostPort>,
    /// Bytes of the head, blank lines before it included.
    pub head_len: usize,
    pub body: Body,
    /// CONNECT, or an `Upgrade` asked for with `Connection: upgrade`: if the
    /// server agrees, the bytes after this request are not HTTP.
    pub upgrade: bool,
    /// The client will close after this request (Connection: close, or
    /// HTTP/1.0 without keep-alive).
    pub close: bool,
}

/// The answer of [`parse_request_head`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadStatus {
    /// The head is not complete yet (and what there is looks like HTTP).
    NeedMore,
    Complete(RequestHead),
    Malformed(HttpError),
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Finds the end of the head (the blank line); `Some(len)` includes it.
fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Parses the request head at the start of `buf`.
pub fn parse_request_head(buf: &[u8]) -> HeadStatus {
    // Tolerate blank lines before the request line (RFC 9112 §2.2), which
    // some clients send after a body.
    let mut skip = 0;
    while buf[skip..].starts_with(b"\r\n") {
        skip += 2;
        if skip > 64 {
            return HeadStatus::Malformed(HttpError::BadRequestLine);
        }
    }
    let rest = &buf[skip..];
    if rest == b"\r" {
        // Maybe the first half of another blank line.
        return HeadStatus::NeedMore;
    }
    let limit = rest.len().min(MAX_HEAD_LEN);
    match find_head_end(&rest[..limit]) {
        Some(end) => match parse_complete_head(&rest[..end]) {
            Ok(mut head) => {
                head.head_len = skip + end;
                HeadStatus::Complete(head)
            }
            Err(e) => HeadStatus::Malformed(e),
        },
        None if rest.len() >= MAX_HEAD_LEN => HeadStatus::Malformed(HttpError::HeadTooLarge),
        None => match early_check(rest) {
            Ok(()) => HeadStatus::NeedMore,
            Err(e) => HeadStatus::Malformed(e),
        },
    }
}

/// Refuses an incomplete head as soon as what has arrived cannot be HTTP,
/// so a non-HTTP client is not kept waiting.
fn early_check(partial: &[u8]) -> Result<(), HttpError> {
    let line_end = partial.iter().position(|&b| b == b'\n');
    let first = &partial[..line_end.unwrap_or(partial.len())];
    let method_end = first.iter().position(|&b| b == b' ');
    let method = &first[..method_end.unwrap_or(first.len())];
    if !method.iter().all(|&b| is_tchar(b)) || method.len() > 32 {
        return Err(HttpError::BadRequestLine);
    }
    if let Some(end) = line_end {
        // The request line is complete: check it in full.
        if end == 0 || partial[end - 1] != b'\r' {
            return Err(HttpError::BareLineEnding);
        }
        parse_request_line(&partial[..end - 1])?;
    }
    Ok(())
}

struct RequestLine<'a> {
    method: &'a str,
    target: &'a str,
    version: Version,
}

fn parse_request_line(line: &[u8]) -> Result<RequestLine<'_>, HttpError> {
    let text = std::str::from_utf8(line).map_err(|_| HttpError::BadRequestLine)?;
    let mut parts = text.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::BadRequestLine);
    };
    if method.is_empty() || method.len() > 32 || !method.bytes().all(is_tchar) {
        return Err(HttpError::BadRequestLine);
    }
    if target.is_empty() || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(HttpError::BadTarget);
    }
    let version = match version {
        "HTTP/1.1" => Version::Http11,
        "HTTP/1.0" => Version::Http10,
        v if v.starts_with("HTTP/") => return Err(HttpError::BadVersion),
        _ => return Err(HttpError::BadRequestLine),
    };
    Ok(RequestLine {
        method,
        target,
        version,
    })
}

/// Where the request target points, when it names an authority.
struct TargetAuthority {
    host: HostPort,
    default_port: Option<u16>,
}

fn target_authority(method: &str, target: &str) -> Result<Option<TargetAuthority>, HttpError> {
    if target.starts_with('/') {
        return Ok(None);
    }
    if target == "*" {
        return if method == "OPTIONS" {
            Ok(None)
        } else {
            Err(HttpError::BadTarget)
        };
    }
    if method == "CONNECT" {
        // authority-form: host:port, port required.
        if target.contains('@') {
            return Err(HttpError::UserInfo);
        }
        let host = parse_host(target)?;
        if host.port.is_none() {
            return Err(HttpError::BadTarget);
        }
        return Ok(Some(TargetAuthority {
            host,
            default_port: None,
        }));
    }
    let (scheme, rest) = target.split_once("://").ok_or(HttpError::BadTarget)?;
    let default_port = if scheme.eq_ignore_ascii_case("http") {
        80
    } else if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        return Err(HttpError::BadScheme);
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.contains('@') {
        return Err(HttpError::UserInfo);
    }
    Ok(Some(TargetAuthority {
        host: parse_host(authority)?,
        default_port: Some(default_port),
    }))
}

/// Parses a complete head (`head` ends with its blank line): the line
/// endings, the request line, the header lines, then what they mean taken
/// together. Each step refuses with its own error, in this order, so the
/// first problem in a head is the one reported.
fn parse_complete_head(head: &[u8]) -> Result<RequestHead, HttpError> {
    check_line_endings(head)?;
    let mut lines = head_lines(head);
    let request_line = lines.next().ok_or(HttpError::BadRequestLine)?;
    let RequestLine {
        method,
        target,
        version,
    } = parse_request_line(request_line)?;
    let fields = parse_header_lines(lines)?;
    let body = body_framing(&fields, version)?;
    let authority = target_authority(method, target)?;
    let host = destination(authority, fields.host, version)?;
    let close = fields.conn_close || (version == Version::Http10 && !fields.conn_keep_alive);
    Ok(RequestHead {
        method: method.to_string(),
        target: target.to_string(),
        version,
        host,
        head_len: head.len(),
        body,
        upgrade: method == "CONNECT" || (fields.has_upgrade && fields.conn_upgrade),
        close,
    })
}

/// Every line must end in CRLF: no bare LF, no bare CR.
fn check_line_endings(head: &[u8]) -> Result<(), HttpError> {
    for (i, &b) in head.iter().enumerate() {
        let bare_lf = b == b'\n' && (i == 0 || head[i - 1] != b'\r');
        let bare_cr = b == b'\r' && head.get(i + 1) != Some(&b'\n');
        if bare_lf || bare_cr {
            return Err(HttpError::BareLineEnding);
        }
    }
    Ok(())
}

/// The lines of a complete head without their CRLF: the request line first,
/// then the header field lines; the final blank line is dropped.
fn head_lines(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    let body = &head[..head.len() - 4];
    body.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
}

/// What the header fields say that the proxy acts on.
#[derive(Default)]
struct HeaderFields {
    host: Option<HostPort>,
    content_length: Option<u64>,
    /// The codings, lower case, in the order they were applied.
    transfer_encoding: Vec<String>,
    conn_close: bool,
    conn_keep_alive: bool,
    conn_upgrade: bool,
    has_upgrade: bool,
}

/// Reads the header field lines in order; the first refused line decides
/// the error.
fn parse_header_lines<'a>(
    lines: impl Iterator<Item = &'a [u8]>,
) -> Result<HeaderFields, HttpError> {
    let mut fields = HeaderFields::default();
    for (count, line) in (1usize..).zip(lines) {
        if count > MAX_HEADERS {
            return Err(HttpError::TooManyHeaders);
        }
        let (name, value) = split_field_line(line)?;
        fields.add(name, value)?;
    }
    Ok(fields)
}

/// Splits one field line into its name and its value (surrounding
/// whitespace trimmed), refusing obsolete line folding, a missing colon, a
/// name that is not a token, and control characters in the value.
fn split_field_line(line: &[u8]) -> Result<(&str, &[u8]), HttpError> {
    if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err(HttpError::ObsFold);
    }
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(HttpError::BadHeader)?;
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err(HttpError::BadHeader);
    }
    let value = &line[colon + 1..];
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(HttpError::BadHeader);
    }
    let value = trim_ows(value);
    // Names are ASCII tokens, so this cannot fail.
    let name = std::str::from_utf8(name).map_err(|_| HttpError::BadHeader)?;
    Ok((name, value))
}

impl HeaderFields {
    /// Takes in one field; fields the proxy does not act on are ignored.
    fn add(&mut self, name: &str, value: &[u8]) -> Result<(), HttpError> {
        if name.eq_ignore_ascii_case("host") {
            self.add_host(value)?;
        } else if name.eq_ignore_ascii_case("content-length") {
            self.add_content_length(value)?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            self.add_transfer_encoding(value)?;
        } else if name.eq_ignore_ascii_case("connection") {
            self.add_connection(value);
        } else if name.eq_ignore_ascii_case("upgrade") {
            self.has_upgrade = true;
        }
        Ok(())
    }

    /// One Host header at most, and it must read as a host.
    fn add_host(&mut self, value: &[u8]) -> Result<(), HttpError> {
        if self.host.is_some() {
            return Err(HttpError::DuplicateHost);
        }
        let v = std::str::from_utf8(value).map_err(|_| HttpError::BadHost(HostError::Empty))?;
        self.host = Some(parse_host(v)?);
        Ok(())
    }

    /// A list of decimal lengths; repeats (in one field or several) must
    /// all agree.
    fn add_content_length(&mut self, value: &[u8]) -> Result<(), HttpError> {
        for item in value.split(|&b| b == b',') {
            let item = trim_ows(item);
            if item.is_empty() || item.len() > 19 || !item.iter().all(u8::is_ascii_digit) {
                return Err(HttpError::BadContentLength);
            }
            let n: u64 = std::str::from_utf8(item)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or(HttpError::BadContentLength)?;
            if self.content_length.is_some_and(|prev| prev != n) {
                return Err(HttpError::BadContentLength);
            }
            self.content_length = Some(n);
        }
        Ok(())
    }

    /// Appends the field's codings; whether they frame the body is
    /// [`body_framing`]'s to say.
    fn add_transfer_encoding(&mut self, value: &[u8]) -> Result<(), HttpError> {
        for item in value.split(|&b| b == b',') {
            let item = trim_ows(item);
            if item.is_empty() {
                continue;
            }
            let s = std::str::from_utf8(item).map_err(|_| HttpError::BadTransferEncoding)?;
            self.transfer_encoding.push(s.to_ascii_lowercase());
        }
        if self.transfer_encoding.is_empty() {
            return Err(HttpError::BadTransferEncoding);
        }
        Ok(())
    }

    /// Notes the Connection options the proxy acts on; others are ignored.
    fn add_connection(&mut self, value: &[u8]) {
        for item in value.split(|&b| b == b',') {
            let item = trim_ows(item);
            if item.eq_ignore_ascii_case(b"close") {
                self.conn_close = true;
            } else if item.eq_ignore_ascii_case(b"keep-alive") {
                self.conn_keep_alive = true;
            } else if item.eq_ignore_ascii_case(b"upgrade") {
                self.conn_upgrade = true;
            }
        }
    }
}

/// How the body is framed. Transfer-Encoding must end in a single
/// `chunked`, and may not come with Content-Length or in HTTP/1.0: those are
/// the ambiguous framings that request smuggling relies on.
fn body_framing(fields: &HeaderFields, version: Version) -> Result<Body, HttpError> {
    let transfer_encoding = &fields.transfer_encoding;
    if transfer_encoding.is_empty() {
        return Ok(match fields.content_length {
            None | Some(0) => Body::None,
            Some(n) => Body::Length(n),
        });
    }
    let chunked_last = transfer_encoding.last().is_some_and(|t| t == "chunked");
    let chunked_earlier = transfer_encoding[..transfer_encoding.len() - 1]
        .iter()
        .any(|t| t == "chunked");
    if fields.content_length.is_some()
        || version == Version::Http10
        || !chunked_last
        || chunked_earlier
    {
        return Err(HttpError::BadTransferEncoding);
    }
    Ok(Body::Chunked)
}

/// Where the request goes: the target's authority, which must agree with
/// the Host header when both are given, or else the Host header. HTTP/1.1
/// requires a Host header whatever the target says.
fn destination(
    authority: Option<TargetAuthority>,
    host_header: Option<HostPort>,
    version: Version,
) -> Result<Option<HostPort>, HttpError> {
    match (authority, host_header) {
        (Some(a), Some(h)) => {
            let def = a.default_port;
            let same_port = match def {
                Some(d) => a.host.port.unwrap_or(d) == h.port.unwrap_or(d),
                // CONNECT: the Host header may leave the port out.
                None => h.port.is_none() || h.port == a.host.port,
            };
            if a.host.host != h.host || !same_port {
                return Err(HttpError::HostMismatch);
            }
            Ok(Some(a.host))
        }
        (Some(a), None) => {
            if version == Version::Http11 {
                return Err(HttpError::MissingHost);
            }
            Ok(Some(a.host))
        }
        (None, Some(h)) => Ok(Some(h)),
        (None, None) => {
            if version == Version::Http11 {
                return Err(HttpError::MissingHost);
            }
            Ok(None)
        }
    }
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// What the leading bytes of the client's unforwarded data are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// More bytes are needed to decide.
    NeedMore,
    /// The data starts with a complete request head of `head_len` bytes:
    /// check its host, then forward those bytes.
    Head(Box<RequestHead>),
    /// The first `n` bytes (n > 0) are body or chunk framing of the current
    /// request: forward them as they are.
    Forward(usize),
    /// The last request asked for an upgrade (or CONNECT) and the client has
    /// sent more bytes: whether they are HTTP depends on the server's answer.
    /// Call [`RequestFramer::upgrade_accepted`] (101, or 2xx to CONNECT) or
    /// [`RequestFramer::upgrade_refused`], then step again.
    UpgradePending,
    /// The connection is no longer HTTP (an accepted upgrade): forward
    /// everything as it comes.
    Opaque,
    /// The request stream is broken or ambiguous: refuse the connection.
    Malformed(HttpError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Body { remaining: u64 },
    ChunkSize,
    ChunkData { remaining: u64 },
    ChunkEnd,
    Trailers { seen: usize },
    UpgradePending,
    Opaque,
    Failed,
}

/// Follows a client's request stream on one connection: hands out each
/// request head to be checked and says how many body bytes follow it.
#[derive(Debug, Clone)]
pub struct RequestFramer {
    state: State,
    pending_upgrade: bool,
    requests: u64,
}

impl Default for RequestFramer {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestFramer {
    pub fn new() -> Self {
        RequestFramer {
            state: State::Head,
            pending_upgrade: false,
            requests: 0,
        }
    }

    /// How many request heads have been handed out.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// The server agreed to the upgrade: from now on the stream is opaque.
    pub fn upgrade_accepted(&mut self) {
        if self.state == State::UpgradePending || self.pending_upgrade {
            self.state = State::Opaque;
            self.pending_upgrade = false;
        }
    }

    /// The server refused the upgrade: the stream stays HTTP.
    pub fn upgrade_refused(&mut self) {
        if self.state == State::UpgradePending {
            self.state = State::Head;
        }
        self.pending_upgrade = false;
    }

    /// Classifies the leading bytes of `buf` (the client's bytes not yet
    /// forwarded). After `Head(h)` the caller forwards `h.head_len` bytes;
    /// after `Forward(n)`, `n` bytes; then it calls `step` again with the rest.
    pub fn step(&mut self, buf: &[u8]) -> Step {
        match self.state {
            State::Failed => Step::Malformed(HttpError::BadRequestLine),
            State::Opaque => Step::Opaque,
            State::UpgradePending => {
                if buf.is_empty() {
                    Step::NeedMore
                } else {
                    Step::UpgradePending
                }
            }
            State::Head => {
                if buf.is_empty() {
                    return Step::NeedMore;
                }
                match parse_request_head(buf) {
                    HeadStatus::NeedMore => Step::NeedMore,
                    HeadStatus::Malformed(e) => self.fail(e),
                    HeadStatus::Complete(head) => {
                        self.requests += 1;
                        self.pending_upgrade = head.upgrade;
                        self.state = match head.body {
                            Body::None => self.after_request(),
                            Body::Length(n) => State::Body { remaining: n },
                            Body::Chunked => State::ChunkSize,
                        };
                        Step::Head(Box::new(head))
                    }
                }
            }
            State::Body { remaining } => {
                if buf.is_empty() {
                    return Step::NeedMore;
                }
                let n = usize::try_from(remaining)
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                let left = remaining - n as u64;
                self.state = if left == 0 {
                    self.after_request()
                } else {
                    State::Body { remaining: left }
                };
                Step::Forward(n)
            }
            State::ChunkSize => self.chunk_size(buf),
            State::ChunkData { remaining } => {
                if buf.is_empty() {
                    return Step::NeedMore;
                }
                let n = usize::try_from(remaining)
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                let left = remaining - n as u64;
                self.state = if left == 0 {
                    State::ChunkEnd
                } else {
                    State::ChunkData { remaining: left }
                };
                Step::Forward(n)
            }
            State::ChunkEnd => match buf {
                [] | [b'\r'] => Step::NeedMore,
                [b'\r', b'\n', ..] => {
                    self.state = State::ChunkSize;
                    Step::Forward(2)
                }
                _ => self.fail(HttpError::BadChunk),
            },
            State::Trailers { seen } => self.trailer_line(buf, seen),
        }
    }

    fn after_request(&self) -> State {
        if self.pending_upgrade {
            State::UpgradePending
        } else {
            State::Head
        }
    }

    fn fail(&mut self, e: HttpError) -> Step {
        self.state = State::Failed;
        Step::Malformed(e)
    }

    fn chunk_size(&mut self, buf: &[u8]) -> Step {
        let window = &buf[..buf.len().min(MAX_CHUNK_LINE)];
        let Some(lf) = window.iter().position(|&b| b == b'\n') else {
            if buf.len() >= MAX_CHUNK_LINE {
                return self.fail(HttpError::BadChunk);
            }
            // Early refusal of a size line that cannot be valid.
            let hex_end = window
                .iter()
                .position(|b| !b.is_ascii_hexdigit())
                .unwrap_or(window.len());
            if hex_end > 16 {
                return self.fail(HttpError::BadChunk);
            }
            return Step::NeedMore;
        };
        if lf == 0 || window[lf - 1] != b'\r' {
            return self.fail(HttpError::BadChunk);
        }
        let line = &window[..lf - 1];
        let hex_end = line
            .iter()
            .position(|b| !b.is_ascii_hexdigit())
            .unwrap_or(line.len());
        let (hex, ext) = line.split_at(hex_end);
        if hex.is_empty() || hex.len() > 16 {
            return self.fail(HttpError::BadChunk);
        }
        // chunk-ext: *( BWS ";" BWS name [ BWS "=" BWS value ] ), checked
        // loosely: it must start with ';' (after optional whitespace) and
        // hold no control characters.
        let ext_trim = trim_ows(ext);
        if !ext_trim.is_empty()
            && (ext_trim[0] != b';'
                || ext_trim
                    .iter()
                    .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f))
        {
            return self.fail(HttpError::BadChunk);
        }
        let size = hex.iter().try_fold(0u64, |acc, &b| {
            let d = u64::from((b as char).to_digit(16)?);
            acc.checked_mul(16)?.checked_add(d)
        });
        let Some(size) = size else {
            return self.fail(HttpError::BadChunk);
        };
        self.state = if size == 0 {
            State::Trailers { seen: 0 }
        } else {
            State::ChunkData { remaining: size }
        };
        Step::Forward(lf + 1)
    }

    fn trailer_line(&mut self, buf: &[u8], seen: usize) -> Step {
        let room = MAX_TRAILERS.saturating_sub(seen);
        let window = &buf[..buf.len().min(room)];
        let Some(lf) = window.iter().position(|&b| b == b'\n') else {
            if buf.len() >= room {
                return self.fail(HttpError::TrailersTooLarge);
            }
            return Step::NeedMore;
        };
        if lf == 0 || window[lf - 1] != b'\r' {
            return self.fail(HttpError::BadChunk);
        }
        let line = &window[..lf - 1];
        if line.is_empty() {
            self.state = self.after_request();
            return Step::Forward(2);
        }
        let valid = match line.iter().position(|&b| b == b':') {
            Some(c) => {
                c > 0
                    && line[..c].iter().all(|&b| is_tchar(b))
                    && !line[c + 1..]
                        .iter()
                        .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
            }
            None => false,
        };
        if !valid {
            return self.fail(HttpError::BadChunk);
        }
        self.state = State::Trailers {
            seen: seen + lf + 1,
        };
        Step::Forward(lf + 1)
    }
}

/// The status code of an HTTP/1.x response whose status line starts `buf`,
/// for deciding whether an upgrade was accepted. `Ok(None)`: need more.
pub fn response_status(buf: &[u8]) -> Result<Option<u16>, HttpError> {
    let window = &buf[..buf.len().min(1024)];
    let Some(lf) = window.iter().position(|&b| b == b'\n') else {
        if buf.len() >= 1024 {
            return Err(HttpError::BadRequestLine);
        }
        return Ok(None);
    };
    let line = window[..lf].strip_suffix(b"\r").unwrap_or(&window[..lf]);
    let rest = line
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| line.strip_prefix(b"HTTP/1.0 "))
        .ok_or(HttpError::BadRequestLine)?;
    match rest.get(..3) {
        Some(code)
            if code.iter().all(u8::is_ascii_digit) && rest.get(3).is_none_or(|&b| b == b' ') =>
        {
            let n = code
                .iter()
                .fold(0u16, |acc, &b| acc * 10 + u16::from(b - b'0'));
            Ok(Some(n))
        }
        _ => Err(HttpError::BadRequestLine),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::host::HostSpec;

    fn complete(s: &str) -> RequestHead {
        match parse_request_head(s.as_bytes()) {
            HeadStatus::Complete(h) => h,
            other => panic!("{s:?} gave {other:?}"),
        }
    }

    fn malformed(s: &str) -> HttpError {
        match parse_request_head(s.as_bytes()) {
            HeadStatus::Malformed(e) => e,
            other => panic!("{s:?} gave {other:?}"),
        }
    }

    fn name(h: &RequestHead) -> &str {
        match &h.host.as_ref().unwrap().host {
            HostSpec::Name(n) => n,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn origin_form() {
        let req = "GET /index.html HTTP/1.1\r\nHost: Example.TEST:8080\r\nAccept: */*\r\n\r\n";
        let h = complete(req);
        assert_eq!(h.method, "GET");
        assert_eq!(h.target, "/index.html");
        assert_eq!(h.version, Version::Http11);
        assert_eq!(name(&h), "example.test");
        assert_eq!(h.host.as_ref().unwrap().port, Some(8080));
        assert_eq!(h.head_len, req.len());
        assert_eq!(h.body, Body::None);
        assert!(!h.close && !h.upgrade);
    }

    #[test]
    fn every_prefix_needs_more() {
        let req = "POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\n";
        for n in 0..req.len() {
            assert_eq!(
                parse_request_head(&req.as_bytes()[..n]),
                HeadStatus::NeedMore,
                "{n}"
            );
        }
        assert_eq!(complete(req).body, Body::Length(3));
    }

    #[test]
    fn absolute_form_must_agree_with_host() {
        let h = complete("GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n");
        assert_eq!(name(&h), "a.test");
        let h = complete("GET http://A.test:80/x HTTP/1.1\r\nHost: a.test\r\n\r\n");
        assert_eq!(name(&h), "a.test");
        complete("GET https://a.test/x HTTP/1.1\r\nHost: a.test:443\r\n\r\n");
        complete("GET http://a.test?q HTTP/1.1\r\nhost: a.test\r\n\r\n");
        assert_eq!(
            malformed("GET http://evil.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            HttpError::HostMismatch
        );
        assert_eq!(
            malformed("GET http://a.test:8080/ HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            HttpError::HostMismatch
        );
        assert_eq!(
            malformed("GET http://127.1/ HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            HttpError::HostMismatch
        );
        assert_eq!(
            malformed("GET http://a.test@evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"),
            HttpError::UserInfo
        );
        assert_eq!(
            malformed("GET ftp://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            HttpError::BadScheme
        );
        // HTTP/1.0 absolute form without Host takes the URI's host.
        let h = complete("GET http://0x7f.1/ HTTP/1.0\r\n\r\n");
        assert_eq!(
            h.host.unwrap().host,
            HostSpec::Ip("127.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn connect_and_upgrade() {
        let h = complete("CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n");
        assert!(h.upgrade);
        assert_eq!(h.host.unwrap().port, Some(443));
        assert_eq!(
            malformed("CONNECT a.test HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            HttpError::BadTarget
        );
        assert_eq!(
            malformed("CONNECT evil.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            HttpError::HostMismatch
        );
        let h = complete(
            "GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n",
        );
        assert!(h.upgrade);
        let h = complete("GET /ws HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\n\r\n");
        assert!(!h.upgrade, "Upgrade without Connection: upgrade is ignored");
        complete("OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n");
        assert_eq!(
            malformed("GET * HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            HttpError::BadTarget
        );
    }

    #[test]
    fn host_rules() {
        assert_eq!(
            malformed("GET / HTTP/1.1\r\nAccept: */*\r\n\r\n"),
            HttpError::MissingHost
        );
        let h = complete("GET / HTTP/1.0\r\n\r\n");
        assert!(h.host.is_none());
        assert!(h.close);
        let h = complete("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        assert!(!h.close);
        assert_eq!(
            malformed("GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"),
            HttpError::DuplicateHost
        );
        assert!(matches!(
            malformed("GET / HTTP/1.1\r\nHost: a..test\r\n\r\n"),
            HttpError::BadHost(_)
        ));
        assert!(matches!(
            malformed("GET / HTTP/1.1\r\nHost: \r\n\r\n"),
            HttpError::BadHost(_)
        ));
        let h = complete("GET / HTTP/1.1\r\nHOST:   2130706433:80  \r\n\r\n");
        assert_eq!(
            h.host.unwrap().host,
            HostSpec::Ip("127.0.0.1".parse().unwrap())
        );
        assert!(complete("GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n").close);
    }

    #[test]
    fn framing_errors() {
        let cases = [
            ("GET / HTTP/1.1\nHost: a.test\r\n\r\n", HttpError::BareLineEnding),
            ("GET / HTTP/1.1\r\nHost: a.test\n\r\n\r\n", HttpError::BareLineEnding),
            ("GET / HTTP/1.1\r\nHost: a\r.test\r\n\r\n", HttpError::BareLineEnding),
            ("GET / HTTP/1.1\r\nHost: a.test\r\n folded\r\n\r\n", HttpError::ObsFold),
            ("GET / HTTP/1.1\r\nHost : a.test\r\n\r\n", HttpError::BadHeader),
            ("GET / HTTP/1.1\r\nHost: a.test\r\nX: a\0b\r\n\r\n", HttpError::BadHeader),
            ("GET / HTTP/1.1\r\nnocolon\r\n\r\n", HttpError::BadHeader),
            ("GET / HTTP/2.0\r\nHost: a.test\r\n\r\n", HttpError::BadVersion),
            ("GET /  HTTP/1.1\r\nHost: a.test\r\n\r\n", HttpError::BadRequestLine),
            ("GET / HTTP/1.1 x\r\nHost: a.test\r\n\r\n", HttpError::BadRequestLine),
            ("GET nope HTTP/1.1\r\nHost: a.test\r\n\r\n", HttpError::BadTarget),
            (
                "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                HttpError::BadContentLength,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: -1\r\n\r\n",
                HttpError::BadContentLength,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 99999999999999999999\r\n\r\n",
                HttpError::BadContentLength,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                HttpError::BadTransferEncoding,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip\r\n\r\n",
                HttpError::BadTransferEncoding,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                HttpError::BadTransferEncoding,
            ),
            (
                "POST / HTTP/1.0\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n",
                HttpError::BadTransferEncoding,
            ),
        ];
        for (req, want) in cases {
            assert_eq!(malformed(req), want, "{req:?}");
        }
        let h = complete("POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5, 5\r\n\r\n");
        assert_eq!(h.body, Body::Length(5));
        let h = complete(
            "POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: Chunked\r\n\r\n",
        );
        assert_eq!(h.body, Body::Chunked);
    }

    #[test]
    fn early_refusal_and_size_limit() {
        assert_eq!(
            parse_request_head(b"\x16\x03\x01\x02\x00"),
            HeadStatus::Malformed(HttpError::BadRequestLine)
        );
        assert_eq!(
            parse_request_head(b"SSH-2.0-OpenSSH_9\r\n"),
            HeadStatus::Malformed(HttpError::BadRequestLine)
        );
        assert_eq!(
            parse_request_head(b"GET / HTTP/1.1\n"),
            HeadStatus::Malformed(HttpError::BareLineEnding)
        );
        let mut big = b"GET / HTTP/1.1\r\nHost: a.test\r\n".to_vec();
        while big.len() < MAX_HEAD_LEN {
            big.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert_eq!(
            parse_request_head(&big),
            HeadStatus::Malformed(HttpError::HeadTooLarge)
        );
        let mut many = b"GET / HTTP/1.1\r\nHost: a.test\r\n".to_vec();
        for _ in 0..200 {
            many.extend_from_slice(b"X: y\r\n");
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(
            parse_request_head(&many),
            HeadStatus::Malformed(HttpError::TooManyHeaders)
        );
        // Blank lines before a request are skipped and counted.
        let h = complete("\r\n\r\nGET / HTTP/1.1\r\nHost: a.test\r\n\r\n");
        assert_eq!(h.head_len, 4 + 32);
    }

    /// Runs the framer over `data` delivered in pieces of `chunk` bytes and
    /// returns the hosts of every head, or the error.
    fn frame(data: &[u8], chunk: usize) -> Result<Vec<String>, HttpError> {
        let mut framer = RequestFramer::new();
        let mut pending: Vec<u8> = Vec::new();
        let mut fed = 0;
        let mut hosts = Vec::new();
        let mut forwarded = 0usize;
        loop {
            match framer.step(&pending) {
                Step::NeedMore => {
                    if fed == data.len() {
                        assert!(pending.is_empty(), "left over: {pending:?}");
                        assert_eq!(forwarded, data.len());
                        return Ok(hosts);
                    }
                    let end = (fed + chunk).min(data.len());
                    pending.extend_from_slice(&data[fed..end]);
                    fed = end;
                }
                Step::Head(h) => {
                    hosts.push(match h.host.map(|h| h.host) {
                        Some(HostSpec::Name(n)) => n,
                        other => format!("{other:?}"),
                    });
                    pending.drain(..h.head_len);
                    forwarded += h.head_len;
                }
                Step::Forward(n) => {
                    assert!(n > 0 && n <= pending.len());
                    pending.drain(..n);
                    forwarded += n;
                }
                Step::Malformed(e) => return Err(e),
                Step::UpgradePending | Step::Opaque => return Ok(hosts),
            }
        }
    }

    #[test]
    fn keep_alive_requests_are_each_seen() {
        let stream = concat!(
            "POST /a HTTP/1.1\r\nHost: one.test\r\nContent-Length: 11\r\n\r\nhello world",
            "POST /b HTTP/1.1\r\nHost: two.test\r\nTransfer-Encoding: chunked\r\n\r\n",
            "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: yes\r\n\r\n",
            "GET /c HTTP/1.1\r\nHost: three.test\r\n\r\n",
            "\r\nGET /d HTTP/1.1\r\nHost: four.test\r\n\r\n",
        );
        for chunk in [1, 2, 3, 7, 64, 4096] {
            assert_eq!(
                frame(stream.as_bytes(), chunk).unwrap(),
                vec!["one.test", "two.test", "three.test", "four.test"],
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn a_body_cannot_hide_a_request() {
        // The body of the first request looks like a request; it is body.
        let stream = concat!(
            "POST / HTTP/1.1\r\nHost: one.test\r\nContent-Length: 37\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: two.test\r\n\r\n",
        );
        assert_eq!(
            frame(stream.as_bytes(), 5).unwrap(),
            vec!["one.test", "two.test"]
        );
    }

    #[test]
    fn bad_chunks() {
        for body in [
            "zz\r\n",
            "5\nhello\r\n0\r\n\r\n",
            "5\r\nhelloXX0\r\n\r\n",
            "5 x\r\nhello\r\n0\r\n\r\n",
            "11111111111111111\r\n",
            "0\r\nbad trailer\r\n\r\n",
        ] {
            let stream = format!(
                "POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n{body}"
            );
            assert!(
                matches!(frame(stream.as_bytes(), 3), Err(HttpError::BadChunk)),
                "{body:?}"
            );
        }
        let mut trailers = String::from(
            "POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
        );
        for _ in 0..2000 {
            trailers.push_str("X-T: aaaaaaaaaa\r\n");
        }
        assert_eq!(
            frame(trailers.as_bytes(), 100),
            Err(HttpError::TrailersTooLarge)
        );
    }

    #[test]
    fn upgrade_flow() {
        let mut f = RequestFramer::new();
        let req = b"GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n";
        assert!(matches!(f.step(req), Step::Head(_)));
        assert_eq!(f.step(b""), Step::NeedMore);
        assert_eq!(f.step(b"\x81\x05hello"), Step::UpgradePending);
        f.upgrade_accepted();
        assert_eq!(f.step(b"\x81\x05hello"), Step::Opaque);

        let mut f = RequestFramer::new();
        assert!(matches!(f.step(req), Step::Head(_)));
        f.upgrade_refused();
        let next = b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n";
        assert!(matches!(f.step(next), Step::Head(h) if h.host.is_some()));
        assert_eq!(f.requests(), 2);

        assert_eq!(
            response_status(b"HTTP/1.1 101 Switching Protocols\r\n"),
            Ok(Some(101))
        );
        assert_eq!(response_status(b"HTTP/1.0 200\r\n"), Ok(Some(200)));
        assert_eq!(response_status(b"HTTP/1.1 20"), Ok(None));
        assert!(response_status(b"HTTP/1.1 2000 x\r\n").is_err());
        assert!(response_status(b"SSH-2.0\r\n").is_err());
    }

    #[test]
    fn failure_is_sticky() {
        let mut f = RequestFramer::new();
        assert!(matches!(f.step(b"BAD\x01"), Step::Malformed(_)));
        assert!(matches!(
            f.step(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            Step::Malformed(_)
        ));
    }
}
