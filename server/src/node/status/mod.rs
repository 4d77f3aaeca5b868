//! The live status page (`--status-addr`): plain HTML, CSS and JavaScript built into
//! the binary, and one JSON answer (`GET /api/status`) the page asks for once a
//! second. Read-only: nothing here proposes, and the answer carries no secret (no
//! session secret, no token hash, no credential).
//!
//! HTTPS with the client port's certificate (plain HTTP only with
//! --insecure-plaintext). The page itself holds no data; the JSON answer needs the
//! admin credential as `Authorization: Bearer <token>`, which the page asks for once
//! and keeps in the tab's session storage.
//!
//! # Layout
//!
//! * `report` — what the page shows, read from the node in one go.
//! * `page.html`, `page.css`, `page.js` — the page; no build step, nothing fetched
//!   from anywhere but this node.

pub mod report;

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::auth::Auth;
use crate::raft::network::Network;
use crate::raft::replica::Replica;
use crate::shell::clock::LogLimiter;
use crate::shell::http::{self, HttpLimits};
use crate::shell::peer_contacts::PeerContacts;
use crate::shell::sources::SourceLimits;
use crate::shell::tls::ServerTls;
use report::{Query, SEARCH_BYTES_MAX};

/// What the status page allows: connections served at once (a browser tab keeps one
/// or two open), a handful per source address (a browser opens a few), a client that
/// reads none of an answer for 10 s closed.
pub const STATUS_LIMITS: HttpLimits = HttpLimits {
    connections: 64,
    sources: SourceLimits { handshakes: 8, connections: 16 },
    header_timeout_ms: 10_000,
    write_timeout_ms: 10_000,
    request_bytes_max: 16 * 1024,
    lifetime_ms: None,
};

const PAGE_HTML: &str = include_str!("page.html");
const PAGE_CSS: &str = include_str!("page.css");
const PAGE_JS: &str = include_str!("page.js");

/// Nothing but this node: no script, style, image or connection from elsewhere, and
/// no framing of the page by another site.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' \
                                       data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
                                       frame-ancestors 'none'";

pub struct StatusPage {
    pub replica: Arc<Replica>,
    pub auth: Arc<Auth>,
    pub contacts: Arc<PeerContacts>,
    /// The peer connections, for asking the leader for its replication progress.
    pub network: Network,
    /// None with --insecure-plaintext.
    pub tls: Option<Arc<ServerTls>>,
    /// Refused requests are logged at most once a second.
    pub refusals: LogLimiter,
}

impl StatusPage {
    pub async fn serve(self: Arc<Self>, listener: TcpListener, stopped: watch::Receiver<bool>) {
        let tls = self.tls.clone();
        http::serve("status", listener, tls, STATUS_LIMITS, stopped, move |request| {
            let page = self.clone();
            async move { page.answer(request).await }
        })
        .await
    }

    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "the status page is read-only: only GET is served\n");
        }
        match request.uri().path() {
            "/" | "/index.html" => asset(PAGE_HTML, "text/html; charset=utf-8"),
            "/page.css" => asset(PAGE_CSS, "text/css; charset=utf-8"),
            "/page.js" => asset(PAGE_JS, "text/javascript; charset=utf-8"),
            "/api/status" => self.status(&request).await,
            _ => plain(StatusCode::NOT_FOUND, "not found: the status page is at /\n"),
        }
    }

    async fn status(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        let token = http::bearer_token(request);
        if !self.auth.is_admin_token(token) {
            if self.refusals.allow() {
                tracing::warn!(
                    target: "audit",
                    port = "status",
                    "refused a status request without the admin credential (logged at most once a second)"
                );
            }
            return plain(StatusCode::UNAUTHORIZED, "the status page needs the admin credential\n");
        }
        let query = match parse_query(request.uri().query().unwrap_or("")) {
            Ok(query) => query,
            Err(problem) => return plain(StatusCode::BAD_REQUEST, &format!("{problem}\n")),
        };
        let report = report::report(&self.replica, &self.contacts, &self.network, &query, self.tls.is_some()).await;
        let body = serde_json::to_vec(&report).expect("a report is plain data");
        let mut response = respond(StatusCode::OK, Bytes::from(body), "application/json");
        response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

fn respond(status: StatusCode, body: Bytes, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert("content-security-policy", HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    response
}

fn asset(text: &'static str, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = respond(StatusCode::OK, Bytes::from_static(text.as_bytes()), content_type);
    response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    respond(status, Bytes::from(text.to_owned()), "text/plain; charset=utf-8")
}

/// `q` (the search) and one offset per table (`locks`, `semaphores`, `elections`,
/// `sessions`); anything else is refused, so a typo does not pass unnoticed.
fn parse_query(query: &str) -> Result<Query, String> {
    let mut parsed = Query::default();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value).ok_or_else(|| format!("{key}: not valid percent-encoded UTF-8"))?;
        let offset = || value.parse::<usize>().map_err(|_| format!("{key}={value:?}: not an offset (a row number)"));
        match key {
            "q" if value.len() > SEARCH_BYTES_MAX => {
                return Err(format!("the search is {} bytes; at most {SEARCH_BYTES_MAX}", value.len()))
            }
            "q" => parsed.search = value.clone(),
            "locks" => parsed.locks = offset()?,
            "semaphores" => parsed.semaphores = offset()?,
            "elections" => parsed.elections = offset()?,
            "sessions" => parsed.sessions = offset()?,
            _ => return Err(format!("unknown parameter {key:?}: q, locks, semaphores, elections or sessions")),
        }
    }
    Ok(parsed)
}

/// A query value: `+` is a space, `%XX` a byte; the bytes must be UTF-8.
fn percent_decode(value: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(value.len());
    let mut input = value.bytes();
    while let Some(byte) = input.next() {
        match byte {
            b'+' => bytes.push(b' '),
            b'%' => {
                let high = (input.next()? as char).to_digit(16)?;
                let low = (input.next()? as char).to_digit(16)?;
                bytes.push((high * 16 + low) as u8);
            }
            byte => bytes.push(byte),
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_names_a_search_and_offsets() {
        let query = parse_query("q=orders%2F4+2&locks=50&sessions=100").unwrap();
        assert_eq!(query, Query { search: "orders/4 2".into(), locks: 50, sessions: 100, ..Query::default() });
        assert_eq!(parse_query("").unwrap(), Query::default());
    }

    #[test]
    fn a_bad_query_is_refused_with_what_is_wrong() {
        assert!(parse_query("locks=-1").unwrap_err().contains("not an offset"));
        assert!(parse_query("lock=1").unwrap_err().contains("unknown parameter \"lock\""));
        assert!(parse_query("q=%ff").unwrap_err().contains("UTF-8"));
        assert!(parse_query("q=%4").unwrap_err().contains("percent"));
        assert!(parse_query(&format!("q={}", "x".repeat(SEARCH_BYTES_MAX + 1))).unwrap_err().contains("at most"));
    }
}
