//! Fenced writes to an S3 bucket with conditional writes (feature `fence-s3`): S3
//! itself, and the servers that implement `If-Match` and `If-None-Match: *` on
//! `PutObject` like it.
//!
//! A resource is one object, `leasehold/fence/<resource>` by default. Its body is a
//! 26-byte header and the value: `LHF1`, the token as 20 zero-padded digits, `v` (a
//! value follows, possibly empty) or `-` (the fence was only advanced), `\n`. A write
//! reads the object, compares the tokens, and puts the new body on the condition that
//! the object is still the one it read (`If-Match` with the ETag it read, or
//! `If-None-Match: *` when there was none); when another writer came between, the
//! store refuses the put (412) and the write starts again from the read. The store
//! decides, in the same step as the write, so a paused writer's late put is refused
//! by S3, not by the client.
//!
//! The token sits in the body, not in metadata, because the ETag of an object put in
//! one piece is the MD5 of its body: with the token elsewhere, a newer token writing
//! the same bytes would leave the ETag as it was, and a stale writer's `If-Match`
//! would still match. Tokens in the store only grow, so no object ever has the body
//! a stale writer read again.
//!
//! Durable once the put is answered (S3's own guarantee); linearizable per object.
//! Cost: a GET and a PUT per write, another pair for each writer that came between.
//! Requests are signed with AWS Signature Version 4 and sent over plain HTTP, to a
//! path-style address (`http://host:port/bucket/key`): an S3 service behind TLS needs
//! a proxy on the writer's host (`https` is refused rather than sent in the clear).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH, ETAG, HOST};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::Full;
use ring::{digest, hmac};

use super::wire::{Answer, Connection};
use super::{check_resource, check_write, FenceError, FencedStore, FencingToken, Mode, Outcome, Record};

const STORE: &str = "s3";

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "leasehold/fence/";

/// How long one request may take, connecting included, unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The rounds of read and conditional put a write tries before it gives up.
const ROUNDS_MAX: u32 = 100;

/// The largest object read.
const MAX_ANSWER_BYTES: usize = 64 << 20;

const MAGIC: &[u8; 4] = b"LHF1";
const HEADER_BYTES: usize = 26;
const WITH_VALUE: u8 = b'v';
const FENCE_ONLY: u8 = b'-';

/// The body of a fence object: the header, then the value.
fn encode(token: FencingToken, value: Option<&[u8]>) -> Vec<u8> {
    let value_bytes = value.map_or(0, <[u8]>::len);
    let mut body = Vec::with_capacity(HEADER_BYTES + value_bytes);
    body.extend_from_slice(MAGIC);
    body.extend_from_slice(super::padded(token.get()).as_bytes());
    body.push(if value.is_some() { WITH_VALUE } else { FENCE_ONLY });
    body.push(b'\n');
    body.extend_from_slice(value.unwrap_or_default());
    body
}

/// A fence object's token and value.
fn decode(key: &str, body: &[u8]) -> Result<Record, FenceError> {
    let not_ours = || FenceError::store(STORE, format!("object {key:?} is not a Leasehold fence object"));
    if body.len() < HEADER_BYTES || &body[..4] != MAGIC || body[HEADER_BYTES - 1] != b'\n' {
        return Err(not_ours());
    }
    let digits = &body[4..24];
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(not_ours());
    }
    let token = super::parse_stored(STORE, digits)?;
    let value = match body[24] {
        WITH_VALUE => Some(body[HEADER_BYTES..].to_vec()),
        FENCE_ONLY if body.len() == HEADER_BYTES => None,
        _ => return Err(not_ours()),
    };
    Ok(Record { token, value })
}

/// Where a bucket is and who may write it.
#[derive(Clone)]
struct Credentials {
    access_key: String,
    secret_key: String,
    region: String,
}

/// Fenced objects in one S3 bucket.
pub struct S3Fence {
    /// `host:port`, the `Host` header.
    authority: String,
    bucket: String,
    prefix: String,
    credentials: Credentials,
    timeout: Duration,
    connection: Connection,
}

impl fmt::Debug for S3Fence {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("S3Fence")
            .field("authority", &self.authority)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("region", &self.credentials.region)
            .field("access_key", &self.credentials.access_key)
            .finish_non_exhaustive()
    }
}

