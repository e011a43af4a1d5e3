//! Why a call of the admin APIs (the usage API, the quota admin API, the explain endpoint and
//! the dashboard's explain form) gets no answer: one enum, and one mapping from each refusal to
//! its HTTP status (`status`) and its words (`Display`), which the answer (a problem) and the
//! quota admin's audit line (`reason`) both say. A refusal is chosen where its cause is found,
//! never from an error's text.

use std::borrow::Cow;

use crate::caller::consumers::MAX_CONSUMER_ID;
use crate::edge::query::QueryError;
use crate::limiter::LimiterError;

/// Why a call of the admin APIs gets no answer (a quota admin call changes nothing).
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    // 400: the call is not one the API takes.
    /// `takes`: the parameters the call takes, which its refusal names.
    #[error("unknown parameter {name:?}{}", Listed(takes))]
    UnknownParameter {
        name: String,
        takes: &'static [&'static str],
    },
    #[error("{0} is given more than once")]
    RepeatedParameter(String),
    #[error("{0}: not UTF-8 text (only id may be any bytes)")]
    NotText(String),
    #[error("{name} is required{also}")]
    Missing {
        name: &'static str,
        /// What the call says of it besides (e.g. its bounds), or nothing.
        also: &'static str,
    },
    #[error("{name}: {why}")]
    Malformed {
        name: &'static str,
        why: Cow<'static, str>,
    },
    #[error("X-Audit-Actor: 1 to 128 visible ASCII characters")]
    Actor,
    #[error("give one of until and ttl_seconds, not both")]
    TwoExpiries,
    #[error("consumer is required: 1 to {MAX_CONSUMER_ID} bytes")]
    NoConsumer,
    /// The usage API cannot build the keys of the consumer's limits.
    #[error("{0}")]
    Unkeyed(&'static str),
    // The request an explanation describes is not one.
    #[error("{url:?} is not a URL: {why}")]
    NotUrl { url: String, why: String },
    #[error("{0:?} names no host: give http://HOST/PATH")]
    NoHost(String),
    #[error("header {0:?}: give Name: value")]
    HeaderField(String),
    #[error("at most {0} headers")]
    TooManyHeaders(usize),
    #[error("not a request sluice could receive: {0}")]
    NotRequest(String),

    // 404: what the call names does not exist.
    #[error("not found")]
    NoCall,
    #[error("no route named {0:?}")]
    NoRoute(String),
    #[error("the caller meets no limit named {0:?} on this route")]
    NoLimit(String),
    #[error("no plan named {0:?}")]
    NoPlan(String),
    #[error("no consumer named {0:?} is known: {1}")]
    UnknownConsumer(String, &'static str),
    #[error("no such override in force")]
    NoOverride,

    // 405
    #[error("use {0}")]
    Method(&'static str),

    // 409: the call names something the API cannot change so.
    #[error("limit {0:?} is local to each gateway (scope: local): the quota admin API changes only what every gateway shares")]
    LocalLimit(String),
    #[error("limit {0:?} is one limit across regions (scope: global): a reset, credit or override in one region's Redis would hand back or move units other regions were given, so the quota admin API leaves it alone")]
    GlobalLimit(String),
    #[error("limit {0:?} is not keyed on what is named alone (consumer, client_ip, route and const: parts)")]
    NotKeyed(String),
    #[error("no limit of the route is keyed on what is named alone")]
    NoneKeyed,
    #[error("route {0:?} does not verify callers (auth: off): its requests have no consumer")]
    NoConsumers(String),
    #[error("the route has split limits: their shards are not one caller's")]
    SplitLimits,
    #[error("credit applies to gcra, token_bucket, leaky_bucket, fixed_window and calendar limits; reset the others")]
    NotCreditable,
    #[error("overrides full: at most {0} at once")]
    OverridesFull(usize),
    #[error("{0}")]
    Undecidable(&'static str),
    #[error("limit {limit:?}: {why}")]
    Quota { limit: String, why: String },

    // 500, 503: the gateway could not do it.
    #[error("{0}")]
    Internal(Cow<'static, str>),
    #[error("the limiter cannot be {doing}: {error}")]
    Unavailable {
        doing: &'static str,
        error: LimiterError,
    },
}

/// The parameters a call takes, as its refusal names them: `: use a, b and c`, or nothing.
struct Listed(&'static [&'static str]);

impl std::fmt::Display for Listed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some((last, rest)) = self.0.split_last() else {
            return Ok(());
        };
        match rest.is_empty() {
            true => write!(f, ": use {last}"),
            false => write!(f, ": use {} and {last}", rest.join(", ")),
        }
    }
}

impl From<QueryError> for AdminError {
    fn from(error: QueryError) -> AdminError {
        match error {
            QueryError::Unknown { name, takes } => AdminError::UnknownParameter { name, takes },
            QueryError::Repeated(name) => AdminError::RepeatedParameter(name),
            QueryError::NotText(name) => AdminError::NotText(name),
            QueryError::Other(why) => AdminError::Malformed {
                name: "query",
                why: why.into(),
            },
        }
    }
}

impl AdminError {
    /// The answer's HTTP status: the one place a refusal gets it.
    pub fn status(&self) -> u16 {
        use AdminError::*;
        match self {
            UnknownParameter { .. }
            | RepeatedParameter(_)
            | NotText(_)
            | Missing { .. }
            | Malformed { .. }
            | Actor
            | TwoExpiries
            | NoConsumer
            | Unkeyed(_)
            | NotUrl { .. }
            | NoHost(_)
            | HeaderField(_)
            | TooManyHeaders(_)
            | NotRequest(_) => 400,
            NoCall | NoRoute(_) | NoLimit(_) | NoPlan(_) | UnknownConsumer(..) | NoOverride => 404,
            Method(_) => 405,
            LocalLimit(_)
            | GlobalLimit(_)
            | NotKeyed(_)
            | NoneKeyed
            | NoConsumers(_)
            | SplitLimits
            | NotCreditable
            | OverridesFull(_)
            | Undecidable(_)
            | Quota { .. } => 409,
            Internal(_) => 500,
            Unavailable { .. } => 503,
        }
    }

    /// The audit's and the metric's `result` of a call refused so: `failed` when the gateway
    /// could not do it, `refused` when the call could not be done.
    pub fn result(&self) -> &'static str {
        match self.status() >= 500 {
            true => "failed",
            false => "refused",
        }
    }

    /// The limiter could not be written.
    pub fn unwritten(error: LimiterError) -> AdminError {
        AdminError::Unavailable {
            doing: "written",
            error,
        }
    }

    /// The limiter could not be read.
    pub fn unread(error: LimiterError) -> AdminError {
        AdminError::Unavailable {
            doing: "read",
            error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_has_one_status() {
        let cases = [
            (
                AdminError::UnknownParameter {
                    name: "x".into(),
                    takes: &[],
                },
                400,
            ),
            (AdminError::NoConsumer, 400),
            (AdminError::TooManyHeaders(64), 400),
            (AdminError::NotText("consumer".into()), 400),
            (AdminError::UnknownConsumer("bob".into(), "why"), 404),
            (AdminError::LocalLimit("per_gateway".into()), 409),
            (AdminError::GlobalLimit("monthly".into()), 409),
            (AdminError::OverridesFull(1000), 409),
            (AdminError::unwritten(LimiterError::Timeout(5)), 503),
        ];
        for (error, status) in cases {
            assert_eq!(error.status(), status, "{error}");
        }
        assert_eq!(
            AdminError::LocalLimit("g".into()).to_string(),
            "limit \"g\" is local to each gateway (scope: local): the quota admin API changes only what every gateway shares"
        );
        let unknown = AdminError::UnknownParameter {
            name: "x".into(),
            takes: &["consumer", "route", "plan"],
        };
        assert_eq!(
            unknown.to_string(),
            "unknown parameter \"x\": use consumer, route and plan"
        );
        let one = AdminError::UnknownParameter {
            name: "x".into(),
            takes: &["host"],
        };
        assert_eq!(one.to_string(), "unknown parameter \"x\": use host");
        assert_eq!(
            AdminError::unread(LimiterError::Timeout(5)).result(),
            "failed"
        );
    }
}
