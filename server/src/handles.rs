//! The handles the server gives its clients: a **recall handle** for each
//! timed message it stores, and a **receipt handle** for each message it
//! hands out (naming the timer that brings the message back unless acked).
//!
//! Both name a store timer (commit-log offset and deliver time) and carry a
//! 128-bit tag: BLAKE3 in keyed mode, with the server's key, over the kind,
//! the scope (for a recall handle, the topic and the message id; for a
//! receipt, the group and the topic) and the timer. So a client cannot make
//! one up, nor change the message id a recall answers with, nor use a
//! receipt as a recall handle, nor ack for another group. Text forms:
//! `r2.<offset>.<deliver_at_ms>.<tag hex>.<message id>` and
//! `a1.<offset>.<deliver_at_ms>.<tag hex>`. An `r1` handle (of a server
//! before `r2`, whose tag did not cover the message id) still recalls its
//! timer, and its message id is not echoed.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use delaywheel::Handle;

use crate::error::ServeError;

const TAG_LEN: usize = 16;
/// The key file, in the store's directory (one per store: handles outlive restarts).
const KEY_FILE: &str = "server/handle.key";

/// The server's secret for tagging handles.
#[derive(Clone)]
pub struct HandleKey([u8; 32]);

impl std::fmt::Debug for HandleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandleKey(..)")
    }
}

impl HandleKey {
    /// A key from 32 bytes (tests; servers use [`load_or_create_key`]).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    fn tag(&self, kind: &str, scope: &[&str], handle: Handle) -> [u8; TAG_LEN] {
        let mut hasher = blake3::Hasher::new_keyed(&self.0);
        hasher.update(kind.as_bytes());
        for part in scope {
            // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        hasher.update(&handle.to_bytes());
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&hasher.finalize().as_bytes()[..TAG_LEN]);
        tag
    }

    /// The recall handle of the timed message `handle` on `topic`.
    pub(crate) fn recall_handle(&self, topic: &str, handle: Handle, message_id: &str) -> String {
        let tag = self.tag("recall", &[topic, message_id], handle);
        let mut text = timer_text("r2", handle, &tag, 1 + message_id.len());
        text.push('.');
        text.push_str(message_id);
        text
    }

    /// The timer a recall handle names, and the message id it carries (empty
    /// for an `r1` handle, whose tag does not vouch for it). Errors name what
    /// is wrong; a tag that does not match is "not made by this server".
    pub(crate) fn open_recall(&self, topic: &str, text: &str) -> Result<(Handle, String), String> {
        let mut parts = text.splitn(5, '.');
        let version = parts.next();
        if !matches!(version, Some("r1" | "r2")) {
            return Err("not a recall handle of this server (r2.…)".into());
        }
        let (handle, tag) = parse_timer(&mut parts)?;
        let message_id = parts.next().ok_or("no message id")?.to_string();
        if version == Some("r1") {
            self.check(tag, self.tag("recall", &[topic], handle))?;
            return Ok((handle, String::new()));
        }
        self.check(tag, self.tag("recall", &[topic, &message_id], handle))?;
        Ok((handle, message_id))
    }

    /// The receipt handle of a message handed to `group`: it names the
    /// timer that hands the message out again.
    pub(crate) fn receipt_handle(&self, group: &str, topic: &str, timer: Handle) -> String {
        let tag = self.tag("receipt", &[group, topic], timer);
        timer_text("a1", timer, &tag, 0)
    }

    /// The timer a receipt handle names.
    pub(crate) fn open_receipt(&self, group: &str, topic: &str, text: &str) -> Result<Handle, String> {
        let mut parts = text.splitn(4, '.');
        if parts.next() != Some("a1") {
            return Err("not a receipt handle of this server (a1.…)".into());
        }
        let (handle, tag) = parse_timer(&mut parts)?;
        self.check(tag, self.tag("receipt", &[group, topic], handle))?;
        Ok(handle)
    }

    fn check(&self, got: [u8; TAG_LEN], want: [u8; TAG_LEN]) -> Result<(), String> {
        // Constant time: a client learns nothing from how long a refusal takes.
        if constant_time_eq::constant_time_eq(&got, &want) {
            Ok(())
        } else {
            Err("not made by this server for this topic and group".into())
        }
    }
}

fn parse_timer<'a>(parts: &mut impl Iterator<Item = &'a str>) -> Result<(Handle, [u8; TAG_LEN]), String> {
    let mut number = |what: &str| -> Result<u64, String> {
        let text = parts.next().ok_or_else(|| format!("no {what}"))?;
        text.parse().map_err(|_| format!("{what} {text:?} is not a number"))
    };
    let offset = number("offset")?;
    let deliver_at_ms = number("deliver time")?;
    let text = parts.next().ok_or("no tag")?;
    let mut tag = [0u8; TAG_LEN];
    if text.len() != 2 * TAG_LEN || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("tag {text:?} is not {TAG_LEN} bytes of hex"));
    }
    for (byte, pair) in tag.iter_mut().zip(text.as_bytes().chunks(2)) {
        let pair = std::str::from_utf8(pair).map_err(|_| "tag is not hex")?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| "tag is not hex")?;
    }
    Ok((Handle { offset, deliver_at_ms }, tag))
}

