//! Fenced HTTP services: a tower layer that fences requests on the server, a layer
//! that sets the token on a client's requests, and the fenced key-value service with
//! its client adapter ([`HttpFence`]).
//!
//! # Headers
//!
//! A client sends its grant's token in [`TOKEN_HEADER`] (`Leasehold-Fencing-Token`,
//! decimal) and may choose the mode with [`FENCE_MODE_HEADER`] (`once` or `many`).
//! A request the fence refuses is answered `409 Conflict` with the token the store
//! holds in [`SEEN_HEADER`]; a request without a token `428 Precondition Required`;
//! a malformed or out-of-range token or an unknown mode `400 Bad Request`.
//!
//! # The fenced key-value service
//!
//! [`fenced_kv_service`] (served by [`serve_fenced_kv`], spoken by [`HttpFence`]):
//!
//! | request | answer |
//! |---|---|
//! | `PUT /fenced/<resource>`, token, value as the body | one `write` with the token and the request's mode (many per grant by default): `204`, or `409`; the fence and the value move together, so a `409` with our own token means our earlier `PUT` landed |
//! | `POST /fenced/<resource>`, token, no body | the layer advances the fence, the value stays: `204`, or `409` |
//! | `GET /fenced/<resource>` | `200` with the value and the stored token in `Leasehold-Fencing-Token`; `204` with the token when the fence was only advanced; `404` when nothing was stored |
//!
//! The resource is percent-encoded in one path segment ([`encode_resource`]). Another
//! method on `/fenced/…` is answered `405`, another path `404`, a body over
//! [`MAX_VALUE_BYTES`] `413`, a store that fails `503`.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::header::{HeaderName, HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Body, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::{Layer, Service, ServiceExt};

use super::wire::{Answer, Connection};
use super::{check_resource, check_write, FenceError, FencedStore, FencingToken, Mode, Outcome, Record};

/// [`FencingToken::HEADER_NAME`] in lowercase, as [`HeaderName`] needs it.
pub const TOKEN_HEADER: &str = "leasehold-fencing-token";

/// The header that chooses the mode of a fenced request: `once` or `many`.
pub const FENCE_MODE_HEADER: &str = "leasehold-fence-mode";

/// The header of a `409 Conflict`: the token the store holds for the resource.
pub const SEEN_HEADER: &str = "leasehold-fencing-token-seen";

/// The largest value the fenced key-value service accepts in a `PUT` (1 MiB).
pub const MAX_VALUE_BYTES: usize = 1 << 20;

/// How long [`HttpFence`] waits for a whole exchange unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The path under which the fenced key-value service keeps its resources.
const FENCED_PREFIX: &str = "/fenced/";

/// The largest answer [`HttpFence`] reads.
const MAX_ANSWER_BYTES: usize = 64 << 20;

const _: () = assert!(same_ignoring_case(TOKEN_HEADER, FencingToken::HEADER_NAME));

const fn same_ignoring_case(left: &str, right: &str) -> bool {
    let (left, right) = (left.as_bytes(), right.as_bytes());
    if left.len() != right.len() {
        return false;
    }
    let mut index = 0;
    while index < left.len() {
        if !left[index].eq_ignore_ascii_case(&right[index]) {
            return false;
        }
        index += 1;
    }
    true
}

fn token_header() -> HeaderName {
    HeaderName::from_static(TOKEN_HEADER)
}

fn mode_header() -> HeaderName {
    HeaderName::from_static(FENCE_MODE_HEADER)
}

fn seen_header() -> HeaderName {
    HeaderName::from_static(SEEN_HEADER)
}

/// Sets the token header, and the mode header when `mode` is given, replacing any
/// value they had.
pub fn insert_headers(headers: &mut HeaderMap, token: FencingToken, mode: Option<Mode>) {
    headers.insert(token_header(), HeaderValue::from(token.get()));
    if let Some(mode) = mode {
        headers.insert(mode_header(), HeaderValue::from_static(mode.as_str()));
    }
}

// ===== server: the fence layer

/// What [`FenceService`] puts into the extensions of a request it let through: the
/// fence of `resource` admitted `token` in `mode` before the request went on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedRequest {
    pub resource: String,
    pub token: FencingToken,
    pub mode: Mode,
}

/// A tower layer that advances a fence in `S` before a request reaches the service
/// it wraps.
///
/// `resource_of` names the resource a request writes; a request it returns `None`
/// for passes through untouched (reads, health checks). For the others the token
/// header is required, the fence of the resource is advanced in the request's mode
/// ([`FENCE_MODE_HEADER`], else the layer's, [`Mode::ManyPerGrant`] unless set with
/// [`mode`](Self::mode)), and the inner service sees a [`FencedRequest`] in the
/// request's extensions.
///
/// The check and the inner service's own write are two steps: a newer grant can
/// arrive in between. Let the inner service write through a [`FencedStore`] with the
/// token it is handed to close that gap.
///
/// The layer answers refusals itself (see the [module](self) documentation; a store
/// that fails is `503 Service Unavailable`) with a short plain-text body, so the inner
/// service's response body must implement `From<String>` (`http_body_util::Full`,
/// axum's `Body` and `String` do; map a boxed body into one of them first).
pub struct FenceLayer<S, F> {
    store: Arc<S>,
    resource_of: Arc<F>,
    mode: Mode,
}

