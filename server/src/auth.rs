//! RocketMQ's access-key signature (`MQv2-HMAC-SHA1`), checked on every gRPC
//! call when the server is given credentials (`delaywheel serve
//! --access-key AK --secret-key-file FILE`).
//!
//! A client given an access key and a secret sends with each call
//! `x-mq-date-time` (when it signed, in its language's client's format) and
//! `authorization: MQv2-HMAC-SHA1 Credential=<access key>[/…],
//! SignedHeaders=x-mq-date-time, Signature=<hex of HMAC-SHA1(secret, date-time)>`.
//! The official clients differ in the credential's suffix (`//Rocketmq`) and
//! in the case of the hex digits: both are accepted. As RocketMQ's proxy does,
//! the date-time is not held against the clock: the signature proves that the
//! client knows the secret; it does not stop whoever can read the traffic
//! from replaying it (the endpoint has no TLS).

use constant_time_eq::constant_time_eq;
use hmac::{Hmac, Mac};
use sha1::Sha1;
use tonic::Status;
use tonic::metadata::MetadataMap;

/// The header that carries the signature.
pub const AUTHORIZATION: &str = "authorization";
/// The header whose value is signed.
pub const DATE_TIME: &str = "x-mq-date-time";
const ALGORITHM: &str = "MQv2-HMAC-SHA1";

/// The one access key the server accepts, and its secret.
#[derive(Clone)]
pub struct Credentials {
    access_key: String,
    secret: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("access_key", &self.access_key).finish_non_exhaustive()
    }
}

impl Credentials {
    /// An access key and its secret.
    pub fn new(access_key: impl Into<String>, secret: impl Into<Vec<u8>>) -> Self {
        Self { access_key: access_key.into(), secret: secret.into() }
    }

    fn mac(&self, date_time: &str) -> Hmac<Sha1> {
        let mut mac = Hmac::<Sha1>::new_from_slice(&self.secret).expect("HMAC takes a key of any length");
        mac.update(date_time.as_bytes());
        mac
    }

    /// The `authorization` value a client with these credentials sends with `date_time`.
    pub fn authorization(&self, date_time: &str) -> String {
        let signature = hex::encode(self.mac(date_time).finalize().into_bytes());
        format!(
            "{ALGORITHM} Credential={}, SignedHeaders={DATE_TIME}, Signature={signature}",
            self.access_key
        )
    }

    /// `Ok` if `metadata` carries a signature made with these credentials;
    /// else `UNAUTHENTICATED`, naming the header and what is wrong with it.
    pub fn check(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let refuse = |header: &str, why: &str| Err(Status::unauthenticated(format!("{header}: {why}")));
        let header = |name: &str| metadata.get(name).map(|v| v.to_str().map_err(|_| ()));
        let authorization = match header(AUTHORIZATION) {
            None => return refuse(AUTHORIZATION, "missing: this endpoint needs an access key's signature"),
            Some(Err(())) => return refuse(AUTHORIZATION, "not ASCII"),
            Some(Ok(value)) => value,
        };
        let date_time = match header(DATE_TIME) {
            None => return refuse(DATE_TIME, "missing: the signature signs it"),
            Some(Err(())) => return refuse(DATE_TIME, "not ASCII"),
            Some(Ok(value)) => value,
        };
        let Some(fields) = authorization.strip_prefix(ALGORITHM).and_then(|rest| rest.strip_prefix(' '))
        else {
            return refuse(AUTHORIZATION, &format!("not an {ALGORITHM} signature"));
        };
        let field = |name: &str| {
            fields
                .split(',')
                .filter_map(|f| f.trim().split_once('='))
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v)
        };
        let access_key = field("Credential").map(|c| c.split('/').next().unwrap_or(c));
        if !access_key.is_some_and(|k| constant_time_eq(k.as_bytes(), self.access_key.as_bytes())) {
            return refuse(AUTHORIZATION, "Credential: not an access key this server knows");
        }
        if !field("SignedHeaders").is_some_and(|h| h.split(';').any(|h| h.eq_ignore_ascii_case(DATE_TIME))) {
            return refuse(AUTHORIZATION, &format!("SignedHeaders: does not name {DATE_TIME}"));
        }
        let Some(Ok(signature)) = field("Signature").map(hex::decode) else {
            return refuse(AUTHORIZATION, "Signature: missing or not hex");
        };
        match self.mac(date_time).verify_slice(&signature) {
            Ok(()) => Ok(()),
            Err(_) => refuse(AUTHORIZATION, "Signature: does not match (a wrong secret?)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(authorization: &str, date_time: &str) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        metadata.insert(AUTHORIZATION, authorization.parse().unwrap());
        metadata.insert(DATE_TIME, date_time.parse().unwrap());
        metadata
    }

    /// Python's `hmac.new(b"secret-1", b"20231227T194619Z", hashlib.sha1).hexdigest()`.
    const KNOWN: &str = "3af139fff9c6f52a0196a8b73661ca9d12cd40b2";

    #[test]
    fn the_signature_is_hmac_sha1_of_the_date_time() {
        let credentials = Credentials::new("ak", "secret-1");
        let expected =
            format!("MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, Signature={KNOWN}");
        assert_eq!(credentials.authorization("20231227T194619Z"), expected);
    }

    #[test]
    fn every_official_clients_shape_is_accepted() {
        let credentials = Credentials::new("ak", "secret-1");
        for (credential, signature) in [("ak", KNOWN.to_string()), ("ak//Rocketmq", KNOWN.to_uppercase())] {
            let value = format!(
                "MQv2-HMAC-SHA1 Credential={credential}, SignedHeaders=x-mq-date-time, Signature={signature}"
            );
            credentials.check(&metadata(&value, "20231227T194619Z")).unwrap();
        }
    }

    #[test]
    fn a_wrong_or_missing_signature_is_refused_naming_what() {
        let credentials = Credentials::new("ak", "secret-1");
        let good = credentials.authorization("20231227T194619Z");
        let cases = [
            (good.clone(), "20231227T194620Z", "Signature: does not match"),
            (good.replace("Credential=ak", "Credential=other"), "20231227T194619Z", "Credential"),
            (
                good.replace("SignedHeaders=x-mq-date-time", "SignedHeaders=x"),
                "20231227T194619Z",
                "SignedHeaders",
            ),
            (good.replace(KNOWN, "zz"), "20231227T194619Z", "not hex"),
            ("Basic abc".to_string(), "20231227T194619Z", "not an MQv2-HMAC-SHA1 signature"),
        ];
        for (authorization, date_time, why) in cases {
            let refused = credentials.check(&metadata(&authorization, date_time)).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unauthenticated);
            assert!(refused.message().contains(why), "{authorization}: {}", refused.message());
        }
        let refused = credentials.check(&MetadataMap::new()).unwrap_err();
        assert!(refused.message().starts_with("authorization: missing"), "{}", refused.message());
        let mut no_date = MetadataMap::new();
        no_date.insert(AUTHORIZATION, good.parse().unwrap());
        assert!(credentials.check(&no_date).unwrap_err().message().starts_with("x-mq-date-time: missing"));
    }
}
