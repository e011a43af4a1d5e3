//! The configuration file as written: serde structs that only describe the YAML.
//!
//! Nothing here is validated beyond YAML types; `compile.rs` turns these into types that
//! cannot be wrong. A closed choice (`algorithm`, `mode`, ...) is a [`Spelled`] enum: known, or
//! the spelling compile reports with the accepted names (`choice.rs`). Every table denies unknown
//! keys: each is a misfit (`misfits.rs`), told with its path and the known key nearest to it, and
//! all of them are reported at once.

use crate::route::upstream::RetryCause;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::caller::consumers::{AuthMode, CertificateField};
use crate::limiter::regions::Consistency;
use crate::limiter::FailureMode;

use super::addresses::RawAddresses;
use super::api_keys::RawApiKeys;
use super::choice::{
    AlgorithmName, BalanceName, ClientAuthMode, EncodedSlash, HeaderVisibility, LimitMode,
    OnMissingName, RedisMode, ScopeName, Spelled,
};
use super::observe::{RawAccessLog, RawRequestId, RawTracing};
use super::server::ServerSettings;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: ServerSettings,
    #[serde(default)]
    pub listen: Vec<RawListener>,
    pub admin: Option<RawAdmin>,
    pub redis: Option<RawRedis>,
    /// One limit across regions: this gateway's region, and every region's Redis.
    pub regions: Option<RawRegions>,
    pub failure_mode: Option<Spelled<FailureMode>>,
    pub instances: Option<u64>,
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    pub addresses: Option<RawAddresses>,
    pub identity: Option<RawIdentity>,
    pub key_secret: Option<RawSecret>,
    pub ipv6_prefix: Option<u8>,
    pub path: Option<RawPath>,
    pub access_log: Option<RawAccessLog>,
    pub request_id: Option<RawRequestId>,
    pub tracing: Option<RawTracing>,
    pub rls: Option<RawRls>,
    /// Reload when the file, or a file it names, changes (`reload.rs`).
    pub watch: Option<bool>,
    /// Common limits: each defined once, one bucket for every route that uses it (`use:`).
    #[serde(default)]
    pub limits: Vec<RawLimit>,
    /// Named upstreams: each defined once, one pool for every route that names it.
    #[serde(default)]
    pub upstreams: BTreeMap<String, RawUpstream>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRls {
    pub listen: Option<String>,
    pub config_dir: Option<String>,
    pub algorithm: Option<Spelled<AlgorithmName>>,
    pub failure_mode: Option<Spelled<FailureMode>>,
    pub response_dynamic_metadata: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPath {
    pub encoded_slash: Option<Spelled<EncodedSlash>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub listen: Option<String>,
    pub token: Option<RawSecret>,
    pub audit_log: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedis {
    pub mode: Option<Spelled<RedisMode>>,
    pub url: Option<String>,
    pub nodes: Option<Vec<String>>,
    pub sentinels: Option<Vec<String>>,
    pub master_name: Option<String>,
    pub master_username: Option<String>,
    pub master_password: Option<RawSecret>,
    pub username: Option<String>,
    pub password: Option<RawSecret>,
    pub tls: Option<RawRedisTls>,
    pub timeout_ms: Option<u64>,
    pub key_prefix: Option<String>,
    pub max_batch: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: Option<String>,
    #[serde(rename = "match")]
    pub matcher: Option<RawMatch>,
    pub upstream: Option<RawRouteUpstream>,
    #[serde(default)]
    pub limits: Vec<RawLimit>,
    pub rate_limit_headers: Option<bool>,
    pub shadow: Option<bool>,
    pub failure_mode: Option<Spelled<FailureMode>>,
    pub limiter_timeout_ms: Option<u64>,
    pub max_body_bytes: Option<u64>,
    pub request_timeout_ms: Option<u64>,
    pub addresses: Option<RawAddresses>,
    pub auth: Option<RawAuth>,
    pub adaptive_concurrency: Option<super::adaptive::RawAdaptive>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub path_prefix: Option<String>,
    pub path: Option<String>,
    pub host: Option<String>,
    pub methods: Option<Vec<String>>,
}

/// A route's `upstream:`: the name of one of `upstreams:` (`upstream: billing`), or a map: its
/// own servers and settings, or `use: NAME` with the route's own `strip_prefix` and `host`.
#[derive(Debug)]
pub enum RawRouteUpstream {
    Named(String),
    Inline(Box<RawUpstream>),
}

impl<'de> Deserialize<'de> for RawRouteUpstream {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UpstreamVisitor;
        impl<'de> Visitor<'de> for UpstreamVisitor {
            type Value = RawRouteUpstream;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "the name of an upstream (upstreams: at the top), or { servers: [...] }",
                )
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<RawRouteUpstream, E> {
                Ok(RawRouteUpstream::Named(value.to_string()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawRouteUpstream, A::Error> {
                RawUpstream::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|raw| RawRouteUpstream::Inline(Box::new(raw)))
            }
        }
        deserializer.deserialize_any(UpstreamVisitor)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// A route's map that names an upstream of `upstreams:`, beside its own `strip_prefix`
    /// and `host`.
    #[serde(rename = "use")]
    pub uses: Option<String>,
    #[serde(default)]
    pub servers: Vec<String>,
    pub connect_timeout_ms: Option<u64>,
    pub read_timeout_ms: Option<u64>,
    pub balance: Option<Spelled<BalanceName>>,
    pub hash_key: Option<Vec<String>>,
    pub health_check_interval_ms: Option<u64>,
    pub retries: Option<usize>,
    pub retry_on: Option<Vec<Spelled<RetryCause>>>,
    pub retry_budget: Option<RawRetryBudget>,
    pub strip_prefix: Option<String>,
    pub host: Option<String>,
    pub tls: Option<RawUpstreamTls>,
    pub http2: Option<bool>,
    pub passive_health: Option<RawPassiveHealth>,
}

/// `upstream.retry_budget:`, a share of the requests in flight, with a floor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetryBudget {
    pub percent: Option<u64>,
    pub min_concurrency: Option<u64>,
}

/// `upstream.passive_health:`, outlier detection (on unless `enabled: false`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPassiveHealth {
    pub enabled: Option<bool>,
    pub consecutive_failures: Option<u64>,
    pub base_ejection_ms: Option<u64>,
    pub max_ejection_ms: Option<u64>,
    pub max_ejected_percent: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamTls {
    pub sni: Option<String>,
    pub verify: Option<bool>,
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// `regions:` (`config/regions.rs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRegions {
    pub this: Option<String>,
    /// The exchange period T (`1s`).
    pub every: Option<String>,
    /// The one-way delay between regions the bounds assume (`250ms`).
    pub max_delay: Option<String>,
    pub home: Option<String>,
    pub seed_percent: Option<u64>,
    #[serde(default)]
    pub list: Vec<RawRegion>,
}

/// One of `regions.list`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRegion {
    pub name: Option<String>,
    pub weight: Option<u64>,
    /// Where region sync reads this region's records (this region's own is `redis:`).
    pub redis: Option<RawRedis>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    /// A route's entry that names a common limit (`limits:` at the top) and nothing else.
    #[serde(rename = "use")]
    pub uses: Option<String>,
    pub name: Option<String>,
    pub key: Option<Vec<String>>,
    pub on_missing: Option<Spelled<OnMissingName>>,
    pub algorithm: Option<Spelled<AlgorithmName>>,
    pub rate: Option<String>,
    pub time_zone: Option<String>,
    pub burst: Option<u64>,
    pub capacity: Option<u64>,
    pub max_delay: Option<String>,
    pub max: Option<u64>,
    pub lease: Option<String>,
    pub cost: Option<u64>,
    pub cost_header: Option<String>,
    pub cost_max: Option<u64>,
    pub shadow: Option<bool>,
    pub headers: Option<Spelled<HeaderVisibility>>,
    pub split: Option<u64>,
    pub mode: Option<Spelled<LimitMode>>,
    pub lease_units: Option<u64>,
    pub scope: Option<Spelled<ScopeName>>,
    /// `scope: global`: `strict` (the default) or `approx`.
    pub consistency: Option<Spelled<Consistency>>,
    pub cost_from_response: Option<RawResponseCost>,
    /// Per plan: other parameters, or `off`.
    pub plans: Option<BTreeMap<String, RawEntry>>,
    /// Per consumer: other parameters, or `off`.
    pub consumers: Option<BTreeMap<String, RawEntry>>,
}

impl RawLimit {
    /// The fields written besides `use` (a `use:` entry may have none).
    pub fn fields_beside_use(&self) -> Vec<&'static str> {
        let written = [
            ("name", self.name.is_some()),
            ("key", self.key.is_some()),
            ("on_missing", self.on_missing.is_some()),
            ("algorithm", self.algorithm.is_some()),
            ("rate", self.rate.is_some()),
            ("time_zone", self.time_zone.is_some()),
            ("burst", self.burst.is_some()),
            ("capacity", self.capacity.is_some()),
            ("max_delay", self.max_delay.is_some()),
            ("max", self.max.is_some()),
            ("lease", self.lease.is_some()),
            ("cost", self.cost.is_some()),
            ("cost_header", self.cost_header.is_some()),
            ("cost_max", self.cost_max.is_some()),
            ("shadow", self.shadow.is_some()),
            ("headers", self.headers.is_some()),
            ("split", self.split.is_some()),
            ("mode", self.mode.is_some()),
            ("lease_units", self.lease_units.is_some()),
            ("scope", self.scope.is_some()),
            ("consistency", self.consistency.is_some()),
            ("cost_from_response", self.cost_from_response.is_some()),
            ("plans", self.plans.is_some()),
            ("consumers", self.consumers.is_some()),
        ];
        written
            .into_iter()
            .filter_map(|(field, set)| set.then_some(field))
            .collect()
    }
}