impl<S, F> FenceLayer<S, F> {
    pub fn new(store: Arc<S>, resource_of: F) -> Self {
        FenceLayer { store, resource_of: Arc::new(resource_of), mode: Mode::ManyPerGrant }
    }

    /// The mode of a request that does not send [`FENCE_MODE_HEADER`].
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
}

impl<S, F> Clone for FenceLayer<S, F> {
    fn clone(&self) -> Self {
        FenceLayer { store: self.store.clone(), resource_of: self.resource_of.clone(), mode: self.mode }
    }
}

impl<S, F> fmt::Debug for FenceLayer<S, F> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_struct("FenceLayer").field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl<Inner, S, F> Layer<Inner> for FenceLayer<S, F> {
    type Service = FenceService<Inner, S, F>;

    fn layer(&self, inner: Inner) -> Self::Service {
        FenceService { inner, store: self.store.clone(), resource_of: self.resource_of.clone(), mode: self.mode }
    }
}

/// The service [`FenceLayer`] wraps around another.
pub struct FenceService<Inner, S, F> {
    inner: Inner,
    store: Arc<S>,
    resource_of: Arc<F>,
    mode: Mode,
}

impl<Inner: Clone, S, F> Clone for FenceService<Inner, S, F> {
    fn clone(&self) -> Self {
        FenceService {
            inner: self.inner.clone(),
            store: self.store.clone(),
            resource_of: self.resource_of.clone(),
            mode: self.mode,
        }
    }
}

impl<Inner, S, F> fmt::Debug for FenceService<Inner, S, F> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_struct("FenceService").field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl<Inner, S, F, ReqBody, ResBody> Service<Request<ReqBody>> for FenceService<Inner, S, F>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    S: FencedStore + 'static,
    F: Fn(&Request<ReqBody>) -> Option<String>,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = Inner::Error;
    type Future = BoxFuture<'static, Result<Response<ResBody>, Inner::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let Some(resource) = (self.resource_of)(&request) else {
            return Box::pin(self.inner.call(request));
        };
        let (token, mode) = match fence_of(&request, &resource, self.mode) {
            Ok(fence) => fence,
            Err(refusal) => return Box::pin(std::future::ready(Ok(refusal))),
        };
        // The ready service goes into the future; a clone takes its place and is
        // polled ready before the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let store = self.store.clone();
        Box::pin(async move {
            match store.advance(&resource, token, mode).await {
                Ok(Outcome::Accepted) => {
                    request.extensions_mut().insert(FencedRequest { resource, token, mode });
                    inner.call(request).await
                }
                Ok(Outcome::Superseded { seen, .. }) => Ok(superseded(seen)),
                Err(error) => Ok(store_failed(&error)),
            }
        })
    }
}

/// The token and mode of a request, or the answer that refuses it.
fn fence_of<B, R: From<String>>(
    request: &Request<B>,
    resource: &str,
    default_mode: Mode,
) -> Result<(FencingToken, Mode), Response<R>> {
    let headers = request.headers();
    let mut tokens = headers.get_all(TOKEN_HEADER).iter();
    let token = match (tokens.next(), tokens.next()) {
        (None, _) => {
            return Err(plain(
                StatusCode::PRECONDITION_REQUIRED,
                format!("a fenced request needs the {} header", FencingToken::HEADER_NAME),
            ))
        }
        (Some(_), Some(_)) => {
            return Err(plain(StatusCode::BAD_REQUEST, format!("more than one {} header", FencingToken::HEADER_NAME)))
        }
        (Some(value), None) => value
            .to_str()
            .map_err(|_| format!("{:?} is not a fencing token", value))
            .and_then(|text| FencingToken::from_header_value(text).map_err(|error| error.to_string()))
            .map_err(|reason| plain(StatusCode::BAD_REQUEST, reason))?,
    };
    let mode = match headers.get(FENCE_MODE_HEADER) {
        None => default_mode,
        Some(value) => value
            .to_str()
            .map_err(|_| format!("{value:?} is not a fence mode (once or many)"))
            .and_then(|text| text.parse::<Mode>().map_err(|error| error.to_string()))
            .map_err(|reason| plain(StatusCode::BAD_REQUEST, reason))?,
    };
    check_write(resource, token).map_err(|error| plain(StatusCode::BAD_REQUEST, error.to_string()))?;
    Ok((token, mode))
}

fn plain<B: From<String>>(status: StatusCode, reason: String) -> Response<B> {
    let mut response = Response::new(B::from(reason + "\n"));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

fn superseded<B: From<String>>(seen: FencingToken) -> Response<B> {
    let mut response = plain(StatusCode::CONFLICT, format!("superseded: the fence holds token {seen}"));
    response.headers_mut().insert(seen_header(), HeaderValue::from(seen.get()));
    response
}

/// `400` for input the store refused, `503` when it failed (logged, not shown).
fn store_failed<B: From<String>>(error: &FenceError) -> Response<B> {
    match error {
        FenceError::Invalid(reason) => plain(StatusCode::BAD_REQUEST, reason.clone()),
        FenceError::Store { .. } => {
            tracing::warn!(%error, "the fence store failed");
            plain(StatusCode::SERVICE_UNAVAILABLE, "the fence store is unavailable".to_string())
        }
    }
}

// ===== client: a layer that sets the token

/// A tower layer for HTTP clients: sets the token header (and the mode header, if
/// given) on every request.
#[derive(Debug, Clone, Copy)]
pub struct SetFencingTokenLayer {
    token: FencingToken,
    mode: Option<Mode>,
}

impl SetFencingTokenLayer {
    pub fn new(token: FencingToken) -> Self {
        SetFencingTokenLayer { token, mode: None }
    }

    /// Also sends [`FENCE_MODE_HEADER`].
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }
}

