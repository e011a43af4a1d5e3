//! The quota admin API's query, read into one struct (`edge::query`): a credit `id` stays the
//! bytes sent (`%FF` and `%FE` are two ids; a lossy decoding would make both U+FFFD) while
//! every other parameter must be UTF-8 text. A parameter the API does not know, one given twice,
//! or text that is not UTF-8 makes the call not one (`400`, neither audited nor counted); the
//! typed values (numbers within their bounds, an address, a time) are read by the call that
//! needs them, which audits its refusal.

use std::borrow::Cow;
use std::net::IpAddr;
use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use serde_bytes::ByteBuf;

use crate::edge::admin_error::AdminError;
use crate::route::table::RouteTable;

/// The longest an override (or a plan override) may last: 30 days.
pub const MAX_OVERRIDE_SECONDS: u64 = 30 * 24 * 3600;
/// The most units one credit gives back.
pub const MAX_CREDIT_UNITS: u64 = 1_000_000_000;
/// The longest credit id.
pub const MAX_CREDIT_ID: usize = 128;

/// What a credit id's bytes are shown as when they are not UTF-8: percent-encoded, leaving
/// the characters a query leaves as they are.
const SHOWN_AS_IS: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A credit's id: the bytes the caller sent, 1 to [`MAX_CREDIT_ID`] of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreditId(Vec<u8>);

impl CreditId {
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// As the answer and the audit show it: the text when it is UTF-8, else its bytes
    /// percent-encoded (with `encoded` true).
    pub fn shown(&self) -> (Cow<'_, str>, bool) {
        match std::str::from_utf8(&self.0) {
            Ok(text) => (Cow::Borrowed(text), false),
            Err(_) => {
                let encoded = percent_encoding::percent_encode(&self.0, SHOWN_AS_IS);
                (Cow::Owned(encoded.to_string()), true)
            }
        }
    }
}

/// An override's quota: lifted, or units per the limit's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quota {
    Off,
    Units(u64),
}

/// What a call names: the query's parameters, each as sent (decoded), checked for its form
/// by the accessor that reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub route: Option<String>,
    pub limit: Option<String>,
    pub consumer: Option<String>,
    pub plan: Option<String>,
    client_ip: Option<String>,
    units: Option<String>,
    id: Option<ByteBuf>,
    quota: Option<String>,
    ttl_seconds: Option<String>,
    until: Option<String>,
}

impl Params {
    /// The parameters of `query`: `Err` when it is not a call of the API.
    pub fn parse(query: Option<&str>) -> Result<Params, AdminError> {
        Ok(crate::edge::query::read(query.unwrap_or("").as_bytes())?)
    }

    /// `route`, which every call but a plan override's needs; a call naming a common limit
    /// (`limit=`) may leave it out: the first route using it reaches its one bucket.
    pub fn route_in<'r>(&'r self, routes: &'r RouteTable) -> Result<&'r str, AdminError> {
        let common = || {
            let limit = self.limit.as_deref()?;
            routes.using_common(limit).map(|route| &*route.name)
        };
        match self.route.as_deref() {
            Some(route) => Ok(route),
            None => common().map_or_else(
                || required(None, "route", " (unless limit names a common limit)"),
                Ok,
            ),
        }
    }

    /// `limit`, for the calls that name one.
    pub fn limit(&self) -> Result<&str, AdminError> {
        required(self.limit.as_deref(), "limit", "")
    }

    /// `consumer`, for the calls that must name one.
    pub fn consumer(&self) -> Result<&str, AdminError> {
        required(self.consumer.as_deref(), "consumer", "")
    }

    /// `plan`, for the calls that must name one.
    pub fn plan(&self) -> Result<&str, AdminError> {
        required(self.plan.as_deref(), "plan", "")
    }

    /// `client_ip`, when named: an IP address.
    pub fn client_ip(&self) -> Result<Option<IpAddr>, AdminError> {
        let Some(text) = self.client_ip.as_deref() else {
            return Ok(None);
        };
        let ip = text.parse::<IpAddr>().map_err(|_| AdminError::Malformed {
            name: "client_ip",
            why: format!("{text:?} is not an IP address").into(),
        })?;
        Ok(Some(ip))
    }

    /// `client_ip` as sent, for the audit.
    pub fn client_ip_text(&self) -> Option<&str> {
        self.client_ip.as_deref()
    }

    /// `units`: 1 to [`MAX_CREDIT_UNITS`].
    pub fn units(&self) -> Result<u64, AdminError> {
        number(self.units.as_deref(), "units", (1, MAX_CREDIT_UNITS))
    }

    /// `id`: 1 to [`MAX_CREDIT_ID`] bytes, any bytes.
    pub fn id(&self) -> Result<CreditId, AdminError> {
        let id = self
            .id
            .as_ref()
            .filter(|id| !id.is_empty() && id.len() <= MAX_CREDIT_ID);
        let id = id.ok_or(AdminError::Missing {
            name: "id",
            also: ": 1 to 128 bytes, the same for a credit sent again",
        })?;
        Ok(CreditId(id.to_vec()))
    }

