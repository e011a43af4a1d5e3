//! A loaded, validated configuration: what the rest of sluice reads.

use crate::caller::address_lists::AddressLists;
use std::net::SocketAddr;
use std::path::PathBuf;

use super::listeners::Listener;
use super::observe::{AccessLogSettings, RequestIdSettings, TracingSettings};
use super::pending::PendingChange;
use super::redis::RedisSettings;
use super::rls::RlsSettings;
use super::server::ServerSettings;
use crate::caller::address::TrustedProxies;
use crate::caller::consumers::{Known, Verifiers};
use crate::limiter::redis::script::Algorithms;
use crate::limiter::Secret;
use crate::limiter::{FailureMode, Scope};
use crate::route::keys::KeySecret;
use crate::route::path::PathRules;
use crate::route::table::RouteTable;

/// A loaded, validated configuration.
#[derive(Debug)]
pub struct Config {
    pub source: PathBuf,
    pub server: ServerSettings,
    pub listen: Vec<Listener>,
    pub admin_listen: Option<SocketAddr>,
    /// What the usage API asks for (`admin.token`); `None`: the usage API is off.
    pub admin_token: Option<Secret>,
    /// Where the quota admin API appends its audit lines (`admin.audit_log`); `None`: stdout.
    pub admin_audit_log: Option<PathBuf>,
    /// The `redis:` settings in force (`None`: limits run in-process): the file's at start, and
    /// after a reload still those the process started with ([`PendingChange`]).
    pub redis: Option<RedisSettings>,
    /// `regions:`: one limit across regions (`None`: each region its own limits).
    pub regions: Option<super::RegionsSettings>,
    /// What the file changes that the running process keeps until a graceful upgrade
    /// (`sluice -u`): `redis:` settings, listeners, `server:`, `tracing:`. Empty at start; a
    /// reload fills it (`runtime/reload.rs`), `/readyz` and the dashboard show it.
    pub pending_upgrade: Vec<PendingChange>,
    /// The key of every key hash (`key_secret`, else the key prefix): a change makes every
    /// key anew.
    pub key_secret: KeySecret,
    /// The gateways sharing the limits (`instances:`): `failure_mode: local` enforces
    /// `limit / instances`.
    pub instances: u64,
    /// The failure mode of routes that do not set their own.
    pub failure_mode: FailureMode,
    pub trusted_proxies: TrustedProxies,
    /// Who is calling: the plans and the verifiers of credentials (`identity:`).
    pub consumers: Verifiers,
    /// The gateway's `addresses:` lists (each route may add its own).
    pub addresses: AddressLists,
    pub paths: PathRules,
    /// `None`: no access log.
    pub access_log: Option<AccessLogSettings>,
    /// `None`: requests get no id.
    pub request_id: Option<RequestIdSettings>,
    /// `None`: no spans are made.
    pub tracing: Option<TracingSettings>,
    /// `None`: no rate limit service.
    pub rls: Option<RlsSettings>,
    /// `watch: true`: reload when the file or a file it names changes, as on SIGHUP.
    pub watch: bool,
    pub routes: RouteTable,
}

impl Config {
    /// Every algorithm its limits use, on routes and in rate limit service domains: the
    /// decision scripts its requests may call are those of their sets (`limiter::redis::warm`).
    pub fn algorithms(&self) -> Algorithms {
        let routes = self.routes.in_file_order().into_iter();
        let domains = self.rls.iter().flat_map(|rls| rls.domains.iter());
        routes
            .map(|route| route.tiers.algorithms())
            .chain(domains.map(|domain| domain.algorithms()))
            .fold(Algorithms::default(), Algorithms::with)
    }