/// A limit's parameters for one plan or consumer: `off` (the limit does not apply), or the
/// parameters that differ (the rest, and the algorithm and key, are the limit's own).
#[derive(Debug, Clone)]
pub enum RawEntry {
    Off,
    Params(RawParams),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawParams {
    pub rate: Option<String>,
    pub burst: Option<u64>,
    pub capacity: Option<u64>,
    pub max_delay: Option<String>,
    pub max: Option<u64>,
}

impl<'de> Deserialize<'de> for RawEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = RawEntry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("off, or { rate, burst, capacity, max_delay, max }")
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<RawEntry, E> {
                match value {
                    "off" => Ok(RawEntry::Off),
                    other => Err(E::custom(format!(
                        "unknown value {other:?}: use off, or {{ rate, burst, capacity, max_delay, max }}"
                    ))),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawEntry, A::Error> {
                RawParams::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawEntry::Params)
            }
        }
        deserializer.deserialize_any(EntryVisitor)
    }
}

/// `identity:`: the plans there are, and the verifiers of credentials.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdentity {
    #[serde(default)]
    pub plans: Vec<String>,
    pub default_plan: Option<String>,
    pub api_keys: Option<RawApiKeys>,
    pub jwt: Option<RawJwt>,
    pub mtls: Option<RawMtls>,
}

