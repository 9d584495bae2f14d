//! TLS and plaintext on one gRPC port, as RocketMQ's proxy serves them: the
//! Go client only dials TLS, the Java, C# and C++ ones do by default, and
//! the others speak plaintext.
//!
//! Each accepted connection is sorted by its first byte: `0x16` opens a TLS
//! handshake record, anything else (HTTP/2's preface starts `PRI`) is
//! plaintext. Sorting and handshakes run on a task per connection, so a slow
//! client holds up no other; one that sends nothing within the idle timeout
//! is closed, as an idle connection would be. The certificate is checked by
//! the client: the server never falls back to plaintext on a connection
//! that began a handshake.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::StreamExt as _;

use crate::connections::{Bounded, Guarded};
use crate::error::ServeError;

/// The first byte of a TLS handshake record (a ClientHello).
const HANDSHAKE_RECORD: u8 = 0x16;
/// The largest certificate or key file read.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// The server's certificate chain and private key, ready to accept TLS.
#[derive(Clone)]
pub struct TlsIdentity {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsIdentity")
    }
}

impl TlsIdentity {
    /// Reads a PEM certificate chain (the server's first) and its PEM
    /// private key (PKCS#8, PKCS#1 or SEC1). Errors name the file and what is wrong.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Self, ServeError> {
        let bad = |path: &Path, reason: String| ServeError::Tls { path: path.to_path_buf(), reason };
        let cert_pem = read_pem(cert)?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(cert, format!("not a PEM certificate chain: {e}")))?;
        if chain.is_empty() {
            return Err(bad(cert, "holds no CERTIFICATE block".into()));
        }
        let key_pem = read_pem(key)?;
        let private = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| bad(key, format!("not a PEM private key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(cert, e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(|e| bad(key, format!("does not go with the certificate: {e}")))?;
        // gRPC is HTTP/2 only; clients ask for it by ALPN.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self { acceptor: TlsAcceptor::from(Arc::new(config)) })
    }
}

fn read_pem(path: &Path) -> Result<Vec<u8>, ServeError> {
    use std::io::Read as _;
    let bad = |reason: String| ServeError::Tls { path: PathBuf::from(path), reason };
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let mut pem = Vec::new();
    file.take(MAX_PEM_BYTES + 1).read_to_end(&mut pem).map_err(|e| bad(e.to_string()))?;
    if pem.len() as u64 > MAX_PEM_BYTES {
        return Err(bad(format!("larger than {MAX_PEM_BYTES} bytes")));
    }
    Ok(pem)
}

/// A gRPC connection, plaintext or TLS.
pub(crate) enum Connection {
    Plain(Bounded),
    Tls(Box<TlsStream<Bounded>>),
}

/// The connections `listener` accepts, each sorted as the module says when
/// `tls` is given (else all plaintext, unsorted). Ends when its reader is dropped.
pub(crate) fn sorted(
    mut listener: Guarded,
    tls: Option<TlsIdentity>,
    handshake_timeout: Duration,
) -> impl tokio_stream::Stream<Item = io::Result<Connection>> {
    let (sorted, stream) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.next() => accepted,
                () = sorted.closed() => return,
            };
            let Some(Ok(connection)) = accepted else { return };
            let Some(tls) = tls.clone() else {
                if sorted.send(Ok(Connection::Plain(connection))).await.is_err() {
                    return;
                }
                continue;
            };
            let sorted = sorted.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(handshake_timeout, sort(connection, tls)).await {
                    Ok(Ok(connection)) => {
                        let _ = sorted.send(Ok(connection)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "connection closed before it was served"),
                    Err(_) => tracing::debug!("connection closed: no request or handshake in time"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(stream)
}

/// Plaintext, or TLS once the handshake completes.
async fn sort(connection: Bounded, tls: TlsIdentity) -> io::Result<Connection> {
    match connection.peek_first_byte().await? {
        Some(HANDSHAKE_RECORD) => Ok(Connection::Tls(Box::new(tls.acceptor.accept(connection).await?))),
        Some(_) => Ok(Connection::Plain(connection)),
        None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed before its first byte")),
    }
}

impl AsyncRead for Connection {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(c) => Pin::new(c).poll_read(cx, buf),
            Self::Tls(c) => Pin::new(c.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(c) => Pin::new(c).poll_write(cx, buf),
            Self::Tls(c) => Pin::new(c.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(c) => Pin::new(c).poll_flush(cx),
            Self::Tls(c) => Pin::new(c.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(c) => Pin::new(c).poll_shutdown(cx),
            Self::Tls(c) => Pin::new(c.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(c) => Pin::new(c).poll_write_vectored(cx, bufs),
            Self::Tls(c) => Pin::new(c.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(c) => c.is_write_vectored(),
            Self::Tls(c) => c.is_write_vectored(),
        }
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            Self::Plain(c) => c.connect_info(),
            Self::Tls(c) => c.get_ref().0.connect_info(),
        }
    }
}
