//! The one builder of limits for tests, in the operator's words (`gcra("api", "10/s").burst(4)`):
//! it writes the limit's YAML for gateway configurations, and compiles it through sluice's own
//! configuration compiler for tests that call the limiter or the scripts directly.

use std::fmt::{self, Display};
use std::path::Path;

/// One limit of a route, as YAML fields in order.
#[derive(Debug, Clone)]
pub struct Limit {
    fields: Vec<(String, String)>,
}

fn limit(name: &str, algorithm: &str) -> Limit {
    Limit {
        fields: vec![
            ("name".to_string(), name.to_string()),
            ("algorithm".to_string(), algorithm.to_string()),
        ],
    }
}

pub fn gcra(name: &str, rate: &str) -> Limit {
    limit(name, "gcra").set("rate", rate)
}

pub fn token_bucket(name: &str, rate: &str, capacity: u64) -> Limit {
    limit(name, "token_bucket")
        .set("rate", rate)
        .set("capacity", capacity)
}

pub fn leaky_bucket(name: &str, rate: &str, capacity: u64) -> Limit {
    limit(name, "leaky_bucket")
        .set("rate", rate)
        .set("capacity", capacity)
}

pub fn fixed_window(name: &str, rate: &str) -> Limit {
    limit(name, "fixed_window").set("rate", rate)
}

pub fn sliding_window(name: &str, rate: &str) -> Limit {
    limit(name, "sliding_window").set("rate", rate)
}

pub fn sliding_log(name: &str, rate: &str) -> Limit {
    limit(name, "sliding_log").set("rate", rate)
}

/// A calendar quota (`rate: N/day|week|month|year`) in `time_zone`.
pub fn calendar(name: &str, rate: &str, time_zone: &str) -> Limit {
    limit(name, "calendar")
        .set("rate", rate)
        .set("time_zone", time_zone)
}

/// A route's entry that uses the common limit `name` (`limits:` at the top of the file).
pub fn uses(name: &str) -> Limit {
    Limit {
        fields: vec![("use".to_string(), name.to_string())],
    }
}

/// The YAML list of common limits `limits` (for the top-level `limits:` key).
pub fn common(limits: &[Limit]) -> String {
    let listed: Vec<String> = limits.iter().map(ToString::to_string).collect();
    format!("[{}]", listed.join(", "))
}

pub fn concurrency(name: &str, max: u64) -> Limit {
    limit(name, "concurrency").set("max", max)
}

impl Limit {
    /// Sets a field (replacing it if present): `burst`, `cost`, `max_delay`, `lease`, `mode`...
    pub fn set(mut self, field: &str, value: impl Display) -> Limit {
        let value = value.to_string();
        match self.fields.iter_mut().find(|(f, _)| f == field) {
            Some(existing) => existing.1 = value,
            None => self.fields.push((field.to_string(), value)),
        }
        self
    }

    /// `key: [client_ip, path]`.
    pub fn key(self, parts: &[&str]) -> Limit {
        let quoted: Vec<String> = parts.iter().map(|p| format!("{p:?}")).collect();
        self.set("key", format!("[{}]", quoted.join(", ")))
    }

    pub fn burst(self, burst: u64) -> Limit {
        self.set("burst", burst)
    }

    pub fn cost(self, cost: u64) -> Limit {
        self.set("cost", cost)
    }

    pub fn shadow(self) -> Limit {
        self.set("shadow", true)
    }

    /// `mode: leased` with at most `units` held per gateway and key.
    pub fn leased(self, units: u64) -> Limit {
        self.set("mode", "leased").set("lease_units", units)
    }

    /// The limit as sluice compiles it, with its fixed cost.
    pub fn compile(&self) -> sluice::limiter::Limit {
        let yaml = format!(
            "listen: [127.0.0.1:1]\nroutes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: {{ servers: [127.0.0.1:1] }}\n    limits:\n      - {self}\n"
        );
        let config = sluice::config::Config::from_yaml(Path::new("limit.yaml"), &yaml)
            .unwrap_or_else(|e| panic!("{self} does not compile: {e}"));
        let route = config.routes.in_file_order()[0].clone();
        let limit = route.tiers.written().next().expect("a limit").clone();
        limit
    }
}

impl Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|(field, value)| format!("{field}: {value}"))
            .collect();
        write!(f, "{{ {} }}", fields.join(", "))
    }
}