/// `identity.jwt`: where the keys come from, which algorithms, issuers, audiences and claims
/// (compiled by `jwt.rs`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    pub jwks_file: Option<String>,
    pub jwks_url: Option<String>,
    pub refresh_seconds: Option<u64>,
    pub fetch_timeout_ms: Option<u64>,
    pub max_jwks_bytes: Option<u64>,
    pub hmac_secret: Option<RawSecret>,
    pub algorithms: Option<Vec<String>>,
    pub issuer: Option<OneOrMany>,
    pub audience: Option<OneOrMany>,
    pub leeway_seconds: Option<u64>,
    pub consumer_claim: Option<String>,
    pub plan_claim: Option<String>,
}

/// A string, or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `identity.mtls`: which field of a verified client certificate names the consumer, and the
/// plans of consumers so named.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMtls {
    pub consumer: Option<Spelled<CertificateField>>,
    #[serde(default)]
    pub plans: BTreeMap<String, String>,
}

/// A route's `auth:`: `required`, `optional` or `off`, or `{ mode, plans }`.
#[derive(Debug, Clone)]
pub enum RawAuth {
    Mode(Spelled<AuthMode>),
    Table(RawAuthTable),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthTable {
    pub mode: Option<Spelled<AuthMode>>,
    pub plans: Option<Vec<String>>,
}

impl<'de> Deserialize<'de> for RawAuth {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AuthVisitor;
        impl<'de> Visitor<'de> for AuthVisitor {
            type Value = RawAuth;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("required, optional or off, or { mode, plans }")
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<RawAuth, E> {
                Spelled::deserialize(de::value::StrDeserializer::<E>::new(value)).map(RawAuth::Mode)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawAuth, A::Error> {
                RawAuthTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawAuth::Table)
            }
        }
        deserializer.deserialize_any(AuthVisitor)
    }
}

