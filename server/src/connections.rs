//! Every connection is bounded: a listener holds at most so many at once,
//! and closes one that has read nothing for its idle timeout.
//!
//! Without these a client could hold descriptors forever: silent sockets,
//! half-sent requests, keep-alive connections nobody uses. Live clients are
//! never idle that long: the gRPC endpoint pings each connection every
//! third of the timeout ([`keepalive_interval`]) and a client's answer is a
//! read, and the HTTP endpoint's requests are short. A connection over the
//! cap is closed at once (the client sees a reset and retries), so the cap
//! bounds what idle clients can take, and what is left of the process's
//! descriptors stays the store's.

use std::future::Future as _;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// How long an accept waits after the system refused one (out of
/// descriptors): the connections that hold them may close meanwhile.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// What one listener allows.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// A connection that reads nothing for this long is closed.
    pub idle_timeout: Duration,
}

impl ConnectionLimits {
    /// 1,024 connections (at most a quarter of the process's descriptor
    /// limit, so that two listeners leave the store at least half), 60 s idle.
    pub fn defaults() -> Self {
        let descriptors = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        let quarter = descriptors.map_or(usize::MAX, |n| usize::try_from(n / 4).unwrap_or(usize::MAX));
        Self { max_connections: quarter.clamp(16, 1024), idle_timeout: Duration::from_secs(60) }
    }
}

/// How often the gRPC endpoint pings an idle connection: a third of the
/// idle timeout, so a live client answers twice before it would be closed.
pub(crate) fn keepalive_interval(limits: &ConnectionLimits) -> Duration {
    limits.idle_timeout / 3
}

/// A listener that hands out [`Bounded`] connections within its limits:
/// a stream of them for the gRPC server, an [`axum::serve::Listener`] for HTTP.
pub(crate) struct Guarded {
    listener: TcpListener,
    limits: ConnectionLimits,
    permits: Arc<Semaphore>,
    refused: metrics::Counter,
    /// Set after a refused accept: no accept until it ends.
    pause: Option<Pin<Box<Sleep>>>,
}

impl Guarded {
    pub fn new(listener: TcpListener, limits: ConnectionLimits, refused: metrics::Counter) -> Self {
        let permits = Arc::new(Semaphore::new(limits.max_connections));
        Self { listener, limits, permits, refused, pause: None }
    }

    /// The next connection within the cap. Connections over it are closed
    /// here; a refused accept (out of descriptors) is waited out.
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<(Bounded, SocketAddr)> {
        loop {
            if let Some(pause) = self.pause.as_mut() {
                std::task::ready!(pause.as_mut().poll(cx));
                self.pause = None;
            }
            let (stream, peer) = match std::task::ready!(self.listener.poll_accept(cx)) {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; retrying");
                    self.pause = Some(Box::pin(tokio::time::sleep(ACCEPT_RETRY)));
                    continue;
                }
            };
            let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
                self.refused.increment(1);
                tracing::debug!(%peer, max = self.limits.max_connections, "connection over the cap closed");
                continue; // dropping the stream closes it
            };
            // Small answers go out at once: without TCP_NODELAY, Nagle's algorithm and
            // the client's delayed ACK hold each one for up to 40 ms.
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(%peer, error = %e, "TCP_NODELAY refused; connection closed");
                continue;
            }
            return Poll::Ready((Bounded::new(stream, self.limits.idle_timeout, permit), peer));
        }
    }
}

impl tokio_stream::Stream for Guarded {
    type Item = io::Result<Bounded>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_accept(cx).map(|(connection, _)| Some(Ok(connection)))
    }
}

impl axum::serve::Listener for Guarded {
    type Io = Bounded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// A connection that fails its reads once it has read nothing for its idle
/// timeout (the server then closes it), and gives back its place under the
/// cap when dropped.
pub(crate) struct Bounded {
    stream: TcpStream,
    idle_timeout: Duration,
    /// When the connection counts as idle, unless it reads first.
    idle: Pin<Box<Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl Bounded {
    fn new(stream: TcpStream, idle_timeout: Duration, permit: OwnedSemaphorePermit) -> Self {
        let idle = Box::pin(tokio::time::sleep(idle_timeout));
        Self { stream, idle_timeout, idle, _permit: permit }
    }

    /// The first byte the client sent, left to be read (`None`: it closed first).
    pub async fn peek_first_byte(&self) -> io::Result<Option<u8>> {
        let mut first = [0u8; 1];
        let read = self.stream.peek(&mut first).await?;
        Ok((read == 1).then_some(first[0]))
    }
}

impl AsyncRead for Bounded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(read) => {
                let deadline = Instant::now() + this.idle_timeout;
                this.idle.as_mut().reset(deadline);
                Poll::Ready(read)
            }
            Poll::Pending => match this.idle.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let why = format!("nothing read for {:?}", this.idle_timeout);
                    Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Bounded {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}
