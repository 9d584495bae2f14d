//! Which subjects a timer may name as its target.
//!
//! A node fires a timer by publishing to its `Delay-Target` with the node's
//! own connection, so a target is a request made with the node's
//! credentials. Whoever can publish to the delay stream must not be able to
//! reach through the node: the JetStream and KV APIs (`$JS.…`, `$KV.…`),
//! the system account (`$SYS.…`), request inboxes (`_INBOX.…`), or the tier's
//! own subjects (the delay stream's, the dead letters). Only a plain subject
//! (no wildcard, no empty token, no white space) outside those is a target,
//! and, where the node has an allow-list, only one under an allowed prefix.

use std::fmt;

/// The longest target accepted: a publish whose subject is longer than the
/// server's control line (4 KiB by default) makes it close the connection.
pub const MAX_TARGET_LEN: usize = 1024;

/// Why a target is refused; the text goes into dead letters and errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Refuses what is not a plain, publishable subject: empty, too long, an
/// empty token, white space or control characters, or a wildcard (`*` or
/// `>` anywhere, since a server treats them specially in a subject).
pub fn check_subject(subject: &str) -> Result<(), Refused> {
    let refuse = |why: &str| Err(Refused(format!("target {subject:?} is not a subject: {why}")));
    if subject.is_empty() {
        return refuse("empty");
    }
    if subject.len() > MAX_TARGET_LEN {
        return refuse(&format!("longer than {MAX_TARGET_LEN} bytes"));
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse("white space or a control character");
    }
    if subject.contains(['*', '>']) {
        return refuse("a wildcard (* or >)");
    }
    if subject.split('.').any(str::is_empty) {
        return refuse("an empty token");
    }
    Ok(())
}

/// What one tier forbids and allows as targets.
#[derive(Debug, Clone)]
pub struct TargetPolicy {
    /// Subjects the tier itself uses, each as a whole token prefix
    /// (`delay` forbids `delay` and `delay.…`, not `delayed.x`).
    own: Vec<String>,
    /// Allowed prefixes (plain text prefixes, `orders.` say); empty: any.
    allow: Vec<String>,
}

impl TargetPolicy {
    /// The policy of a tier whose delay stream is on `prefix.>`, whose dead
    /// letters go to `dead_letter.<partition>`, with an allow-list (empty:
    /// any target that is not reserved).
    pub fn new(prefix: &str, dead_letter: &str, allow: Vec<String>) -> Self {
        TargetPolicy { own: vec![prefix.to_string(), dead_letter.to_string()], allow }
    }

    /// The same policy, also refusing `subject` and the subjects under it
    /// (the tier's schedule intake).
    pub fn also_own(mut self, subject: &str) -> Self {
        self.own.push(subject.to_string());
        self
    }

    /// Refuses a target this tier must not publish to, saying why.
    pub fn check(&self, target: &str) -> Result<(), Refused> {
        check_subject(target)?;
        let refuse = |why: String| Err(Refused(format!("target {target:?} is reserved: {why}")));
        if target.starts_with('$') {
            return refuse("subjects starting with $ are the server's (JetStream, KV, system)".into());
        }
        if is_under(target, "_INBOX") {
            return refuse("_INBOX.> holds the replies to requests".into());
        }
        if let Some(own) = self.own.iter().find(|own| is_under(target, own)) {
            return refuse(format!("{own}.> is the delay tier's own"));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|p| target.starts_with(p.as_str())) {
            let allowed = self.allow.join(", ");
            return Err(Refused(format!("target {target:?} is not under an allowed prefix ({allowed})")));
        }
        Ok(())
    }
}