impl<S> Layer<S> for SetFencingTokenLayer {
    type Service = SetFencingToken<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SetFencingToken { inner, token: self.token, mode: self.mode }
    }
}

/// The service [`SetFencingTokenLayer`] wraps around a client.
#[derive(Debug, Clone)]
pub struct SetFencingToken<S> {
    inner: S,
    token: FencingToken,
    mode: Option<Mode>,
}

impl<S, B> Service<Request<B>> for SetFencingToken<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        insert_headers(request.headers_mut(), self.token, self.mode);
        self.inner.call(request)
    }
}

// ===== the fenced key-value service

/// A resource as one path segment: ASCII letters, digits and `-._~` stay, every
/// other byte becomes `%XX`.
pub fn encode_resource(resource: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut encoded = String::with_capacity(resource.len());
    for &byte in resource.as_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push('%');
            encoded.push(char::from(HEX[usize::from(byte >> 4)]));
            encoded.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    encoded
}

/// Decodes `%XX` escapes (other characters stay as they are); refuses a `%` not
/// followed by two hex digits and a result that is not UTF-8.
pub fn decode_resource(encoded: &str) -> Result<String, FenceError> {
    let invalid = || FenceError::Invalid(format!("{encoded:?} is not a percent-encoded UTF-8 resource name"));
    let hex = |byte: u8| char::from(byte).to_digit(16).map(|digit| digit as u8);
    let bytes = encoded.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let high = bytes.get(index + 1).copied().and_then(hex).ok_or_else(invalid)?;
            let low = bytes.get(index + 2).copied().and_then(hex).ok_or_else(invalid)?;
            decoded.push(high << 4 | low);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| invalid())
}

/// The resource of a path under `/fenced/`, decoded and checked.
fn resource_in(path: &str) -> Option<Result<String, FenceError>> {
    let encoded = path.strip_prefix(FENCED_PREFIX)?;
    Some(decode_resource(encoded).and_then(|resource| check_resource(&resource).map(|()| resource)))
}

/// The resource callable of the fenced key-value service: a `POST` under `/fenced/`
/// goes through the layer (it only advances the fence); a `PUT` is fenced by its
/// handler in one `write`, so that the fence never moves without the value.
fn fenced_resource<B>(request: &Request<B>) -> Option<String> {
    if request.method() != Method::POST {
        return None;
    }
    resource_in(request.uri().path())?.ok()
}

/// The fenced key-value service: [`FenceLayer`] (many per grant unless the request
/// says otherwise) over [`FencedKvHandler`].
pub type FencedKv<S, B = Incoming> = FenceService<FencedKvHandler<S>, S, fn(&Request<B>) -> Option<String>>;

/// The fenced key-value service on `store` (see the [module](self) documentation for
/// the protocol).
pub fn fenced_kv_service<S, B>(store: Arc<S>) -> FencedKv<S, B>
where
    S: FencedStore + 'static,
{
    let resource_of: fn(&Request<B>) -> Option<String> = fenced_resource::<B>;
    FenceLayer::new(store.clone(), resource_of).layer(FencedKvHandler { store })
}

/// The handler of [`fenced_kv_service`]: a `PUT` writes its value in one fenced
/// `write` (token and mode from its headers), a `POST` the layer admitted answers
/// `204`, a `GET` reads.
pub struct FencedKvHandler<S> {
    store: Arc<S>,
}

impl<S> Clone for FencedKvHandler<S> {
    fn clone(&self) -> Self {
        FencedKvHandler { store: self.store.clone() }
    }
}

impl<S> fmt::Debug for FencedKvHandler<S> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_struct("FencedKvHandler").finish_non_exhaustive()
    }
}

impl<S, B> Service<Request<B>> for FencedKvHandler<S>
where
    S: FencedStore + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Full<Bytes>>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let store = self.store.clone();
        Box::pin(async move { Ok(answer_kv(&*store, request).await) })
    }
}

async fn answer_kv<S: FencedStore, B>(store: &S, request: Request<B>) -> Response<Full<Bytes>>
where
    B: Body,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let resource = match resource_in(request.uri().path()) {
        None => return plain(StatusCode::NOT_FOUND, "not found".to_string()),
        Some(Err(error)) => return plain(StatusCode::BAD_REQUEST, error.to_string()),
        Some(Ok(resource)) => resource,
    };
    let method = request.method().clone();
    let fenced = request.extensions().get::<FencedRequest>().cloned();
    match (&method, fenced) {
        (&Method::GET, _) => match store.read(&resource).await {
            Ok(Some(Record { token, value })) => {
                let mut response = match value {
                    Some(value) => {
                        let mut response = Response::new(Full::from(value));
                        response
                            .headers_mut()
                            .insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
                        response
                    }
                    None => {
                        let mut response = Response::new(Full::default());
                        *response.status_mut() = StatusCode::NO_CONTENT;
                        response
                    }
                };
                response.headers_mut().insert(token_header(), HeaderValue::from(token.get()));
                response
            }
            Ok(None) => plain(StatusCode::NOT_FOUND, format!("nothing is stored for {resource:?}")),
            Err(error) => store_failed(&error),
        },
        (&Method::PUT, _) => {
            let (token, mode) = match fence_of(&request, &resource, Mode::ManyPerGrant) {
                Ok(fence) => fence,
                Err(refusal) => return refusal,
            };
            let value = match read_value(request).await {
                Ok(value) => value,
                Err(refusal) => return refusal,
            };
            match store.write(&resource, token, mode, &value).await {
                Ok(Outcome::Accepted) => no_content(),
                Ok(Outcome::Superseded { seen, .. }) => superseded(seen),
                Err(error) => store_failed(&error),
            }
        }
        (&Method::POST, Some(_)) => no_content(),
        (&Method::POST, None) => {
            // Only when the service is assembled without its fence.
            plain(StatusCode::INTERNAL_SERVER_ERROR, "the request was not fenced".to_string())
        }
        _ => {
            let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "GET, PUT or POST".to_string());
            response.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, PUT, POST"));
            response
        }
    }
}

