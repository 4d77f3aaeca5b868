//! turmoil's simulated TCP under the node (`Sockets`) and the client (`Dialer`).
//! Nothing here opens a socket of the operating system: every address is one of
//! turmoil's, inside this process.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use leasehold_server::shell::sockets::{BoxFuture, Connection, Listener, Sockets};

/// The node's connections through turmoil.
pub struct SimulatedSockets;

struct SimulatedListener(turmoil::net::TcpListener);

impl Listener for SimulatedListener {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Box<dyn Connection>, SocketAddr)>> {
        Box::pin(async move {
            let (stream, from) = self.0.accept().await?;
            Ok((Box::new(stream) as Box<dyn Connection>, from))
        })
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

impl Sockets for SimulatedSockets {
    fn bind(&self, address: SocketAddr) -> BoxFuture<'_, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            let listener = turmoil::net::TcpListener::bind(address).await?;
            Ok(Box::new(SimulatedListener(listener)) as Box<dyn Listener>)
        })
    }

    fn connect(&self, authority: String) -> BoxFuture<'static, io::Result<Box<dyn Connection>>> {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(authority).await?;
            Ok(Box::new(stream) as Box<dyn Connection>)
        })
    }
}

/// The client library's dialer through turmoil.
pub fn dialer() -> leasehold::client::Dialer {
    Arc::new(|authority: String| {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(authority).await?;
            Ok(Box::new(stream) as Box<dyn leasehold::client::Connection>)
        })
    })
}