/// `{version}.{offset}.{deliver time}.{tag in hex}`, with room for `more`:
/// written without the formatting machinery, which cost a send a twentieth
/// of its time (one handle per timed message).
fn timer_text(version: &str, timer: Handle, tag: &[u8; TAG_LEN], more: usize) -> String {
    let (mut offset, mut deliver_at_ms) = (itoa::Buffer::new(), itoa::Buffer::new());
    let numbers = [offset.format(timer.offset), deliver_at_ms.format(timer.deliver_at_ms)];
    let len = version.len() + numbers.iter().map(|n| n.len() + 1).sum::<usize>() + 1 + 2 * TAG_LEN + more;
    let mut text = String::with_capacity(len);
    text.push_str(version);
    for number in numbers {
        text.push('.');
        text.push_str(number);
    }
    text.push('.');
    text.push_str(&hex::encode(tag));
    text
}

/// The server's handle key for the store in `dir`: read from
/// `server/handle.key`, or made from the system's random source and
/// written there (mode 0600) on the first start.
pub fn load_or_create_key(dir: &Path) -> Result<HandleKey, ServeError> {
    let path = dir.join(KEY_FILE);
    let fail = |reason: String| ServeError::Key { path: path.clone(), reason };
    match std::fs::read(&path) {
        Ok(bytes) => {
            let key: [u8; 32] =
                bytes.try_into().map_err(|b: Vec<u8>| fail(format!("{} bytes, not 32", b.len())))?;
            return Ok(HandleKey(key));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e.to_string())),
    }
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| fail(format!("no random bytes: {e}")))?;
    write_key(&path, &key).map_err(|e| fail(e.to_string()))?;
    Ok(HandleKey(key))
}

fn write_key(path: &PathBuf, key: &[u8; 32]) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let parent = path.parent().expect("the key file is inside the store's directory");
    // Only the store's owner may read the key (a store directory made by the store is 0700 too).
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(parent)?;
    let tmp = path.with_extension("tmp");
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    file.write_all(key)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(parent)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMER: Handle = Handle { offset: 4096, deliver_at_ms: 1_700_000_000_000 };

    #[test]
    fn a_recall_handle_opens_for_its_topic_only() {
        let key = HandleKey([7; 32]);
        let text = key.recall_handle("Orders", TIMER, "id-1.x");
        assert_eq!(key.open_recall("Orders", &text).unwrap(), (TIMER, "id-1.x".to_string()));
        assert!(key.open_recall("Other", &text).unwrap_err().contains("not made by this server"));
        assert!(HandleKey([8; 32]).open_recall("Orders", &text).is_err(), "another key");
        // A receipt is not a recall handle, even with the same timer and scope.
        let receipt = key.receipt_handle("g", "Orders", TIMER);
        assert!(key.open_recall("Orders", &receipt).is_err());
        // The message id is the tag's too: a client cannot make the answer name another.
        let forged = text.replace("id-1.x", "id-2");
        assert!(key.open_recall("Orders", &forged).unwrap_err().contains("not made by this server"));
    }

    #[test]
    fn an_older_servers_recall_handle_recalls_without_its_message_id() {
        let key = HandleKey([7; 32]);
        let tag = key.tag("recall", &["Orders"], TIMER);
        let older = format!("r1.{}.{}.{}.any-id", TIMER.offset, TIMER.deliver_at_ms, hex::encode(tag));
        assert_eq!(key.open_recall("Orders", &older).unwrap(), (TIMER, String::new()));
        assert!(key.open_recall("Other", &older).is_err());
    }

    /// Clients keep handles across server restarts and upgrades: their text stays.
    #[test]
    fn handles_keep_their_text() {
        let key = HandleKey([7; 32]);
        let tag = hex::encode(key.tag("recall", &["Orders", "id-1"], TIMER));
        assert_eq!(key.recall_handle("Orders", TIMER, "id-1"), format!("r2.4096.1700000000000.{tag}.id-1"));
        let tag = hex::encode(key.tag("receipt", &["g", "Orders"], TIMER));
        assert_eq!(key.receipt_handle("g", "Orders", TIMER), format!("a1.4096.1700000000000.{tag}"));
    }

    #[test]
    fn a_receipt_opens_for_its_group_and_topic_only() {
        let key = HandleKey([7; 32]);
        let text = key.receipt_handle("g", "Orders", TIMER);
        assert_eq!(key.open_receipt("g", "Orders", &text).unwrap(), TIMER);
        assert!(key.open_receipt("h", "Orders", &text).is_err());
        assert!(key.open_receipt("g", "Other", &text).is_err());
        let forged = text.replace("4096", "4097");
        assert!(key.open_receipt("g", "Orders", &forged).unwrap_err().contains("not made by this server"));
    }

    #[test]
    fn garbage_names_what_is_wrong() {
        let key = HandleKey([7; 32]);
        for (text, why) in [
            ("", "not a receipt handle"),
            ("a1", "no offset"),
            ("a1.x.1.00", "offset \"x\" is not a number"),
            ("a1.1.2.zz", "is not 16 bytes of hex"),
            ("a1.1.2.é", "is not 16 bytes of hex"),
        ] {
            let err = key.open_receipt("g", "T", text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn the_key_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create_key(dir.path()).unwrap();
        let again = load_or_create_key(dir.path()).unwrap();
        assert_eq!(first.0, again.0);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join("server")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "only the owner reads the key's directory");
        std::fs::write(dir.path().join(KEY_FILE), b"short").unwrap();
        let err = load_or_create_key(dir.path()).err().unwrap().to_string();
        assert!(err.contains("handle.key") && err.contains("5 bytes, not 32"), "{err}");
    }
}