fn no_content() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::default());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

/// The body of a `PUT`, at most [`MAX_VALUE_BYTES`].
async fn read_value<B>(request: Request<B>) -> Result<Bytes, Response<Full<Bytes>>>
where
    B: Body,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let too_large = || plain(StatusCode::PAYLOAD_TOO_LARGE, format!("a value is at most {MAX_VALUE_BYTES} bytes"));
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_VALUE_BYTES as u64) {
        return Err(too_large());
    }
    match Limited::new(request.into_body(), MAX_VALUE_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(too_large()),
        Err(error) => Err(plain(StatusCode::BAD_REQUEST, format!("reading the body: {error}"))),
    }
}

/// Serves [`fenced_kv_service`] on `listener` over HTTP/1.1 until `shutdown`
/// completes; then it stops accepting, lets the requests in flight finish, closes the
/// connections and returns.
pub async fn serve_fenced_kv<S>(listener: TcpListener, store: Arc<S>, shutdown: impl Future<Output = ()>)
where
    S: FencedStore + 'static,
{
    let service: FencedKv<S> = fenced_kv_service(store);
    let (stop, stopped) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of descriptors, or a connection reset before accept: wait a
                    // little rather than spin.
                    tracing::debug!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let mut stopped = stopped.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| service.clone().oneshot(request));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = async { drop(stopped.wait_for(|stop| *stop).await) } => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
}

// ===== the client adapter

/// A [`FencedStore`] that is a fenced key-value service ([`serve_fenced_kv`], or the
/// Python client's) at a base URL: `write` is a `PUT`, `advance` a `POST`, `read` a
/// `GET`, each with the token and mode headers.
///
/// Plain HTTP only. One idle connection is kept and reused; a request that finds it
/// closed before sending goes over a fresh one. Every exchange (connecting included)
/// has a deadline, [`DEFAULT_TIMEOUT`] unless set with [`timeout`](Self::timeout).
pub struct HttpFence {
    /// `http://host:port/prefix`, for messages.
    base: String,
    /// The `Host` header.
    authority: HeaderValue,
    /// The base URL's path without its trailing `/`.
    prefix: String,
    timeout: Duration,
    connection: Connection,
}

impl fmt::Debug for HttpFence {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_struct("HttpFence").field("base", &self.base).field("timeout", &self.timeout).finish()
    }
}

impl HttpFence {
    /// A client of the service at `base_url` (`http://host:port`, optionally with a
    /// path prefix). Nothing is connected until the first request.
    pub fn new(base_url: &str) -> Result<Self, FenceError> {
        let invalid = |why: &str| FenceError::Invalid(format!("{base_url:?} is not a fenced service URL: {why}"));
        let uri: Uri = base_url.parse().map_err(|error: http::uri::InvalidUri| invalid(&error.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(invalid("HttpFence speaks plain HTTP only")),
            _ => return Err(invalid("it must start with http://")),
        }
        let authority = uri.authority().ok_or_else(|| invalid("it has no host"))?;
        if authority.as_str().contains('@') {
            return Err(invalid("user information is not supported"));
        }
        if uri.query().is_some() {
            return Err(invalid("it has a query"));
        }
        let address = format!("{}:{}", authority.host(), authority.port_u16().unwrap_or(80));
        let prefix = uri.path().trim_end_matches('/').to_string();
        Ok(HttpFence {
            base: format!("http://{}{}", authority, prefix),
            authority: HeaderValue::from_str(authority.as_str())
                .map_err(|_| invalid("its host is not a header value"))?,
            prefix,
            timeout: DEFAULT_TIMEOUT,
            connection: Connection::new(address, MAX_ANSWER_BYTES),
        })
    }

    /// The deadline of one exchange, connecting included.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn fenced(
        &self,
        method: Method,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: Bytes,
    ) -> Result<Outcome, FenceError> {
        check_write(resource, token)?;
        let mut headers = HeaderMap::new();
        insert_headers(&mut headers, token, Some(mode));
        if method == Method::PUT {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
        }
        let answer = self.exchange(method.clone(), resource, headers, value).await?;
        match answer.status {
            StatusCode::NO_CONTENT => Ok(Outcome::Accepted),
            StatusCode::CONFLICT => {
                let seen = answer
                    .headers
                    .get(SEEN_HEADER)
                    .and_then(|value| FencingToken::from_header_value(value.to_str().ok()?).ok())
                    .ok_or_else(|| self.unexpected(&method, resource, &answer, "a 409 without a valid seen token"))?;
                Ok(Outcome::Superseded { seen, ours: token })
            }
            _ => Err(self.unexpected(&method, resource, &answer, "an unexpected answer")),
        }
    }

