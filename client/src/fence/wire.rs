//! One HTTP/1.1 connection kept between requests, for the adapters that speak HTTP to
//! their store ([`super::http`], [`super::s3`]).

use std::error::Error as StdError;
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// What a server answered.
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Requests to one `host:port`, over the connection the last request left idle or a
/// new one when there is none (or it was closed).
pub(crate) struct Connection {
    address: String,
    max_answer_bytes: usize,
    idle: Mutex<Option<SendRequest<Full<Bytes>>>>,
}

impl Connection {
    pub fn new(address: String, max_answer_bytes: usize) -> Self {
        Connection { address, max_answer_bytes, idle: Mutex::new(None) }
    }

    /// The `host:port` requests go to.
    #[cfg(test)]
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Whether a connection waits for the next request.
    #[cfg(test)]
    pub fn has_idle(&self) -> bool {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    pub async fn send(&self, mut request: Request<Full<Bytes>>) -> Result<Answer, Box<dyn StdError + Send + Sync>> {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(mut sender) = idle.filter(|sender| !sender.is_closed()) {
            if sender.ready().await.is_ok() {
                match sender.try_send_request(request).await {
                    Ok(response) => return self.finish(sender, response).await,
                    // Not sent: the idle connection was closed under us.
                    Err(mut error) => match error.take_message() {
                        Some(unsent) => request = unsent,
                        None => return Err(error.into_error().into()),
                    },
                }
            }
        }
        let stream = TcpStream::connect(self.address.as_str()).await?;
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let response = sender.send_request(request).await?;
        self.finish(sender, response).await
    }

    /// Reads the answer's body and keeps the connection for the next request.
    async fn finish(
        &self,
        sender: SendRequest<Full<Bytes>>,
        response: Response<Incoming>,
    ) -> Result<Answer, Box<dyn StdError + Send + Sync>> {
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, self.max_answer_bytes).collect().await?.to_bytes();
        if !sender.is_closed() {
            *self.idle.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender);
        }
        Ok(Answer { status: parts.status, headers: parts.headers, body })
    }
}