impl S3Fence {
    /// A fence for the bucket a URL names:
    /// `http://ACCESS_KEY:SECRET_KEY@host:port/bucket?region=REGION` (key and secret
    /// percent-encoded; region `us-east-1` when not given). Nothing is connected until
    /// the first request; a connection that broke is replaced by the next request.
    pub fn connect(url: &str) -> Result<Self, FenceError> {
        let invalid = |why: &str| FenceError::Invalid(format!("{} is not an S3 fence URL: {why}", redacted(url)));
        let uri: Uri = url.parse().map_err(|_| invalid("it does not parse"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(invalid("S3Fence speaks plain HTTP only (put TLS in a local proxy)")),
            _ => return Err(invalid("it must start with http://")),
        }
        let authority = uri.authority().ok_or_else(|| invalid("it has no host"))?.as_str();
        let (user, host) = authority.rsplit_once('@').ok_or_else(|| invalid("it has no ACCESS_KEY:SECRET_KEY@"))?;
        let (access_key, secret_key) = user.split_once(':').ok_or_else(|| invalid("it has no :SECRET_KEY"))?;
        let (access_key, secret_key) = (
            percent_decode(access_key).ok_or_else(|| invalid("the access key is not percent-encoded UTF-8"))?,
            percent_decode(secret_key).ok_or_else(|| invalid("the secret key is not percent-encoded UTF-8"))?,
        );
        let bucket = uri.path().trim_matches('/');
        if bucket.is_empty() || bucket.contains('/') {
            return Err(invalid("its path must be the bucket's name, and only that"));
        }
        let mut region = "us-east-1".to_string();
        for pair in uri.query().unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
            match pair.split_once('=') {
                Some(("region", value)) if !value.is_empty() => region = value.to_string(),
                _ => return Err(invalid(&format!("unknown query parameter {pair:?} (only region=)"))),
            }
        }
        let host = if host.contains(':') { host.to_string() } else { format!("{host}:80") };
        Ok(S3Fence {
            authority: host.clone(),
            bucket: bucket.to_string(),
            prefix: DEFAULT_PREFIX.to_string(),
            credentials: Credentials { access_key, secret_key, region },
            timeout: DEFAULT_TIMEOUT,
            connection: Connection::new(host, MAX_ANSWER_BYTES),
        })
    }

