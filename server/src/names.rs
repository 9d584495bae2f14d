//! Namespaces: a topic or group named in a namespace is a resource of its
//! own, apart from the same name in any other namespace.
//!
//! The store knows one flat set of names, so a resource `name` in namespace
//! `ns` is stored as `ns%name`, as RocketMQ's proxy wraps names (a
//! dead-letter topic `%DLQ%group` as `%DLQ%ns%group`). Names a client gives
//! hold no `%` of their own, so no client reaches another namespace's
//! resources by spelling the wrapped name, nor the server's `%RETRY%` topics.
//! A client gives its namespace in each `Resource` (`resource_namespace`),
//! as every official client does; its `x-mq-namespace` header says the same
//! and is not read.

use crate::proto::{Code, Resource};
use crate::receive::DLQ_PREFIX;
use crate::status::Refusal;

/// The longest namespace accepted.
const MAX_NAMESPACE_LEN: usize = 64;
/// Between a namespace and a name.
const SEPARATOR: char = '%';

/// The store's name of the topic `resource` (`field` names it in refusals):
/// its name, wrapped in its namespace if it has one. The caller checks the
/// result as a topic.
pub(crate) fn topic(resource: &Option<Resource>, field: &str) -> Result<String, Refusal> {
    qualified(resource, field, Code::IllegalTopic)
}

/// The store's name of the consumer group `resource`, as [`topic`] does.
pub(crate) fn group(resource: &Option<Resource>, field: &str) -> Result<String, Refusal> {
    qualified(resource, field, Code::IllegalConsumerGroup)
}

fn qualified(resource: &Option<Resource>, field: &str, illegal: Code) -> Result<String, Refusal> {
    let (namespace, name) =
        resource.as_ref().map_or(("", ""), |r| (r.resource_namespace.as_str(), r.name.as_str()));
    let (dead_letters, own) = match name.strip_prefix(DLQ_PREFIX) {
        Some(group) => (true, group),
        None => (false, name),
    };
    if own.contains(SEPARATOR) {
        let why = format!("{name:?}: % is the server's (it wraps namespaces and names its own topics)");
        return Err(Refusal::field(illegal, field, why));
    }
    if namespace.is_empty() {
        return Ok(name.to_string());
    }
    let well_formed = namespace.len() <= MAX_NAMESPACE_LEN
        && namespace.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    if !well_formed {
        let field = format!("{}.resource_namespace", field.trim_end_matches(".name"));
        let why = format!("{namespace:?}: 1 to {MAX_NAMESPACE_LEN} ASCII letters, digits, _ and -");
        return Err(Refusal::field(Code::BadRequest, &field, why));
    }
    Ok(if dead_letters {
        format!("{DLQ_PREFIX}{namespace}{SEPARATOR}{own}")
    } else {
        format!("{namespace}{SEPARATOR}{own}")
    })
}

/// The resource a client knows by the store's name `stored` (the inverse of [`topic`] and [`group`]).
pub(crate) fn resource(stored: &str) -> Resource {
    let split = |wrapped: &str| match wrapped.split_once(SEPARATOR) {
        Some((namespace, own)) => (namespace.to_string(), own.to_string()),
        None => (String::new(), wrapped.to_string()),
    };
    let (resource_namespace, name) = match stored.strip_prefix(DLQ_PREFIX) {
        Some(group) => {
            let (namespace, own) = split(group);
            (namespace, format!("{DLQ_PREFIX}{own}"))
        }
        None => split(stored),
    };
    Resource { resource_namespace, name }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(namespace: &str, name: &str) -> Option<Resource> {
        Some(Resource { resource_namespace: namespace.into(), name: name.into() })
    }

    #[test]
    fn names_are_wrapped_in_their_namespace_and_back() {
        for (namespace, name, stored) in [
            ("", "Orders", "Orders"),
            ("shop", "Orders", "shop%Orders"),
            ("", "%DLQ%G", "%DLQ%G"),
            ("shop", "%DLQ%G", "%DLQ%shop%G"),
        ] {
            assert_eq!(topic(&named(namespace, name), "topic.name").unwrap(), stored);
            assert_eq!(resource(stored), named(namespace, name).unwrap());
        }
    }

    #[test]
    fn no_client_spells_another_namespaces_name() {
        for (namespace, name) in
            [("", "shop%Orders"), ("other", "shop%Orders"), ("", "%RETRY%G|T"), ("", "%DLQ%a%b")]
        {
            let refused = topic(&named(namespace, name), "topic.name").unwrap_err();
            assert_eq!(refused.code, Code::IllegalTopic, "{name}");
            assert!(refused.message.starts_with("topic.name: "), "{}", refused.message);
        }
        let refused = topic(&named("no spaces", "T"), "topic.name").unwrap_err();
        assert!(refused.message.starts_with("topic.resource_namespace: "), "{}", refused.message);
        let refused = group(&named("", "a%b"), "group.name").unwrap_err();
        assert_eq!(refused.code, Code::IllegalConsumerGroup);
    }
}
