//! Sealed handles: a [`Handle`] with a keyed MAC over its offset and
//! deliver time, for applications that hand cancel to their clients.
//!
//! A plain handle is a bearer token naming a log position: anyone who can
//! guess an offset and a deliver time can cancel that timer. A sealed
//! handle carries a 16-byte tag, BLAKE3 in keyed mode over a domain string
//! and the handle's 16 bytes, with the key from
//! [`Config::with_handle_key`](crate::Config::with_handle_key); the store
//! cancels it only if the tag matches (compared in constant time).

use crate::error::{Error, Result};
use crate::message::Handle;

/// Separates these tags from any other use of the same key.
const DOMAIN: &[u8] = b"delaywheel handle v1";
/// Bytes of the tag: 128 bits, beyond guessing.
const TAG_LEN: usize = 16;

/// A [`Handle`] and the tag that proves the store made it. 32 bytes, or
/// text `offset@deliver_at_ms.tag` with the tag in lowercase hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SealedHandle {
    handle: Handle,
    tag: [u8; TAG_LEN],
}

impl SealedHandle {
    /// The handle it seals (not yet checked: only the store can check it).
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// The sealed handle as 32 bytes: the handle's 16, then the tag.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[..16].copy_from_slice(&self.handle.to_bytes());
        out[16..].copy_from_slice(&self.tag);
        out
    }

    /// The inverse of [`to_bytes`](Self::to_bytes); whether the tag is
    /// right is for [`Store::cancel_sealed`](crate::Store::cancel_sealed) to say.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        let (handle, tag) = bytes.split_at(16);
        Self {
            handle: Handle::from_bytes(handle.try_into().expect("16 bytes")),
            tag: tag.try_into().expect("16 bytes"),
        }
    }
}

impl std::fmt::Display for SealedHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.", self.handle)?;
        self.tag.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::str::FromStr for SealedHandle {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let (handle, hex) = s.rsplit_once('.').ok_or_else(|| {
            Error::invalid("sealed handle", format!("{s:?} is not offset@deliver_at_ms.tag"))
        })?;
        let bad_tag =
            || Error::invalid("sealed handle tag", format!("{hex:?} is not {TAG_LEN} bytes of hex"));
        if hex.len() != 2 * TAG_LEN || !hex.is_ascii() {
            return Err(bad_tag());
        }
        let mut tag = [0u8; TAG_LEN];
        for (byte, pair) in tag.iter_mut().zip(hex.as_bytes().chunks(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| bad_tag())?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| bad_tag())?;
        }
        Ok(Self { handle: handle.parse()?, tag })
    }
}

/// Seals `handle` with `key`.
pub(crate) fn seal(key: &[u8; 32], handle: Handle) -> SealedHandle {
    SealedHandle { handle, tag: tag(key, handle) }
}

/// The handle `sealed` names, if `key` made its tag; else an error naming
/// the tag (the handle may be made up, or sealed with another key).
pub(crate) fn unseal(key: &[u8; 32], sealed: SealedHandle) -> Result<Handle> {
    if constant_time_eq::constant_time_eq_16(&tag(key, sealed.handle), &sealed.tag) {
        return Ok(sealed.handle);
    }
    Err(Error::invalid("sealed handle tag", format!("{sealed} was not sealed with this store's handle key")))
}

fn tag(key: &[u8; 32], handle: Handle) -> [u8; TAG_LEN] {
    let mut mac = blake3::Hasher::new_keyed(key);
    mac.update(DOMAIN).update(&handle.to_bytes());
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&mac.finalize().as_bytes()[..TAG_LEN]);
    tag
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];
    const HANDLE: Handle = Handle { offset: 4096, deliver_at_ms: 1_700_000_000_000 };

    #[test]
    fn a_sealed_handle_round_trips_and_unseals_with_its_key_only() {
        let sealed = seal(&KEY, HANDLE);
        assert_eq!(SealedHandle::from_bytes(sealed.to_bytes()), sealed);
        let text = sealed.to_string();
        assert!(text.starts_with("4096@1700000000000."), "{text}");
        assert_eq!(text.parse::<SealedHandle>().unwrap(), sealed);
        assert_eq!(unseal(&KEY, sealed).unwrap(), HANDLE);
        assert!(unseal(&[8; 32], sealed).is_err(), "another key's tag");
    }

    #[test]
    fn a_changed_offset_deliver_time_or_tag_is_refused() {
        let sealed = seal(&KEY, HANDLE);
        let mut bytes = sealed.to_bytes();
        for i in [0, 8, 16, 31] {
            bytes[i] ^= 1;
            let err = unseal(&KEY, SealedHandle::from_bytes(bytes)).unwrap_err();
            assert!(err.to_string().contains("sealed handle tag"), "{err}");
            bytes[i] ^= 1;
        }
    }

    #[test]
    fn malformed_text_names_the_field() {
        for (text, field) in [
            ("4096@17", "sealed handle"),
            ("4096@17.zz", "sealed handle tag"),
            ("4096@17.00112233445566778899aabbccddeeff00", "sealed handle tag"),
            ("x@17.00112233445566778899aabbccddeeff", "handle"),
        ] {
            let err = text.parse::<SealedHandle>().unwrap_err().to_string();
            assert!(err.contains(field), "{text}: {err}");
        }
    }
}
