//! What the server's tests share: a plain HTTP/1.1 request.

/// Sends one request and returns the status line and the body.
pub async fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (String, String) {
    let headers = format!("Host: {addr}\r\nContent-Type: application/json\r\n");
    let (head, body) = http_with(addr, method, path, &headers, body).await;
    (head.lines().next().unwrap().to_string(), body)
}

/// Sends one request with `headers` (each line ending in CRLF) and returns
/// the answer's head (status line and headers) and body.
pub async fn http_with(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (String, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\n{headers}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

/// `GET path`.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    http(addr, "GET", path, "").await
}
