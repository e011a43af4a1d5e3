//! The one builder of gateway configurations for tests: top-level settings, Redis, routes and
//! their limits, written out as the YAML an operator would write. Routes send to `UPSTREAM`
//! unless told otherwise; [`super::GatewayConfig::write`] puts the test upstream's address there.

use std::fmt::{self, Display};

use super::limits::Limit;

/// A gateway configuration (everything but `server`, `listen` and `admin`, which the harness
/// writes, unless [`Config::listen`] names the listeners).
#[derive(Debug, Clone, Default)]
pub struct Config {
    server: Vec<String>,
    listen: Vec<String>,
    redis: Option<Vec<String>>,
    top: Vec<String>,
    routes: Vec<Route>,
}

impl Config {
    pub fn new() -> Config {
        Config::default()
    }

    /// A key of the `server:` section (beside what the harness writes there).
    pub fn server(mut self, key: &str, value: impl Display) -> Config {
        self.server.push(format!("{key}: {value}"));
        self
    }

    /// The proxy's listeners, each a YAML value: `PROXY` is the harness's plain address (the
    /// one it waits for), e.g. `listen(&["PROXY", "{ addr: 127.0.0.1:8443, tls: ... }"])`.
    pub fn listen(mut self, listeners: &[&str]) -> Config {
        self.listen = listeners.iter().map(|l| l.to_string()).collect();
        self
    }

    /// Limits in the Redis at `url` (deadline 200 ms, key prefix `t`).
    pub fn redis(self, url: impl Display) -> Config {
        self.redis_section(&[&format!("url: {url}"), "timeout_ms: 200", "key_prefix: t"])
    }

    /// A `redis:` section of these lines (`mode: cluster`, `nodes: [...]`...).
    pub fn redis_section(mut self, lines: &[&str]) -> Config {
        self.redis = Some(lines.iter().map(|l| l.to_string()).collect());
        self
    }

    /// Sets one key of the `redis:` section (replacing it if present).
    pub fn redis_key(mut self, key: &str, value: impl Display) -> Config {
        let lines = self.redis.get_or_insert_with(Vec::new);
        lines.retain(|l| !l.starts_with(&format!("{key}:")));
        lines.push(format!("{key}: {value}"));
        self
    }

    pub fn failure_mode(self, mode: &str) -> Config {
        self.set("failure_mode", mode)
    }

    /// A top-level key, e.g. `set("instances", 2)` or `set("trusted_proxies", "[127.0.0.1]")`.
    pub fn set(mut self, key: &str, value: impl Display) -> Config {
        self.top.retain(|l| !l.starts_with(&format!("{key}:")));
        self.top.push(format!("{key}: {value}"));
        self
    }

    pub fn route(mut self, route: Route) -> Config {
        self.routes.push(route);
        self
    }

    /// The YAML text.
    pub fn yaml(&self) -> String {
        self.to_string()
    }
}

impl Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.server.is_empty() {
            writeln!(f, "server:")?;
            for line in &self.server {
                writeln!(f, "  {line}")?;
            }
        }
        if !self.listen.is_empty() {
            writeln!(f, "listen:")?;
            for listener in &self.listen {
                writeln!(f, "  - {listener}")?;
            }
        }
        if let Some(lines) = &self.redis {
            writeln!(f, "redis:")?;
            for line in lines {
                writeln!(f, "  {line}")?;
            }
        }
        for line in &self.top {
            writeln!(f, "{line}")?;
        }
        writeln!(f, "routes:")?;
        for route in &self.routes {
            write!(f, "{route}")?;
        }
        Ok(())
    }
}

/// One route: `match: { path_prefix: / }` and the test upstream unless told otherwise.
#[derive(Debug, Clone)]
pub struct Route {
    name: String,
    matcher: String,
    upstream: String,
    keys: Vec<String>,
    limits: Vec<Limit>,
}

/// A route named `name`.
pub fn route(name: &str) -> Route {
    Route {
        name: name.to_string(),
        matcher: "{ path_prefix: / }".to_string(),
        upstream: "{ servers: [UPSTREAM] }".to_string(),
        keys: Vec::new(),
        limits: Vec::new(),
    }
}

impl Route {
    pub fn prefix(mut self, prefix: &str) -> Route {
        self.matcher = format!("{{ path_prefix: {prefix} }}");
        self
    }

    /// The whole `match:` value, e.g. `{ path: /health, methods: [GET] }`.
    pub fn matching(mut self, matcher: &str) -> Route {
        self.matcher = matcher.to_string();
        self
    }

    /// The whole `upstream:` value, e.g. `{ servers: [UPSTREAM], retries: 0 }`.
    pub fn upstream(mut self, upstream: impl Display) -> Route {
        self.upstream = upstream.to_string();
        self
    }

    /// `upstream: { servers: [...] }`.
    pub fn servers(self, servers: &[impl Display]) -> Route {
        let list: Vec<String> = servers.iter().map(|s| s.to_string()).collect();
        self.upstream(format!("{{ servers: [{}] }}", list.join(", ")))
    }

    /// Any other key of the route, e.g. `set("failure_mode", "deny")`.
    pub fn set(mut self, key: &str, value: impl Display) -> Route {
        self.keys.push(format!("{key}: {value}"));
        self
    }

    pub fn limit(mut self, limit: Limit) -> Route {
        self.limits.push(limit);
        self
    }
}

impl Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  - name: {}", self.name)?;
        writeln!(f, "    match: {}", self.matcher)?;
        writeln!(f, "    upstream: {}", self.upstream)?;
        for key in &self.keys {
            writeln!(f, "    {key}")?;
        }
        if !self.limits.is_empty() {
            writeln!(f, "    limits:")?;
            for limit in &self.limits {
                writeln!(f, "      - {limit}")?;
            }
        }
        Ok(())
    }
}