    /// Keys `prefix + resource` instead of [`DEFAULT_PREFIX`].
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_string();
        self
    }

    /// The deadline of one request, connecting included.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Puts the object of the layout with no condition and no comparison: a stale
    /// writer's write lands. What a fenced write costs is measured against it, and a
    /// tool that moves data between buckets may use it; a worker never should.
    pub async fn write_unfenced(&self, resource: &str, token: FencingToken, value: &[u8]) -> Result<(), FenceError> {
        check_write(resource, token)?;
        let key = self.key(resource);
        let answer = self.request(Method::PUT, &key, None, Bytes::from(encode(token, Some(value)))).await?;
        if answer.status.is_success() {
            Ok(())
        } else {
            Err(self.unexpected(&Method::PUT, &key, &answer))
        }
    }

    /// Deletes the resource's object: its fence is gone, and any token may write it
    /// next. For resources no longer used, never while a holder may still write.
    pub async fn forget(&self, resource: &str) -> Result<(), FenceError> {
        check_resource(resource)?;
        let key = self.key(resource);
        let answer = self.request(Method::DELETE, &key, None, Bytes::new()).await?;
        if answer.status.is_success() {
            Ok(())
        } else {
            Err(self.unexpected(&Method::DELETE, &key, &answer))
        }
    }

    fn key(&self, resource: &str) -> String {
        format!("{}{}", self.prefix, resource)
    }

    async fn run(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: Option<&[u8]>,
    ) -> Result<Outcome, FenceError> {
        check_write(resource, token)?;
        let key = self.key(resource);
        let mut pause_ms = 1u64;
        for _ in 0..ROUNDS_MAX {
            let (condition, body) = match self.get(&key).await? {
                None => (("if-none-match", "*".to_string()), encode(token, value)),
                Some((stored, etag)) => {
                    if !mode.admits(stored.token.get(), token.get()) {
                        return Ok(Outcome::Superseded { seen: stored.token, ours: token });
                    }
                    // An advance keeps what the object holds, value or not.
                    let kept = if value.is_some() { value } else { stored.value.as_deref() };
                    (("if-match", etag), encode(token, kept))
                }
            };
            let answer = self.request(Method::PUT, &key, Some(condition), Bytes::from(body)).await?;
            match answer.status {
                status if status.is_success() => return Ok(Outcome::Accepted),
                // Another writer came between the read and the put: read again.
                StatusCode::PRECONDITION_FAILED | StatusCode::CONFLICT => {
                    let jitter = crate::random::in_range(0..=pause_ms);
                    tokio::time::sleep(Duration::from_millis(pause_ms + jitter)).await;
                    pause_ms = (pause_ms * 2).min(20);
                }
                _ => return Err(self.unexpected(&Method::PUT, &key, &answer)),
            }
        }
        Err(FenceError::store(
            STORE,
            format!("{ROUNDS_MAX} conditional puts of {key:?} in a row lost to other writers; try again"),
        ))
    }

    /// The object and its ETag, `None` when there is none.
    async fn get(&self, key: &str) -> Result<Option<(Record, String)>, FenceError> {
        let answer = self.request(Method::GET, key, None, Bytes::new()).await?;
        match answer.status {
            // Not a missing bucket (`NoSuchBucket`), which is an error.
            StatusCode::NOT_FOUND if answer.body.windows(10).any(|code| code == b"NoSuchKey<") => Ok(None),
            StatusCode::OK => {
                let etag = answer
                    .headers
                    .get(ETAG)
                    .and_then(|etag| etag.to_str().ok())
                    .ok_or_else(|| FenceError::store(STORE, format!("GET {key:?} answered without an ETag")))?;
                Ok(Some((decode(key, &answer.body)?, etag.to_string())))
            }
            _ => Err(self.unexpected(&Method::GET, key, &answer)),
        }
    }

    /// One signed request for `key`, with an optional precondition header.
    async fn request(
        &self,
        method: Method,
        key: &str,
        condition: Option<(&'static str, String)>,
        body: Bytes,
    ) -> Result<Answer, FenceError> {
        let path = format!("/{}/{}", uri_encode(&self.bucket), uri_encode(key));
        let uri = Uri::try_from(path.as_str())
            .map_err(|error| FenceError::Invalid(format!("{path:?} is not a request path: {error}")))?;
        let mut headers = vec![("host", self.authority.clone())];
        if let Some((name, value)) = condition {
            headers.push((name, value));
        }
        let signed = sign(&self.credentials, method.as_str(), &path, &mut headers, &body, SystemTime::now());
        let mut request = Request::new(Full::new(body.clone()));
        *request.method_mut() = method.clone();
        *request.uri_mut() = uri;
        let map = request.headers_mut();
        for (name, value) in headers.iter().chain(std::iter::once(&("authorization", signed))) {
            let value = HeaderValue::from_str(value)
                .map_err(|_| FenceError::Invalid(format!("the {name} header would not be a header value")))?;
            map.insert(*name, value);
        }
        if method == Method::PUT {
            map.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        debug_assert!(map.contains_key(HOST));
        let failed = |why: String| FenceError::store(STORE, format!("{method} {}{path}: {why}", self.authority));
        match tokio::time::timeout(self.timeout, self.connection.send(request)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(failed(error.to_string())),
            Err(_) => Err(failed(format!("no answer within {:?}", self.timeout))),
        }
    }

    fn unexpected(&self, method: &Method, key: &str, answer: &Answer) -> FenceError {
        const EXCERPT_BYTES: usize = 300;
        let excerpt = String::from_utf8_lossy(&answer.body[..answer.body.len().min(EXCERPT_BYTES)]).trim().to_string();
        FenceError::store(STORE, format!("{method} {key:?} in bucket {}: {} {excerpt}", self.bucket, answer.status))
    }
}

impl FencedStore for S3Fence {
    async fn write(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: &[u8],
    ) -> Result<Outcome, FenceError> {
        self.run(resource, token, mode, Some(value)).await
    }

    async fn advance(&self, resource: &str, token: FencingToken, mode: Mode) -> Result<Outcome, FenceError> {
        self.run(resource, token, mode, None).await
    }

    async fn read(&self, resource: &str) -> Result<Option<Record>, FenceError> {
        check_resource(resource)?;
        Ok(self.get(&self.key(resource)).await?.map(|(record, _)| record))
    }
}

/// The URL with its secret key left out, for messages.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let user = &url[scheme_end + 3..at];
            let access = user.split(':').next().unwrap_or_default();
            format!("{}{access}:…{}", &url[..scheme_end + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = std::str::from_utf8(bytes.get(index + 1..index + 3)?).ok()?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

/// A key or bucket in a path, as Signature Version 4 wants it: every byte but the
/// unreserved ones and `/` percent-encoded.
fn uri_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~' | b'/') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn hmac_sha256(key: &[u8], data: &str) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes()).as_ref().to_vec()
}

/// `20261205T120000Z` for a time.
fn amz_date(now: SystemTime) -> String {
    let seconds = now.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let (days, of_day) = ((seconds / 86_400) as i64, seconds % 86_400);
    let (year, month, day) = crate::calendar::date_of_unix_day(days);
    format!("{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z", of_day / 3_600, of_day % 3_600 / 60, of_day % 60)
}

/// Signs a request (AWS Signature Version 4, service `s3`): adds `x-amz-date` and
/// `x-amz-content-sha256` to `headers` (lower-case names; `host` among them) and
/// returns the `Authorization` header. Every header in `headers` is signed.
fn sign(
    credentials: &Credentials,
    method: &str,
    path: &str,
    headers: &mut Vec<(&'static str, String)>,
    body: &[u8],
    now: SystemTime,
) -> String {
    let date_time = amz_date(now);
    let payload = hex(digest::digest(&digest::SHA256, body).as_ref());
    headers.push(("x-amz-content-sha256", payload.clone()));
    headers.push(("x-amz-date", date_time.clone()));
    headers.sort_by_key(|(name, _)| *name);
    let canonical_headers: String = headers.iter().map(|(name, value)| format!("{name}:{}\n", value.trim())).collect();
    let signed_headers = headers.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(";");
    let canonical_request = format!("{method}\n{path}\n\n{canonical_headers}\n{signed_headers}\n{payload}");
    let date = &date_time[..8];
    let scope = format!("{date}/{}/s3/aws4_request", credentials.region);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{date_time}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical_request.as_bytes()).as_ref())
    );
    let mut key = hmac_sha256(format!("AWS4{}", credentials.secret_key).as_bytes(), date);
    for part in [credentials.region.as_str(), "s3", "aws4_request"] {
        key = hmac_sha256(&key, part);
    }
    let signature = hex(&hmac_sha256(&key, &string_to_sign));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        credentials.access_key
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_the_one_the_reference_signer_computes() {
        // The same request signed by botocore's S3SigV4Auth at the same instant.
        let credentials = Credentials {
            access_key: "AKIDEXAMPLE".to_string(),
            secret_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".to_string(),
            region: "us-east-1".to_string(),
        };
        let path = format!("/leasehold/{}", uri_encode("leasehold/fence/a b+c~d"));
        assert_eq!(path, "/leasehold/leasehold/fence/a%20b%2Bc~d");
        let mut headers = vec![("host", "127.0.0.1:19000".to_string()), ("if-match", "\"abc\"".to_string())];
        let noon = UNIX_EPOCH + Duration::from_secs(1_796_472_000);
        assert_eq!(amz_date(noon), "20261205T120000Z");
        let authorization = sign(&credentials, "PUT", &path, &mut headers, b"hello", noon);
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261205/us-east-1/s3/aws4_request, \
             SignedHeaders=host;if-match;x-amz-content-sha256;x-amz-date, \
             Signature=6f5594a7ef82ce8ce47c16a696673546b7233fb64c513086a6b37efa7a0d65a3"
        );
    }

    #[test]
    fn a_body_holds_the_token_the_flag_and_the_value() {
        let token = FencingToken::new(42);
        let body = encode(token, Some(b"v"));
        assert_eq!(body, b"LHF100000000000000000042v\nv");
        assert_eq!(decode("k", &body).unwrap(), Record { token, value: Some(b"v".to_vec()) });
        assert_eq!(decode("k", &encode(token, None)).unwrap(), Record { token, value: None });
        assert_eq!(decode("k", &encode(token, Some(b""))).unwrap().value, Some(Vec::new()), "an empty value");
        for broken in [&b"hello"[..], b"LHF1000000000000000000x2v\n", b"LHF100000000000000000042-\nvalue"] {
            assert!(decode("k", broken).is_err(), "{:?}", String::from_utf8_lossy(broken));
        }
    }

    #[test]
    fn urls_name_the_bucket_and_carry_the_keys() {
        let fence = S3Fence::connect("http://AK:se%2Fc%2Bret@127.0.0.1:19000/bucket?region=eu-west-1").unwrap();
        assert_eq!((fence.authority.as_str(), fence.bucket.as_str()), ("127.0.0.1:19000", "bucket"));
        assert_eq!(fence.credentials.secret_key, "se/c+ret");
        assert_eq!(fence.credentials.region, "eu-west-1");
        for bad in [
            "https://AK:S@host/bucket",
            "http://host:1/bucket",
            "http://AK:S@host:1/",
            "http://AK:S@host:1/a/b",
            "http://AK:S@host:1/b?zone=x",
        ] {
            let error = S3Fence::connect(bad).unwrap_err();
            assert!(matches!(error, FenceError::Invalid(_)), "{bad}: {error}");
            assert!(!error.to_string().contains(":S@"), "the secret stays out of messages: {error}");
        }
    }
}