impl TargetPolicy {
    /// Refuses a reply subject the tier must not answer on. An answer is a
    /// publish with the node's credentials too, and the requester picks the
    /// subject: it must not reach the server's subjects (`$JS.` APIs, the
    /// lease bucket's `$KV.`) or the tier's own. An inbox (`_INBOX.…`), or
    /// any other plain subject, is answered; the allow-list is for targets.
    pub fn check_reply(&self, reply: &str) -> Result<(), Refused> {
        check_subject(reply)?;
        if reply.starts_with('$') {
            return Err(Refused(format!("reply {reply:?} is the server's (it starts with $)")));
        }
        if let Some(own) = self.own.iter().find(|own| is_under(reply, own)) {
            return Err(Refused(format!("reply {reply:?} is under {own}.>, the delay tier's own")));
        }
        Ok(())
    }
}

/// Whether `subject` is `root` or a subject under it, token-wise.
fn is_under(subject: &str, root: &str) -> bool {
    subject.strip_prefix(root).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str]) -> TargetPolicy {
        TargetPolicy::new("delay", "delaytier.dead", allow.iter().map(|p| p.to_string()).collect())
    }

    #[test]
    fn an_answer_goes_to_an_inbox_or_a_plain_subject_never_the_servers_or_the_tiers() {
        let policy = policy(&["orders."]).also_own("schedules");
        for reply in ["_INBOX.abc.1", "replies.x"] {
            assert_eq!(policy.check_reply(reply), Ok(()), "{reply}");
        }
        for reply in [
            "$KV.delaytier_leases.partition.1",
            "$JS.API.STREAM.PURGE.OUT",
            "delay.3.x",
            "schedules.a",
            "a b",
        ] {
            assert!(policy.check_reply(reply).is_err(), "{reply}");
        }
    }

    #[test]
    fn plain_subjects_outside_the_reserved_ones_are_targets() {
        for target in ["out.fired", "orders", "orders.timeout.eu-1", "delayed.x", "x$y", "inbox.1", "a_INBOX"]
        {
            policy(&[]).check(target).unwrap_or_else(|e| panic!("{target}: {e}"));
        }
        policy(&[]).check(&"a".repeat(MAX_TARGET_LEN)).unwrap();
    }

    #[test]
    fn what_is_not_a_publishable_subject_is_refused_as_such() {
        let long = "a".repeat(MAX_TARGET_LEN + 1);
        for target in [
            "",
            "out..x",
            ".out",
            "out.",
            "out.*",
            "out.>",
            ">",
            "*",
            "out.a*",
            "out.a b",
            "out.\tx",
            "out.\u{7}",
            &long,
        ] {
            let err = policy(&[]).check(target).unwrap_err().to_string();
            assert!(err.contains("is not a subject"), "{target:?}: {err}");
        }
    }

    #[test]
    fn the_servers_and_the_tiers_own_subjects_are_reserved() {
        for target in [
            "$JS.API.STREAM.PURGE.VICTIM",
            "$KV.delaytier_leases.partition.3",
            "$SYS.REQ.SERVER.PING",
            "$DELAYTIER.DELAY.cancel.0",
            "$G",
            "_INBOX.abc",
            "_INBOX",
            "delay",
            "delay.1.forged",
            "delaytier.dead.0",
        ] {
            let err = policy(&[]).check(target).unwrap_err().to_string();
            assert!(err.contains("is reserved") && err.contains(&format!("{target:?}")), "{target}: {err}");
        }
    }

    #[test]
    fn an_allow_list_admits_only_its_prefixes_and_never_a_reserved_subject() {
        let only = policy(&["orders.", "audit"]);
        only.check("orders.timeout").unwrap();
        only.check("audit.log").unwrap();
        let err = only.check("payments.x").unwrap_err().to_string();
        assert!(err.contains("not under an allowed prefix") && err.contains("orders."), "{err}");
        let err = policy(&["$JS."]).check("$JS.API.INFO").unwrap_err().to_string();
        assert!(err.contains("is reserved"), "{err}");
        let err = policy(&["delay."]).check("delay.0.x").unwrap_err().to_string();
        assert!(err.contains("is reserved"), "{err}");
    }
}
