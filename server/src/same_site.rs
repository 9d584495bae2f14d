//! The HTTP endpoint's defences against other sites, which a browser on the
//! operator's machine would otherwise let reach it:
//! - **DNS rebinding**: a request whose `Host` is not the address the
//!   endpoint is bound to (or, bound to loopback, a loopback name) is
//!   refused with 421, so a page of another name cannot read `/pending`;
//! - **cross-site requests**: a request that changes something (any method
//!   but GET, HEAD, OPTIONS) is refused with 403 when the browser says it
//!   comes from another site (`Sec-Fetch-Site`, or an `Origin` that is not
//!   the endpoint's), and with 415 unless its `Content-Type` is
//!   `application/json`, which no form can send and no other site can
//!   without the CORS preflight this endpoint never grants;
//! - **framing**: every answer says `frame-ancestors 'none'`.
//!
//! These stop a browser from being turned against the endpoint. They are no
//! authentication: anyone who can reach the endpoint directly can still call it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::http::error;

/// The `Host` values the endpoint answers to.
#[derive(Debug, Clone)]
pub(crate) struct Hosts {
    /// `None`: bound to every address, so any name may be the endpoint's.
    allowed: Option<Vec<String>>,
}

impl Hosts {
    /// The hosts of an endpoint bound to `bound`: its own address and, for
    /// loopback, `localhost` and the other loopback address, with its port.
    pub fn of(bound: SocketAddr) -> Self {
        let ip = bound.ip();
        if ip.is_unspecified() {
            return Self { allowed: None };
        }
        let port = bound.port();
        let mut allowed = vec![bound.to_string()];
        if ip.is_loopback() {
            allowed.extend([
                format!("localhost:{port}"),
                format!("127.0.0.1:{port}"),
                format!("[::1]:{port}"),
            ]);
        }
        Self { allowed: Some(allowed) }
    }

    fn admits(&self, host: &str) -> bool {
        self.allowed.as_ref().is_none_or(|allowed| allowed.iter().any(|a| a.eq_ignore_ascii_case(host)))
    }
}

/// The middleware: checks the request as the module says, then marks the answer unframeable.
pub(crate) async fn guard(State(hosts): State<Arc<Hosts>>, request: Request, next: Next) -> Response {
    let mut response = match refusal(&hosts, request.method(), request.headers()) {
        Some(refused) => refused,
        None => next.run(request).await,
    };
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("frame-ancestors 'none'"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// The answer that refuses a request, if it is refused.
fn refusal(hosts: &Hosts, method: &Method, headers: &HeaderMap) -> Option<Response> {
    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let host = text(header::HOST.as_str());
    if let Some(host) = host.filter(|h| !hosts.admits(h)) {
        let why = format!("host: {host:?} is not this endpoint's address");
        return Some(error(StatusCode::MISDIRECTED_REQUEST, why));
    }
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    if let Some(site) = text("sec-fetch-site").filter(|s| !matches!(*s, "same-origin" | "none")) {
        return Some(error(
            StatusCode::FORBIDDEN,
            format!("sec-fetch-site: {site:?}: cross-site requests change nothing"),
        ));
    }
    if let Some(origin) = text(header::ORIGIN.as_str()) {
        let own = host.is_some_and(|host| origin.eq_ignore_ascii_case(&format!("http://{host}")));
        if !own {
            return Some(error(StatusCode::FORBIDDEN, format!("origin: {origin:?} is not this endpoint")));
        }
    }
    let json = text(header::CONTENT_TYPE.as_str()).is_some_and(|t| {
        t.split(';').next().is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
    });
    if !json {
        let why = "content-type: a request that changes something must be application/json";
        return Some(error(StatusCode::UNSUPPORTED_MEDIA_TYPE, why.to_string()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (header::HeaderName::from_static(k), v.parse().unwrap())).collect()
    }

    fn status(hosts: &Hosts, method: Method, pairs: &[(&'static str, &str)]) -> StatusCode {
        refusal(hosts, &method, &headers(pairs)).map_or(StatusCode::OK, |r| r.status())
    }

    #[test]
    fn loopback_answers_its_own_names_only() {
        let hosts = Hosts::of("127.0.0.1:8080".parse().unwrap());
        for host in ["127.0.0.1:8080", "localhost:8080", "LOCALHOST:8080", "[::1]:8080"] {
            assert_eq!(status(&hosts, Method::GET, &[("host", host)]), StatusCode::OK, "{host}");
        }
        for host in ["evil.example:8080", "localhost:9999", "127.0.0.1"] {
            assert_eq!(
                status(&hosts, Method::GET, &[("host", host)]),
                StatusCode::MISDIRECTED_REQUEST,
                "{host}"
            );
        }
        let everywhere = Hosts::of("0.0.0.0:8080".parse().unwrap());
        assert_eq!(status(&everywhere, Method::GET, &[("host", "ops.example:8080")]), StatusCode::OK);
    }

    #[test]
    fn a_change_must_be_same_site_and_json() {
        let hosts = Hosts::of("127.0.0.1:8080".parse().unwrap());
        let host = ("host", "127.0.0.1:8080");
        let json = ("content-type", "application/json; charset=utf-8");
        assert_eq!(status(&hosts, Method::POST, &[host, json]), StatusCode::OK);
        assert_eq!(
            status(&hosts, Method::POST, &[host, json, ("origin", "http://127.0.0.1:8080")]),
            StatusCode::OK
        );
        assert_eq!(
            status(&hosts, Method::POST, &[host, json, ("sec-fetch-site", "same-origin")]),
            StatusCode::OK
        );
        for refused in [
            vec![host, json, ("origin", "http://evil.example")],
            vec![host, json, ("origin", "null")],
            vec![host, json, ("sec-fetch-site", "cross-site")],
            vec![host, json, ("sec-fetch-site", "same-site")],
        ] {
            assert_eq!(status(&hosts, Method::POST, &refused), StatusCode::FORBIDDEN, "{refused:?}");
        }
        for content_type in ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data"] {
            let pairs = [host, ("content-type", content_type)];
            assert_eq!(status(&hosts, Method::POST, &pairs), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        }
        assert_eq!(status(&hosts, Method::POST, &[host]), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
}