    /// One request and its whole answer, within the deadline.
    async fn exchange(
        &self,
        method: Method,
        resource: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Answer, FenceError> {
        let path = format!("{}{}{}", self.prefix, FENCED_PREFIX, encode_resource(resource));
        let uri = Uri::try_from(path.as_str())
            .map_err(|error| FenceError::Invalid(format!("{path:?} is not a request path: {error}")))?;
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method.clone();
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        request.headers_mut().insert(HOST, self.authority.clone());
        match tokio::time::timeout(self.timeout, self.connection.send(request)).await {
            Ok(answer) => answer.map_err(|error| {
                FenceError::store("http", format!("{method} {}{path}: {error}", self.base_without_prefix()))
            }),
            Err(_) => Err(FenceError::store(
                "http",
                format!("{method} {}{path}: no answer within {:?}", self.base_without_prefix(), self.timeout),
            )),
        }
    }

    fn base_without_prefix(&self) -> &str {
        &self.base[..self.base.len() - self.prefix.len()]
    }

    fn unexpected(&self, method: &Method, resource: &str, answer: &Answer, what: &str) -> FenceError {
        const EXCERPT_BYTES: usize = 200;
        let excerpt = String::from_utf8_lossy(&answer.body[..answer.body.len().min(EXCERPT_BYTES)]).trim().to_string();
        FenceError::store(
            "http",
            format!("{method} {resource:?} at {}: {what}: {} {excerpt:?}", self.base, answer.status),
        )
    }
}

impl FencedStore for HttpFence {
    fn write(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: &[u8],
    ) -> impl Future<Output = Result<Outcome, FenceError>> + Send {
        let value = Bytes::copy_from_slice(value);
        async move { self.fenced(Method::PUT, resource, token, mode, value).await }
    }

    fn advance(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
    ) -> impl Future<Output = Result<Outcome, FenceError>> + Send {
        self.fenced(Method::POST, resource, token, mode, Bytes::new())
    }