    /// `quota`: `off`, or a whole number of units of at least 1.
    pub fn quota(&self) -> Result<Quota, AdminError> {
        match self.quota.as_deref() {
            Some("off") => Ok(Quota::Off),
            quota => number(quota, "quota (or off)", (1, u64::MAX)).map(Quota::Units),
        }
    }

    /// How long a change lasts from `now`: `ttl_seconds` (1 to 30 days), or until `until` (an
    /// RFC 3339 time, within 30 days); one of them.
    pub fn lifetime(&self, now: jiff::Timestamp) -> Result<Duration, AdminError> {
        let bounds = (1, MAX_OVERRIDE_SECONDS);
        match (self.ttl_seconds.as_deref(), self.until.as_deref()) {
            (Some(_), Some(_)) => Err(AdminError::TwoExpiries),
            (Some(ttl), None) => number(Some(ttl), "ttl_seconds", bounds).map(Duration::from_secs),
            (None, Some(until)) => lifetime_until(until, now),
            (None, None) => Err(AdminError::Missing {
                name: "ttl_seconds (or until)",
                also: ": 1 to 2592000 seconds, or an RFC 3339 time within 30 days",
            }),
        }
    }
}

fn required<'a>(
    value: Option<&'a str>,
    name: &'static str,
    also: &'static str,
) -> Result<&'a str, AdminError> {
    value.ok_or(AdminError::Missing { name, also })
}

/// A whole number from `min` to `max` named `name`.
fn number(
    text: Option<&str>,
    name: &'static str,
    (min, max): (u64, u64),
) -> Result<u64, AdminError> {
    let text = required(text, name, "")?;
    text.parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| AdminError::Malformed {
            name,
            why: format!("a whole number from {min} to {max}").into(),
        })
}

/// The time from `now` until `until` (RFC 3339): at least a second, at most 30 days.
fn lifetime_until(until: &str, now: jiff::Timestamp) -> Result<Duration, AdminError> {
    let malformed = |why: String| AdminError::Malformed {
        name: "until",
        why: why.into(),
    };
    let at: jiff::Timestamp = until.parse().map_err(|_| {
        malformed(format!(
            "{until:?} is not an RFC 3339 time (e.g. 2026-12-31T18:00:00Z)"
        ))
    })?;
    let left = at.duration_since(now);
    let seconds = left.as_secs();
    if seconds < 1 || seconds as u64 > MAX_OVERRIDE_SECONDS {
        return Err(malformed(format!(
            "{until:?} is not between 1 second and 30 days from now"
        )));
    }
    Ok(Duration::from_secs(seconds as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_stays_its_bytes_and_other_parameters_are_text() {
        let ff = Params::parse(Some("id=%FF&route=a+b")).expect("a call");
        let fe = Params::parse(Some("id=%FE")).expect("a call");
        assert_ne!(ff.id().ok(), fe.id().ok(), "two ids");
        assert_eq!(ff.route.as_deref(), Some("a b"));
        assert_eq!(ff.id().expect("an id").shown(), ("%FF".into(), true));
        let text = Params::parse(Some("id=refund-7")).expect("a call");
        assert_eq!(text.id().expect("an id").bytes(), b"refund-7");
        assert_eq!(
            text.id().expect("an id").shown(),
            ("refund-7".into(), false)
        );
        assert!(matches!(
            Params::parse(Some("consumer=%FF")),
            Err(AdminError::NotText(name)) if name == "consumer"
        ));
        assert!(matches!(
            Params::parse(Some("route=a&route=b")),
            Err(AdminError::RepeatedParameter(name)) if name == "route"
        ));
        assert!(matches!(
            Params::parse(Some("nope=1")),
            Err(AdminError::UnknownParameter { .. })
        ));
    }

    #[test]
    fn a_lifetime_is_a_ttl_or_a_time_within_thirty_days() {
        let now: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().expect("a time");
        let day = |query: &str| Params::parse(Some(query)).expect("a call").lifetime(now);
        assert_eq!(
            day("until=2026-01-02T00:00:00Z").ok(),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(day("ttl_seconds=60").ok(), Some(Duration::from_secs(60)));
        assert!(matches!(
            day("until=2025-12-31T00:00:00Z"),
            Err(AdminError::Malformed { .. })
        ));
        assert!(matches!(
            day("until=2026-03-01T00:00:00Z"),
            Err(AdminError::Malformed { .. })
        ));
        assert!(matches!(
            day("until=tomorrow"),
            Err(AdminError::Malformed { .. })
        ));
        assert!(matches!(
            day("until=2026-01-02T00:00:00Z&ttl_seconds=5"),
            Err(AdminError::TwoExpiries)
        ));
        assert!(matches!(day(""), Err(AdminError::Missing { .. })));
    }
}