    /// Its limits that are quotas (`Limit::is_quota`: a calendar period, or state kept an
    /// hour or more) shared by every gateway, on routes (any plan's or consumer's parameters)
    /// and in rate limit service domains: `route/limit` and `domain/limit`, each once, in file
    /// order. What a Redis that restarts empty would give back in full.
    pub fn quota_limits(&self) -> Vec<String> {
        let mut quotas: Vec<String> = Vec::new();
        for route in self.routes.in_file_order() {
            let limits = route.tiers.all().iter().flat_map(|tier| tier.limits.iter());
            for limit in limits.map(|l| &l.limit.exact) {
                let named = format!("{}/{}", route.name, limit.name);
                let shared = limit.scope == Scope::Shared;
                if shared && limit.is_quota() && !quotas.contains(&named) {
                    quotas.push(named);
                }
            }
        }
        let domains = self.rls.iter().flat_map(|rls| rls.domains.iter());
        for domain in domains {
            let named = domain
                .quota_limits()
                .map(|limit| format!("{}/{limit}", domain.name));
            quotas.extend(named);
        }
        quotas
    }

    /// Its limits kept across regions (`scope: global`), in file order: `route/limit whole
    /// consistency`, each once (any plan's or consumer's parameters). What region sync's digest
    /// covers, and what `sluice -t` tells.
    pub fn global_limits(&self) -> Vec<String> {
        let mut globals: Vec<String> = Vec::new();
        for route in self.routes.in_file_order() {
            let limits = route.tiers.all().iter().flat_map(|tier| tier.limits.iter());
            for limit in limits.map(|l| &l.limit.exact) {
                let Some(global) = limit.global else { continue };
                let named = format!(
                    "{}/{} {} {}{}",
                    route.name,
                    limit.name,
                    global.whole,
                    global.consistency.name(),
                    if global.synced { "" } else { " per-region" }
                );
                if !globals.contains(&named) {
                    globals.push(named);
                }
            }
        }
        globals
    }

    /// What the configuration knows of consumer `id`: listed (by the API-key file,
    /// `identity.mtls.plans` or a limit's `consumers:`), possible (a JWT or client certificate
    /// verifier may name consumers no list holds), or `None`: no request can be its.
    pub fn knows_consumer(&self, id: &str) -> Option<Known> {
        if self.consumers.lists(id) || self.routes.names_consumer(id) {
            return Some(Known::Listed);
        }
        self.consumers.names_unlisted().then_some(Known::Possible)
    }

    /// One line for `sluice -t` and the log.
    pub fn summary(&self) -> String {
        let limits: usize = self
            .routes
            .in_file_order()
            .iter()
            .map(|r| r.tiers.default().limits.len())
            .sum();
        let backend = match &self.redis {
            Some(redis) => redis.topology.describe(),
            None => "in-process limiter".to_string(),
        };
        let mut summary = format!(
            "{}: ok: {} routes, {} limits, {}",
            self.source.display(),
            self.routes.len(),
            limits,
            backend
        );
        if let Some(settings) = &self.regions {
            summary.push_str(&regions_summary(&settings.regions, &self.global_limits()));
        }
        summary
    }
}

/// What `sluice -t` adds for `regions:`: this region among them, the exchange, and each global
/// limit, those decided per region said so (their window is under 4(T + d)).
fn regions_summary(regions: &crate::limiter::regions::Regions, globals: &[String]) -> String {
    let names: Vec<&str> = regions.list.iter().map(|r| &*r.name).collect();
    let mut text = format!(
        "\nregions: this is {} of {} ({}); region sync every {} ms, delays up to {} ms assumed",
        regions.this_name(),
        names.len(),
        names.join(", "),
        regions.every.as_millis(),
        regions.max_delay.as_millis()
    );
    for global in globals {
        let (limit, per_region) = match global.strip_suffix(" per-region") {
            Some(limit) => (limit, true),
            None => (global.as_str(), false),
        };
        text.push_str(&format!("\n  global {limit}"));
        if per_region {
            let each = match limit.ends_with(" approx") {
                true => "the whole limit in each region",
                false => "each region on its part",
            };
            text.push_str(&format!(
                ": decided per region ({each}: a window under {} ms, or a rate with no count to move)",
                regions.shortest_window().as_millis()
            ));
        }
    }
    text
}
