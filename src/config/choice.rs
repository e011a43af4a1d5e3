//! The closed choices of the configuration (`algorithm`, `mode`, `balance`, ...): each one Rust
//! enum with one name table, and [`Spelled`], what the raw model holds for it — the known choice,
//! or the spelling that compile reports with the accepted names. An unknown name never stops the
//! parse: every problem of the file is still reported at once.

use serde::{Deserialize, Deserializer};
use strum::{AsRefStr, Display, EnumString, VariantNames};

use super::problem::Problems;
use crate::limiter::FailureMode;

/// A closed set of names: how one is read and how the accepted ones are listed.
pub trait Choice: Sized + Copy {
    /// What a choice is called in `unknown {WHAT} "x": use a, b or c`.
    const WHAT: &'static str;
    fn from_name(name: &str) -> Option<Self>;
    /// The accepted names, as a message lists them: `a, b or c`.
    fn names() -> String;
}

/// A choice as written: a known name, or another spelling (a problem compile reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spelled<T> {
    Known(T),
    Unknown(String),
}

impl<'de, T: Choice> Deserialize<'de> for Spelled<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ok(T::from_name(&name).map_or(Spelled::Unknown(name), Spelled::Known))
    }
}

impl<T: Choice> Spelled<T> {
    /// The choice; an unknown spelling is reported at `at` with the accepted names.
    pub fn known(&self, at: &str, p: &mut Problems) -> Option<T> {
        match self {
            Spelled::Known(choice) => Some(*choice),
            Spelled::Unknown(name) => {
                p.add(
                    at,
                    format!("unknown {} {name:?}: use {}", T::WHAT, T::names()),
                );
                None
            }
        }
    }
}

impl<T: AsRef<str>> Spelled<T> {
    /// The name as written.
    pub fn spelling(&self) -> &str {
        match self {
            Spelled::Known(choice) => choice.as_ref(),
            Spelled::Unknown(name) => name,
        }
    }
}

/// The choice written at `at`, `default` when none is; `None` (and a problem) when unknown.
pub fn chosen<T: Choice>(
    raw: Option<&Spelled<T>>,
    default: T,
    at: &str,
    p: &mut Problems,
) -> Option<T> {
    raw.map_or(Some(default), |spelled| spelled.known(at, p))
}

/// `a, b or c`.
pub fn or_list(names: &[&str]) -> String {
    match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// Implements [`Choice`]: from a strum derive (`EnumString` + `VariantNames`) as the name
/// table, or from a type's own parse function and list of names.
macro_rules! impl_choice {
    ($choice:ty, $what:literal) => {
        $crate::config::choice::impl_choice!(
            $choice,
            $what,
            |name: &str| name.parse().ok(),
            $crate::config::choice::or_list(<$choice as ::strum::VariantNames>::VARIANTS)
        );
    };
    ($choice:ty, $what:literal, $parse:expr, $names:expr) => {
        impl $crate::config::choice::Choice for $choice {
            const WHAT: &'static str = $what;

            fn from_name(name: &str) -> Option<Self> {
                $parse(name)
            }

            fn names() -> String {
                String::from($names)
            }
        }
    };
}
pub(crate) use impl_choice;

// The failure mode's names are the limiter's own strum table.
impl_choice!(FailureMode, "failure mode");
// And the failures an upstream's tries are retried on.
impl_choice!(crate::route::upstream::RetryCause, "retry cause");
// And a limit's consistency across regions.
impl_choice!(crate::limiter::regions::Consistency, "consistency");

/// `scope:` of a limit: where it is counted. `global` is shared within a region and kept across
/// regions (`limiter::regions`): the limiter counts it as shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumString, VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum ScopeName {
    Shared,
    Local,
    Global,
}
impl_choice!(ScopeName, "scope");
// So are a route's `auth:` modes.
impl_choice!(crate::caller::consumers::AuthMode, "auth mode");
// And the certificate fields that name a consumer.
impl_choice!(
    crate::caller::consumers::CertificateField,
    "certificate field"
);

/// `algorithm:` of a limit (and of an RLS rate limit): which family runs it. The parameters
/// that make it a `limiter::Algorithm` are compiled by each section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumString, VariantNames, AsRefStr, Display)]
#[strum(serialize_all = "snake_case")]
pub enum AlgorithmName {
    Gcra,
    TokenBucket,
    LeakyBucket,
    FixedWindow,
    Calendar,
    SlidingWindow,
    SlidingLog,
    Concurrency,
}
impl_choice!(AlgorithmName, "algorithm");

/// `mode:` of a limit: `auto` (the default) leases a key while its traffic makes leases pay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumString, VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum LimitMode {
    Auto,
    Exact,
    Leased,
}
impl_choice!(LimitMode, "mode");

/// `headers:` of a limit: whether the `RateLimit` fields, a `429`'s body and the usage API show
/// it (`hide` a guard whose numbers are not the client's business; `show` a quota).
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumString, VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum HeaderVisibility {
    Show,
    Hide,
}
impl_choice!(HeaderVisibility, "value");

/// `on_missing:` of a limit: what a request without one of the key's parts gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumString, VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum OnMissingName {
    UseEmpty,
    Skip,
    Deny,
}
impl_choice!(OnMissingName, "value");

/// `upstream.balance:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumString, VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum BalanceName {
    RoundRobin,
    Consistent,
}
impl_choice!(BalanceName, "balance");

/// `redis.mode:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumString, VariantNames, AsRefStr, Display)]
#[strum(serialize_all = "snake_case")]
pub enum RedisMode {
    Standalone,
    Cluster,
    Sentinel,
}
impl_choice!(RedisMode, "mode");

/// `path.encoded_slash:`: refuse `%2F` in paths, or keep it encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumString, VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum EncodedSlash {
    Reject,
    Keep,
}
impl_choice!(EncodedSlash, "value");

/// `listen[].tls.client_auth.mode:`: whether a client without a certificate may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumString, VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum ClientAuthMode {
    /// A certificate is asked for and verified if presented; a client without one proceeds.
    Request,
    /// The handshake fails without a valid certificate.
    Require,
}
impl_choice!(ClientAuthMode, "mode");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_name_is_kept_for_its_problem() {
        let raw: Vec<Spelled<AlgorithmName>> =
            serde_yaml::from_str("[sliding_log, leaky]").unwrap();
        assert_eq!(
            raw,
            [
                Spelled::Known(AlgorithmName::SlidingLog),
                Spelled::Unknown("leaky".into())
            ]
        );
        let mut p = Problems::default();
        assert_eq!(raw[1].known("a", &mut p), None);
        assert_eq!(
            p.lines(),
            ["a: unknown algorithm \"leaky\": use gcra, token_bucket, leaky_bucket, fixed_window, calendar, sliding_window, sliding_log or concurrency"]
        );
        assert_eq!(AlgorithmName::TokenBucket.as_ref(), "token_bucket");
    }
}