/// `cost_from_response:` of a limit: the header (or trailer) the upstream reports the cost in.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResponseCost {
    pub header: Option<String>,
    pub estimate: Option<u64>,
    pub max: Option<u64>,
}

/// A secret as written: a string, or `{ file: PATH }`, `{ env: NAME }` or
/// `{ credential: NAME }`. Its `Debug` never shows a value.
#[derive(Clone)]
pub enum RawSecret {
    Plain(String),
    From(RawSecretFrom),
}

/// Where a secret is to be read from: exactly one of the three.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSecretFrom {
    pub file: Option<String>,
    pub env: Option<String>,
    pub credential: Option<String>,
}

impl fmt::Debug for RawSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawSecret::Plain(_) => f.write_str("Plain(***)"),
            RawSecret::From(from) => write!(f, "From({from:?})"),
        }
    }
}

impl<'de> Deserialize<'de> for RawSecret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SecretVisitor;
        impl<'de> Visitor<'de> for SecretVisitor {
            type Value = RawSecret;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, or { file: PATH }, { env: NAME } or { credential: NAME }")
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<RawSecret, E> {
                Ok(RawSecret::Plain(value.to_string()))
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<RawSecret, E> {
                Ok(RawSecret::Plain(value.to_string()))
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<RawSecret, E> {
                Ok(RawSecret::Plain(value.to_string()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawSecret, A::Error> {
                RawSecretFrom::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawSecret::From)
            }
        }
        deserializer.deserialize_any(SecretVisitor)
    }
}

/// A listener as written: an address, or a table.
#[derive(Debug, Clone)]
pub enum RawListener {
    Address(String),
    Table(RawListenerTable),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenerTable {
    pub addr: Option<String>,
    pub tls: Option<RawListenerTls>,
    pub h2c: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenerTls {
    #[serde(default)]
    pub certificates: Vec<RawCertificate>,
    pub http2: Option<bool>,
    pub client_auth: Option<RawClientAuth>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientAuth {
    pub mode: Option<Spelled<ClientAuthMode>>,
    pub ca: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCertificate {
    pub cert: Option<String>,
    pub key: Option<String>,
}

impl<'de> Deserialize<'de> for RawListener {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListenerVisitor;
        impl<'de> Visitor<'de> for ListenerVisitor {
            type Value = RawListener;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an address (IP:PORT), or { addr, tls, h2c }")
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<RawListener, E> {
                Ok(RawListener::Address(value.to_string()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawListener, A::Error> {
                RawListenerTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawListener::Table)
            }
        }
        deserializer.deserialize_any(ListenerVisitor)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedisTls {
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}
