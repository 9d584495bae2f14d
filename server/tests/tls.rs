//! TLS and plaintext on one gRPC port: a client that trusts the server's
//! certificate sends and receives over TLS, a plaintext one on the same port
//! too, a client that does not trust it is refused (never downgraded), and
//! bad certificate or key files are errors naming the file.

#[allow(dead_code)]
mod client;

use std::path::Path;
use std::time::Duration;

use delaywheel_server::proto::messaging_service_client::MessagingServiceClient;
use delaywheel_server::{HandleKey, ServeError, ServeOptions, TlsIdentity};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use client::*;

/// A self-signed certificate for localhost, written as PEM files into `dir`: (cert, key, cert PEM).
fn self_signed(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    (cert, key, made.cert.pem())
}

async fn tls_client(
    grpc: std::net::SocketAddr,
    trusted: Option<&str>,
) -> Result<MessagingServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new().domain_name("localhost");
    if let Some(pem) = trusted {
        tls = tls.ca_certificate(Certificate::from_pem(pem));
    }
    let channel = Channel::from_shared(format!("https://localhost:{}", grpc.port()))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    Ok(MessagingServiceClient::new(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_plaintext_share_the_port_and_an_untrusted_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(files.path());
    let tls = TlsIdentity::from_pem_files(&cert, &key).unwrap();
    let options = ServeOptions { tls: Some(tls), ..ServeOptions::loopback(HandleKey::from_bytes([3; 32])) };
    let mut server = start_with(dir.path(), options).await;

    let mut secure = tls_client(server.grpc, Some(&pem)).await.expect("a client that trusts the certificate");
    let sent = send(&mut secure, vec![message("T", "m1", "over TLS", None)]).await;
    assert_eq!(code(&sent.status), delaywheel_server::proto::Code::Ok);
    // The plaintext client `start_with` made, on the same port, receives it.
    let (got, _) =
        receive(&mut server.client, "G", "T", Duration::from_secs(30), Duration::from_secs(5)).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["over TLS"]);
    // And the TLS client acks it.
    assert_eq!(ack(&mut secure, "G", "T", &got[0]).await, delaywheel_server::proto::Code::Ok);

    // A client that does not trust the certificate gets no connection, and no plaintext either.
    let untrusted = match tls_client(server.grpc, None).await {
        Err(e) => format!("{e:?}"),
        Ok(mut client) => {
            let request = delaywheel_server::proto::HeartbeatRequest::default();
            format!("{:?}", client.heartbeat(request).await.expect_err("refused by the client"))
        }
    };
    assert!(untrusted.contains("UnknownIssuer"), "{untrusted}");
    drop(secure);
    server.stop().await;
}

#[test]
fn bad_certificate_or_key_files_name_the_file() {
    let files = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(files.path());
    let other = tempfile::tempdir().unwrap();
    let (_, other_key, _) = self_signed(other.path());
    let garbage = files.path().join("garbage.pem");
    std::fs::write(&garbage, "not PEM at all").unwrap();
    let missing = files.path().join("missing.pem");
    let cases = [
        (&missing, &key, "missing.pem"),
        (&garbage, &key, "garbage.pem: holds no CERTIFICATE block"),
        (&cert, &garbage, "garbage.pem: not a PEM private key"),
        (&cert, &other_key, "does not go with the certificate"),
    ];
    for (cert, key, expected) in cases {
        let error = TlsIdentity::from_pem_files(cert, key).unwrap_err();
        assert!(matches!(error, ServeError::Tls { .. }));
        assert!(error.to_string().contains(expected), "{error} does not say {expected:?}");
    }
}
