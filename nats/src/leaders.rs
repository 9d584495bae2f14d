//! Spreads the delay streams' Raft leaders over the servers. Where the
//! partitions are spread over several delay streams (see `wire::Layout`),
//! each stream's leader takes every put, acknowledgement and delete of its
//! partitions; the cluster elects leaders where it likes, and after a
//! server restarts the others keep what it led. So the owner of partition 0
//! looks every [`SPREAD_EVERY`]: a server leading more than its share
//! (the streams over the servers, rounded up) asks one of its streams to
//! elect a replica that leads fewer, by a leader stepdown naming it
//! (`$JS.API.STREAM.LEADER.STEPDOWN.<stream>`, placement `preferred`).
//! An election is a short pause of that stream, which producers and nodes
//! already ride out (they try again).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::error::bounded;
use crate::partition::Shared;
use crate::{Result, TierError};

/// How often the owner of partition 0 looks at the leaders.
const SPREAD_EVERY: Duration = Duration::from_secs(30);
/// The first look, soon after the partition is taken.
const FIRST_LOOK: Duration = Duration::from_secs(2);
/// The time limit of one stepdown request.
const STEPDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// One stream as the cluster reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Led {
    pub stream: String,
    /// Its leader's server, if it has one now.
    pub leader: Option<String>,
    /// Its other replicas' servers that are up to date (may lead).
    pub current: Vec<String>,
}

/// The stepdowns that bring every server to at most its share of leaders:
/// (stream, the replica preferred as its new leader). A stream moves only
/// to a replica of its own that is up to date and below its share.
pub(crate) fn plan(streams: &[Led]) -> Vec<(String, String)> {
    let mut led: BTreeMap<&str, usize> = BTreeMap::new();
    for stream in streams {
        for server in stream.leader.iter().chain(&stream.current) {
            led.entry(server).or_default();
        }
        if let Some(leader) = &stream.leader {
            *led.entry(leader).or_default() += 1;
        }
    }
    if led.is_empty() {
        return Vec::new();
    }
    let share = streams.len().div_ceil(led.len());
    let mut moves = Vec::new();
    for stream in streams {
        let Some(leader) = stream.leader.as_deref() else { continue };
        if led[leader] <= share {
            continue;
        }
        let to =
            stream.current.iter().filter(|c| led[c.as_str()] < share).min_by_key(|c| (led[c.as_str()], *c));
        if let Some(to) = to {
            *led.get_mut(leader).expect("counted") -= 1;
            *led.get_mut(to.as_str()).expect("counted") += 1;
            moves.push((stream.stream.clone(), to.clone()));
        }
    }
    moves
}

/// Looks at the leaders every [`SPREAD_EVERY`] while the task runs.
pub(crate) async fn spread(shared: Arc<Shared>) {
    let mut wait = FIRST_LOOK;
    loop {
        tokio::time::sleep(wait).await;
        wait = SPREAD_EVERY;
        match spread_once(&shared).await {
            Ok(0) => {}
            Ok(moved) => {
                tracing::info!(moved, "asked delay streams to elect leaders on servers leading fewer")
            }
            Err(err) => tracing::warn!(%err, "spreading the delay streams' leaders failed; again later"),
        }
    }
}

/// One look: asks for the stepdowns [`plan`] finds; how many it asked.
async fn spread_once(shared: &Shared) -> Result<usize> {
    let mut streams = Vec::new();
    for delay in &shared.streams {
        let found = shared.js.get_stream(&delay.name).await;
        let stream = found.map_err(|e| TierError::nats(format!("read stream {}", delay.name), e))?;
        let cluster = stream.cached_info().cluster.clone().unwrap_or_default();
        let current = cluster.replicas.iter().filter(|p| p.current && !p.offline).map(|p| p.name.clone());
        streams.push(Led { stream: delay.name.clone(), leader: cluster.leader, current: current.collect() });
    }
    let moves = plan(&streams);
    for (stream, to) in &moves {
        step_down(shared, stream, to).await?;
        metrics::counter!("delaytier_leader_moves_total").increment(1);
    }
    Ok(moves.len())
}

/// Asks `stream`'s leader to step down in favour of server `to`.
async fn step_down(shared: &Shared, stream: &str, to: &str) -> Result<()> {
    let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}");
    let request = serde_json::json!({ "placement": { "preferred": to } }).to_string();
    let ask = shared.client.request(subject.clone(), request.into());
    let answer = bounded(STEPDOWN_TIMEOUT, || format!("ask {subject}"), ask).await?;
    let reply: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap_or_default();
    if reply["success"] == true {
        tracing::info!(stream, to, "delay stream leader moved");
        return Ok(());
    }
    let why = reply["error"]["description"].as_str().unwrap_or("no answer that reads").to_string();
    Err(TierError::nats(format!("step down the leader of {stream} for {to}"), why))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn led(stream: &str, leader: &str, current: &[&str]) -> Led {
        let leader = (!leader.is_empty()).then(|| leader.to_string());
        Led { stream: stream.into(), leader, current: current.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn leaders_piled_on_one_server_are_moved_to_replicas_leading_fewer() {
        let piled = [
            led("D-0", "n0", &["n1", "n2"]),
            led("D-1", "n0", &["n1", "n2"]),
            led("D-2", "n0", &["n1", "n2"]),
        ];
        let moves = [("D-0".to_string(), "n1".to_string()), ("D-1".to_string(), "n2".to_string())];
        assert_eq!(plan(&piled), moves);
        let spread = [led("D-0", "n0", &["n1", "n2"]), led("D-1", "n1", &["n0", "n2"])];
        assert!(plan(&spread).is_empty(), "each leads at most its share");
        // Four streams on three servers: a share of two each.
        let four = [
            led("D-0", "n0", &["n1", "n2"]),
            led("D-1", "n0", &["n1", "n2"]),
            led("D-2", "n1", &["n0", "n2"]),
            led("D-3", "n1", &["n0", "n2"]),
        ];
        assert!(plan(&four).is_empty());
        // Only to a replica that is up to date; none: the stream stays.
        let stale = [led("D-0", "n0", &["n1"]), led("D-1", "n0", &[]), led("D-2", "n0", &[])];
        // (Two servers seen: a share of two.)
        assert_eq!(plan(&stale), [("D-0".to_string(), "n1".to_string())]);
        // No leader (an election under way): counted nowhere, not moved.
        assert!(plan(&[led("D-0", "", &["n1"]), led("D-1", "n1", &["n0"])]).is_empty());
    }
}
