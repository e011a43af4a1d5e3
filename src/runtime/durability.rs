//! Whether the quotas of the configuration in force survive their Redis restarting. A
//! configuration with quota limits (`Config::quota_limits`: a calendar period, or a window or
//! burst of an hour or more) reads what every master keeps (`Policy::check_persistence`): at
//! start once Redis answers (never holding readiness back), after each reload, and after the
//! gateways found Redis had lost the quota admin tables (`runtime::overrides`). A master that
//! keeps neither an append-only file nor RDB snapshots, or that will not say, is warned about
//! in the log, on `/readyz` (a line of its own; the status is unchanged) and on the dashboard's
//! overview. The bound and the advice are said in the words docs/deploy.md and
//! docs/reliability.md use ([`BOUND`], [`ADVICE`]; a test holds them to it).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::limiter::{Kept, LimiterError, Persistence, Policy};
use crate::runtime::snapshot::InForce;

/// What a Redis that restarts empty costs the quotas, as docs/reliability.md says it.
pub const BOUND: &str = "a Redis restarted without persistence starts empty: every quota starts over (up to a whole window or calendar period more is admitted) and counts nothing it had counted; only the overrides the gateways hold are written back";

/// How to run Redis for quotas, as docs/deploy.md says it.
pub const ADVICE: &str = "run every Redis primary and replica with appendonly yes and appendfsync everysec: a restart then loses at most the last second of writes";

/// How often the check at start tries again while Redis does not answer.
const RETRY: Duration = Duration::from_secs(5);

/// What the configuration's quotas risk: the masters that keep nothing across a restart (or
/// cannot tell), and the quota limits that depend on them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub masters: Vec<(String, Kept)>,
    pub quotas: Vec<String>,
}

/// The most quota limits a warning names (the rest are counted).
const NAMED: usize = 5;

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masters: Vec<String> = self
            .masters
            .iter()
            .map(|(master, kept)| format!("{master} {kept}"))
            .collect();
        let mut named = self
            .quotas
            .iter()
            .take(NAMED)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if self.quotas.len() > NAMED {
            named.push_str(&format!(" and {} more", self.quotas.len() - NAMED));
        }
        write!(
            f,
            "quota durability: {}; its quota limits ({named}) are at risk: {BOUND}. For quotas, {ADVICE} (docs/deploy.md)",
            masters.join("; ")
        )
    }
}

/// The warning `reading` makes for `config`: `None` when every master keeps what it holds or
/// the configuration has no quota limit.
pub fn warning_of(config: &Config, reading: &Persistence) -> Option<Warning> {
    let masters: Vec<(String, Kept)> = reading.at_risk().cloned().collect();
    if masters.is_empty() {
        return None;
    }
    let quotas = config.quota_limits();
    (!quotas.is_empty()).then_some(Warning { masters, quotas })
}

/// The warning in force for `config`, as the store was last read (`None`: nothing at risk,
/// or not read yet).
pub fn warning(config: &Config, policy: &Policy) -> Option<Warning> {
    warning_of(config, &*policy.persistence()?)
}

/// Reads what the store keeps when `config` has quota limits, and logs the warning there is
/// (`when`: why it was read). `Err`: the store did not answer.
pub async fn check(policy: &Policy, config: &Config, when: &str) -> Result<(), LimiterError> {
    if config.quota_limits().is_empty() {
        return Ok(());
    }
    let Some(reading) = policy.check_persistence().await else {
        return Ok(());
    };
    let reading = reading?;
    match warning_of(config, &reading) {
        Some(warning) => log::warn!("{warning} [read {when}]"),
        None => {
            let masters: Vec<String> = reading
                .masters
                .iter()
                .map(|(master, kept)| format!("{master} {kept}"))
                .collect();
            log::info!("quota durability: {} [read {when}]", masters.join("; "));
        }
    }
    Ok(())
}

/// [`check`], saying in the log when the store did not answer.
pub async fn check_now(policy: &Policy, config: &Config, when: &str) {
    if let Err(e) = check(policy, config, when).await {
        log::info!("quota durability: cannot read what Redis persists {when} ({e})");
    }
}

/// The check at start, for the configuration in force: once the store answers (tried every
/// [`RETRY`] until then; its first failure logged), holding nothing back. Started once
/// (`runtime::background`), from the runtime that serves requests (where the connections
/// are made).
pub async fn check_at_start(policy: Arc<Policy>, live: InForce) {
    let mut said = false;
    while let Err(e) = check(&policy, &live.load_full().config, "at start").await {
        if !std::mem::replace(&mut said, true) {
            log::info!("quota durability: cannot read what Redis persists yet ({e}); trying again every {} s", RETRY.as_secs());
        }
        tokio::time::sleep(RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(limits: &str) -> Config {
        let yaml = format!(
            "listen: [127.0.0.1:1]\n\
             routes: [{{ name: api, match: {{ path_prefix: / }}, upstream: {{ servers: [127.0.0.1:1] }}, limits: [{limits}] }}]\n"
        );
        Config::from_yaml(Path::new("d.yaml"), &yaml).expect("a valid config")
    }

    #[test]
    fn a_store_that_keeps_nothing_is_a_warning_only_for_quotas() {
        let quotas = config(
            "{ name: monthly, algorithm: calendar, rate: 1000/month }, \
             { name: hourly, algorithm: fixed_window, rate: 100/h }, \
             { name: per_second, rate: 5/s }",
        );
        assert_eq!(quotas.quota_limits(), ["api/monthly", "api/hourly"]);
        let nothing = Persistence {
            masters: vec![("redis at 127.0.0.1:1".into(), Kept::Nothing)],
        };
        let warning = warning_of(&quotas, &nothing).expect("a warning");
        let said = warning.to_string();
        assert!(
            said.contains("redis at 127.0.0.1:1 runs without persistence (neither AOF nor RDB)"),
            "{said}"
        );
        assert!(
            said.contains("api/monthly, api/hourly")
                && said.contains(BOUND)
                && said.contains(ADVICE)
        );
        let rates = config("{ name: per_second, rate: 5/s }");
        assert_eq!(warning_of(&rates, &nothing), None, "no quota at risk");
        let kept = Persistence {
            masters: vec![("r".into(), Kept::AppendOnlyFile)],
        };
        assert_eq!(warning_of(&quotas, &kept), None);
    }

    #[test]
    fn the_docs_say_the_bound_and_the_advice_in_the_code_s_words() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for (doc, said) in [
            ("docs/deploy.md", [BOUND, ADVICE]),
            ("docs/reliability.md", [BOUND, ADVICE]),
        ] {
            let text = std::fs::read_to_string(root.join(doc)).expect("the doc");
            let flowing = text.split_whitespace().collect::<Vec<_>>().join(" ");
            for words in said {
                assert!(flowing.contains(words), "{doc} does not say: {words}");
            }
        }
    }
}