    async fn read(&self, resource: &str) -> Result<Option<Record>, FenceError> {
        check_resource(resource)?;
        let answer = self.exchange(Method::GET, resource, HeaderMap::new(), Bytes::new()).await?;
        let value = match answer.status {
            StatusCode::OK => Some(answer.body.to_vec()),
            StatusCode::NO_CONTENT => None,
            StatusCode::NOT_FOUND => return Ok(None),
            _ => return Err(self.unexpected(&Method::GET, resource, &answer, "an unexpected answer")),
        };
        let token = answer
            .headers
            .get(TOKEN_HEADER)
            .and_then(|value| FencingToken::from_header_value(value.to_str().ok()?).ok())
            .ok_or_else(|| self.unexpected(&Method::GET, resource, &answer, "a record without a valid token"))?;
        Ok(Some(Record { token, value }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    use tokio::net::TcpStream;

    use super::*;

    /// A fenced store in memory: what is under test here is the HTTP layer.
    #[derive(Default)]
    struct Memory {
        records: Mutex<HashMap<String, Record>>,
        down: AtomicBool,
    }

    impl Memory {
        fn apply(
            &self,
            resource: &str,
            token: FencingToken,
            mode: Mode,
            value: Option<&[u8]>,
        ) -> Result<Outcome, FenceError> {
            check_write(resource, token)?;
            if self.down.load(Ordering::SeqCst) {
                return Err(FenceError::store("memory", "down"));
            }
            let mut records = self.records.lock().unwrap();
            let record =
                records.entry(resource.to_string()).or_insert(Record { token: FencingToken::new(0), value: None });
            if !mode.admits(record.token.get(), token.get()) {
                return Ok(Outcome::Superseded { seen: record.token, ours: token });
            }
            record.token = token;
            if let Some(value) = value {
                record.value = Some(value.to_vec());
            }
            Ok(Outcome::Accepted)
        }

        fn get(&self, resource: &str) -> Option<Record> {
            self.records.lock().unwrap().get(resource).cloned()
        }
    }

    impl FencedStore for Memory {
        fn write(
            &self,
            resource: &str,
            token: FencingToken,
            mode: Mode,
            value: &[u8],
        ) -> impl Future<Output = Result<Outcome, FenceError>> + Send {
            std::future::ready(self.apply(resource, token, mode, Some(value)))
        }

        fn advance(
            &self,
            resource: &str,
            token: FencingToken,
            mode: Mode,
        ) -> impl Future<Output = Result<Outcome, FenceError>> + Send {
            std::future::ready(self.apply(resource, token, mode, None))
        }

        fn read(&self, resource: &str) -> impl Future<Output = Result<Option<Record>, FenceError>> + Send {
            std::future::ready(Ok(self.get(resource)))
        }
    }

    fn token(value: u64) -> FencingToken {
        FencingToken::new(value)
    }

    async fn start() -> (SocketAddr, Arc<Memory>, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let store = Arc::new(Memory::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_fenced_kv(listener, store.clone(), async move {
            let _ = stopped.await;
        }));
        (address, store, stop, server)
    }

    /// One request on a connection of its own.
    async fn raw(
        address: SocketAddr,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &'static str,
    ) -> Answer {
        let stream = TcpStream::connect(address).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(connection);
        let mut request = Request::builder().method(method).uri(path).header(HOST, address.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response =
            sender.send_request(request.body(Full::new(Bytes::from_static(body.as_bytes()))).unwrap()).await.unwrap();
        let (parts, body) = response.into_parts();
        Answer { status: parts.status, headers: parts.headers, body: body.collect().await.unwrap().to_bytes() }
    }

    /// What a handler behind the fence was handed, request by request.
    type Handled = Arc<Mutex<Vec<Option<FencedRequest>>>>;

    /// A fence layer over a handler that reports what it was handed.
    fn recording(
        store: Arc<Memory>,
    ) -> (
        impl Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send> + Clone,
        Handled,
    ) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handled = seen.clone();
        let handler = tower::service_fn(move |request: Request<Full<Bytes>>| {
            handled.lock().unwrap().push(request.extensions().get::<FencedRequest>().cloned());
            std::future::ready(Ok::<_, Infallible>(Response::new(Full::from("handled"))))
        });
        let resource_of = |request: &Request<Full<Bytes>>| {
            (request.method() == Method::PUT).then(|| request.uri().path().trim_start_matches('/').to_string())
        };
        (FenceLayer::new(store, resource_of).layer(handler), seen)
    }

    fn put(path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
        let mut request = Request::builder().method(Method::PUT).uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(Full::default()).unwrap()
    }

    #[test]
    fn the_token_header_is_the_lowercased_header_name() {
        assert_eq!(TOKEN_HEADER, FencingToken::HEADER_NAME.to_ascii_lowercase());
        let mut headers = HeaderMap::new();
        insert_headers(&mut headers, token(42), Some(Mode::OncePerGrant));
        assert_eq!(headers.get(FencingToken::HEADER_NAME).unwrap(), "42");
        assert_eq!(headers.get("Leasehold-Fence-Mode").unwrap(), "once");
        insert_headers(&mut headers, token(43), None);
        assert_eq!(headers.get(TOKEN_HEADER).unwrap(), "43");
        assert_eq!(headers.len(), 2);
    }

    #[test]
    fn percent_encodes_a_resource_into_one_path_segment_and_back() {
        let resource = "orders/42 ü%";
        let encoded = encode_resource(resource);
        assert_eq!(encoded, "orders%2F42%20%C3%BC%25");
        assert_eq!(decode_resource(&encoded).unwrap(), resource);
        assert_eq!(encode_resource("a-b.c_d~E9"), "a-b.c_d~E9");
        assert_eq!(decode_resource("orders/42%2f7").unwrap(), "orders/42/7");
        for bad in ["%", "%4", "%zz", "a%g1", "%FF", "%C3"] {
            assert!(matches!(decode_resource(bad), Err(FenceError::Invalid(_))), "{bad:?} must be refused");
        }
    }

    #[tokio::test]
    async fn the_layer_refuses_what_it_cannot_fence() {
        let store = Arc::new(Memory::default());
        let (service, handled) = recording(store.clone());
        let cases: &[(&[(&str, &str)], StatusCode)] = &[
            (&[], StatusCode::PRECONDITION_REQUIRED),
            (&[("leasehold-fencing-token", "abc")], StatusCode::BAD_REQUEST),
            (&[("leasehold-fencing-token", "-1")], StatusCode::BAD_REQUEST),
            (&[("leasehold-fencing-token", "0")], StatusCode::BAD_REQUEST),
            (&[("leasehold-fencing-token", "9223372036854775808")], StatusCode::BAD_REQUEST),
            (&[("leasehold-fencing-token", "5"), ("leasehold-fence-mode", "sometimes")], StatusCode::BAD_REQUEST),
            (&[("leasehold-fencing-token", "5"), ("leasehold-fencing-token", "6")], StatusCode::BAD_REQUEST),
        ];
        for (headers, status) in cases {
            let response = service.clone().oneshot(put("/orders", headers)).await.unwrap();
            assert_eq!(response.status(), *status, "{headers:?}");
            assert_eq!(response.headers().get(CONTENT_TYPE).unwrap(), "text/plain; charset=utf-8");
        }
        // An empty resource is not one a store takes.
        let response = service.clone().oneshot(put("/", &[("leasehold-fencing-token", "5")])).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert!(handled.lock().unwrap().is_empty());
        assert!(store.records.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_layer_hands_the_fence_to_the_handler_and_refuses_superseded_requests() {
        let store = Arc::new(Memory::default());
        let (service, handled) = recording(store.clone());

        let response = service.clone().oneshot(put("/orders/42", &[("Leasehold-Fencing-Token", " 7 ")])).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let once = [("leasehold-fencing-token", "9"), ("leasehold-fence-mode", "once")];
        let response = service.clone().oneshot(put("/orders/42", &once)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            *handled.lock().unwrap(),
            [
                Some(FencedRequest { resource: "orders/42".into(), token: token(7), mode: Mode::ManyPerGrant }),
                Some(FencedRequest { resource: "orders/42".into(), token: token(9), mode: Mode::OncePerGrant }),
            ]
        );
        assert_eq!(store.get("orders/42").unwrap().token, token(9));

        // The same grant again in once-per-grant mode, and an older grant.
        for headers in [&once[..], &[("leasehold-fencing-token", "8")]] {
            let response = service.clone().oneshot(put("/orders/42", headers)).await.unwrap();
            assert_eq!(response.status(), StatusCode::CONFLICT);
            assert_eq!(response.headers().get(SEEN_HEADER).unwrap(), "9");
        }
        // The layer's default mode.
        let strict = FenceLayer::new(store.clone(), |_: &Request<Full<Bytes>>| Some("orders/42".to_string()))
            .mode(Mode::OncePerGrant)
            .layer(tower::service_fn(|_: Request<Full<Bytes>>| {
                std::future::ready(Ok::<_, Infallible>(Response::new(Full::<Bytes>::default())))
            }));
        let response = strict.oneshot(put("/", &[("leasehold-fencing-token", "9")])).await.unwrap();
        assert_eq!(response.status(), StatusCode::CONFLICT);

        // Unfenced requests pass through with nothing in their extensions.
        let get = Request::builder().uri("/orders/42").body(Full::default()).unwrap();
        let response = service.clone().oneshot(get).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(handled.lock().unwrap().len(), 3);
        assert_eq!(handled.lock().unwrap()[2], None);

        // A store that fails.
        store.down.store(true, Ordering::SeqCst);
        let response = service.oneshot(put("/orders/42", &[("leasehold-fencing-token", "10")])).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(handled.lock().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn the_client_layer_sets_the_headers_on_every_request() {
        let client = tower::ServiceBuilder::new()
            .layer(SetFencingTokenLayer::new(token(12)).mode(Mode::ManyPerGrant))
            .service_fn(|request: Request<()>| std::future::ready(Ok::<_, Infallible>(request.headers().clone())));
        let request = Request::builder().header(TOKEN_HEADER, "1").body(()).unwrap();
        let headers = client.oneshot(request).await.unwrap();
        assert_eq!(headers.get(FencingToken::HEADER_NAME).unwrap(), "12");
        assert_eq!(headers.get_all(TOKEN_HEADER).iter().count(), 1);
        assert_eq!(headers.get(FENCE_MODE_HEADER).unwrap(), "many");
    }

    #[tokio::test]
    async fn writes_advances_and_reads_through_the_service() {
        let (address, store, _stop, _server) = start().await;
        let fence = HttpFence::new(&format!("http://{address}")).unwrap();
        let resource = "orders/42 ü%";

        assert_eq!(fence.read(resource).await.unwrap(), None);
        assert_eq!(fence.write(resource, token(5), Mode::OncePerGrant, b"charged").await.unwrap(), Outcome::Accepted);
        assert_eq!(store.get(resource), Some(Record { token: token(5), value: Some(b"charged".to_vec()) }));
        assert_eq!(
            fence.read(resource).await.unwrap(),
            Some(Record { token: token(5), value: Some(b"charged".to_vec()) })
        );

        // A lost answer retried in once-per-grant mode, and a stale grant.
        let retry = fence.write(resource, token(5), Mode::OncePerGrant, b"charged").await.unwrap();
        assert!(retry.is_ours(), "{retry:?}");
        assert_eq!(
            fence.write(resource, token(4), Mode::ManyPerGrant, b"late").await.unwrap(),
            Outcome::Superseded { seen: token(5), ours: token(4) }
        );
        assert_eq!(fence.write(resource, token(5), Mode::ManyPerGrant, b"").await.unwrap(), Outcome::Accepted);
        assert_eq!(fence.read(resource).await.unwrap(), Some(Record { token: token(5), value: Some(Vec::new()) }));

        // Advancing moves the fence and leaves the value.
        assert_eq!(fence.advance(resource, token(8), Mode::OncePerGrant).await.unwrap(), Outcome::Accepted);
        assert_eq!(
            fence.advance(resource, token(8), Mode::OncePerGrant).await.unwrap(),
            Outcome::Superseded { seen: token(8), ours: token(8) }
        );
        assert_eq!(fence.advance(resource, token(8), Mode::ManyPerGrant).await.unwrap(), Outcome::Accepted);
        assert_eq!(fence.read(resource).await.unwrap(), Some(Record { token: token(8), value: Some(Vec::new()) }));
        assert_eq!(
            fence.write(resource, token(7), Mode::ManyPerGrant, b"late").await.unwrap(),
            Outcome::Superseded { seen: token(8), ours: token(7) }
        );

        // A resource only advanced has no value.
        assert_eq!(fence.advance("queue", token(3), Mode::ManyPerGrant).await.unwrap(), Outcome::Accepted);
        assert_eq!(fence.read("queue").await.unwrap(), Some(Record { token: token(3), value: None }));

        // Checked before anything is sent.
        assert!(matches!(fence.write("", token(1), Mode::ManyPerGrant, b"x").await, Err(FenceError::Invalid(_))));
        assert!(matches!(fence.advance("x", token(0), Mode::ManyPerGrant).await, Err(FenceError::Invalid(_))));
        assert!(matches!(fence.read(&"x".repeat(513)).await, Err(FenceError::Invalid(_))));
    }

    #[tokio::test]
    async fn answers_the_protocol_on_the_wire() {
        let (address, store, _stop, _server) = start().await;
        let path = format!("/fenced/{}", encode_resource("orders/42 ü%"));
        let put =
            |headers: &'static [(&'static str, &'static str)], body| raw(address, Method::PUT, &path, headers, body);

        assert_eq!(put(&[], "v").await.status, StatusCode::PRECONDITION_REQUIRED);
        assert_eq!(put(&[("Leasehold-Fencing-Token", "x")], "v").await.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            put(&[("Leasehold-Fencing-Token", "3"), ("Leasehold-Fence-Mode", "ONCE")], "v").await.status,
            StatusCode::BAD_REQUEST
        );
        assert!(store.records.lock().unwrap().is_empty());

        assert_eq!(put(&[("Leasehold-Fencing-Token", "3")], "v3").await.status, StatusCode::NO_CONTENT);
        let refused = put(&[("Leasehold-Fencing-Token", "2")], "v2").await;
        assert_eq!(refused.status, StatusCode::CONFLICT);
        assert_eq!(refused.headers.get("Leasehold-Fencing-Token-Seen").unwrap(), "3");

        let read = raw(address, Method::GET, &path, &[], "").await;
        assert_eq!(read.status, StatusCode::OK);
        assert_eq!(read.headers.get(FencingToken::HEADER_NAME).unwrap(), "3");
        assert_eq!(read.body, "v3");
        // A read needs no token, and a raw `/` in the path is the same resource.
        let read = raw(address, Method::GET, "/fenced/orders/42%20%c3%bc%25", &[], "").await;
        assert_eq!(read.body, "v3");

        let posted = raw(address, Method::POST, "/fenced/jobs", &[("Leasehold-Fencing-Token", "4")], "").await;
        assert_eq!(posted.status, StatusCode::NO_CONTENT);
        let read = raw(address, Method::GET, "/fenced/jobs", &[], "").await;
        assert_eq!(
            (read.status, read.headers.get(TOKEN_HEADER).unwrap().to_str().unwrap()),
            (StatusCode::NO_CONTENT, "4")
        );

        assert_eq!(raw(address, Method::GET, "/fenced/nothing", &[], "").await.status, StatusCode::NOT_FOUND);
        assert_eq!(raw(address, Method::GET, "/other", &[], "").await.status, StatusCode::NOT_FOUND);
        assert_eq!(raw(address, Method::GET, "/fenced/%zz", &[], "").await.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            raw(address, Method::PUT, "/fenced/%FF", &[("Leasehold-Fencing-Token", "5")], "").await.status,
            StatusCode::BAD_REQUEST
        );
        let deleted = raw(address, Method::DELETE, &path, &[("Leasehold-Fencing-Token", "5")], "").await;
        assert_eq!(deleted.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(deleted.headers.get(ALLOW).unwrap(), "GET, PUT, POST");
    }

    #[tokio::test]
    async fn refuses_a_value_over_the_limit() {
        let (address, store, _stop, _server) = start().await;
        let fence = HttpFence::new(&format!("http://{address}/")).unwrap();
        let error = fence.write("big", token(1), Mode::ManyPerGrant, &vec![7; MAX_VALUE_BYTES + 1]).await.unwrap_err();
        assert!(
            matches!(error, FenceError::Store { store: "http", .. }) && error.to_string().contains("413"),
            "{error}"
        );
        // A PUT is one write: a refused body moves neither the fence nor the value.
        assert_eq!(store.get("big"), None);
        assert_eq!(
            fence.write("big", token(1), Mode::ManyPerGrant, &vec![7; MAX_VALUE_BYTES]).await.unwrap(),
            Outcome::Accepted
        );
    }

    #[tokio::test]
    async fn reports_a_failing_store_and_a_silent_service_as_store_errors() {
        let (address, store, _stop, _server) = start().await;
        let fence = HttpFence::new(&format!("http://{address}")).unwrap();
        store.down.store(true, Ordering::SeqCst);
        let error = fence.write("orders/1", token(1), Mode::ManyPerGrant, b"x").await.unwrap_err();
        assert!(error.to_string().contains("503"), "{error}");

        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_address = silent.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = silent.accept().await {
                held.push(stream);
            }
        });
        let fence = HttpFence::new(&format!("http://{silent_address}")).unwrap().timeout(Duration::from_millis(200));
        let error = fence.read("orders/1").await.unwrap_err();
        assert!(
            matches!(error, FenceError::Store { store: "http", .. }) && error.to_string().contains("no answer"),
            "{error}"
        );
        held.abort();
    }

    #[test]
    fn takes_plain_http_base_urls_only() {
        assert!(matches!(HttpFence::new("https://fence.example:8443"), Err(FenceError::Invalid(_))));
        assert!(matches!(HttpFence::new("fence.example:80"), Err(FenceError::Invalid(_))));
        assert!(matches!(HttpFence::new("http://user@fence.example"), Err(FenceError::Invalid(_))));
        assert!(matches!(HttpFence::new("http://fence.example/?x=1"), Err(FenceError::Invalid(_))));
        let fence = HttpFence::new("http://[::1]:8080/api/").unwrap();
        assert_eq!((fence.connection.address(), fence.prefix.as_str()), ("[::1]:8080", "/api"));
        let fence = HttpFence::new("http://fence.example").unwrap();
        assert_eq!(
            (fence.connection.address(), fence.prefix.as_str(), fence.base.as_str()),
            ("fence.example:80", "", "http://fence.example")
        );
    }

    #[tokio::test]
    async fn reuses_a_connection_and_stops_on_shutdown() {
        let (address, _store, stop, server) = start().await;
        let fence = HttpFence::new(&format!("http://{address}")).unwrap();
        for value in 1..=3 {
            assert_eq!(fence.advance("r", token(value), Mode::OncePerGrant).await.unwrap(), Outcome::Accepted);
            assert!(fence.connection.has_idle(), "the connection is kept");
        }
        // The idle connection does not hold the server up.
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server).await.expect("the server stopped").unwrap();
        assert!(fence.read("r").await.is_err());
    }
}
