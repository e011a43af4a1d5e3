//! What the gateway would do with a request, told without doing it: the route it matches (or
//! why none), the client's standing in the address lists, the verified caller and its plan,
//! the tier it meets, every limit with its parameters and the key it is counted under (as
//! stored: a digest, never the key secret), and, when a policy is at hand, what each limit has
//! left (a peek that consumes nothing). The same steps as a request's admission
//! ([`Exchange::admit`]), stopped before the decision: nothing is counted or consumed.

use std::net::IpAddr;

use serde::Serialize;

use super::answer::Answer;
use super::{Exchange, Head, Seam};
use crate::caller::address_lists::Standing;
use crate::caller::consumers::{AuthFailure, AuthMode, Consumer};
use crate::limiter::fields::whole_seconds;
use crate::limiter::{LimiterError, Policy};
use crate::route::describe::{self, LimitShown};
use crate::route::table::Route;
use crate::upstream::servers::Servers;

impl<S: Servers> Exchange<S> {
    /// Takes `head` through a request's admission up to its limits' decision: route, client,
    /// standing, caller (`presumed` stands for it instead of its credentials), tier and keys.
    /// What the gateway would answer before asking the limits is kept (see
    /// [`Exchange::explanation`]).
    pub fn explain(&mut self, head: &Head<'_>, presumed: Option<Consumer>) {
        if let Err(answer) = self.explained(head, presumed) {
            self.answer = Some(answer);
        }
    }

    fn explained(&mut self, head: &Head<'_>, presumed: Option<Consumer>) -> Result<(), Answer> {
        let routed = self.route_request(head)?;
        let consumer = match presumed {
            Some(consumer) => presume(self.routed()?, consumer)?,
            None => self.caller(self.routed()?, head)?,
        };
        self.ask_limits(head, &routed, consumer, true)
    }

    /// Reads what each limit the request would ask has left, consuming nothing.
    pub async fn peek<E: Seam>(&mut self, policy: &Policy<E>) -> Result<(), LimiterError> {
        match &self.route {
            Some(runtime) => self.limits.peek(&runtime.route, policy).await,
            None => Ok(()),
        }
    }

    /// What [`Exchange::explain`] found (and [`Exchange::peek`] read).
    /// `(method, host, path)` are the request's as described (the path before normalizing).
    pub fn explanation(&self, (method, host, path): (&str, &str, &str)) -> Explanation {
        let route = self.route();
        let standing = match (route, self.answer, self.exempt) {
            // Refused before the address lists were read.
            (None, ..) | (_, Some(Answer::BodyTooLarge), _) => None,
            (Some(_), Some(Answer::Forbidden), _) => Some(Standing::Denied),
            (Some(_), _, true) => Some(Standing::Exempt),
            (Some(_), _, false) => Some(Standing::Limited),
        };
        let plans = self.site.config.consumers.plans();
        let consumer = self.consumer.as_ref().map(|consumer| ConsumerShown {
            id: consumer.id.to_string(),
            plan: consumer.plan.map(|plan| plans.name(plan).to_string()),
            via: consumer.via.label(),
        });
        Explanation {
            answer: self.answer.map(AnswerShown::of),
            consumer,
            limits: route
                .map(|route| self.limits_shown(route))
                .unwrap_or_default(),
            peek_error: None,
            request: RequestShown {
                client_ip: self.client,
                host: host.to_string(),
                method: method.to_string(),
                path: self.normalized_path.as_deref().unwrap_or(path).to_string(),
            },
            route: route.map(RouteShown::of),
            servers: self.servers_shown(),
            standing,
            tier: route.map(|route| self.tier_shown(route)),
        }
    }

    /// The route's upstream servers, each with its health now (`state: null` when not known:
    /// `sluice explain` offline has no live state).
    fn servers_shown(&self) -> Vec<ServerShown> {
        let Some(runtime) = &self.route else {
            return Vec::new();
        };
        let states = runtime.servers.states().into_iter();
        states
            .map(|(server, state)| ServerShown {
                server: server.to_string(),
                state,
            })
            .collect()
    }

    /// The tier the request meets: the route's default, a plan's or the consumer's own, and
    /// whether a quota override changes it.
    fn tier_shown(&self, route: &Route) -> TierShown {
        let (id, overridden) = self.limits.met();
        let consumer = self.consumer.as_ref();
        let name = match consumer {
            _ if id.0 == 0 => "default".to_string(),
            Some(consumer) if route.tiers.has_own(&consumer.id) => {
                format!("consumer {}", consumer.id)
            }
            Some(consumer) => match consumer.plan {
                Some(plan) => format!("plan {}", self.site.config.consumers.plans().name(plan)),
                None => "no plan".to_string(),
            },
            None => "default".to_string(),
        };
        TierShown { name, overridden }
    }

    /// Every limit of the tier met: as configured, its key and cost for this request, and
    /// what it has left when read.
    fn limits_shown(&self, route: &Route) -> Vec<LimitShown> {
        let shown = self.limits.shown(route).map(|(limit, record)| {
            let status = record.and_then(|record| record.status.as_ref());
            LimitShown {
                stored_key: record.map(|r| String::from_utf8_lossy(&r.ask.key).into_owned()),
                request_cost: record.map(|r| r.ask.cost),
                remaining: status.map(|s| s.remaining),
                reset_seconds: status.map(|s| whole_seconds(s.reset_after_ms)),
                ..describe::limit(&limit.limit.exact, &limit.key)
            }
        });
        shown.collect()
    }
}

/// What the gateway would do with a request ([`Exchange::explanation`]): what the explain
/// endpoint and `sluice explain` answer as JSON, and the dashboard's explain form shows. The
/// fields of each of its types are in alphabetical order, the order its JSON has always had.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// What the gateway would answer before asking the limits (`None`: its limits decide).
    pub answer: Option<AnswerShown>,
    /// The verified caller, or the one presumed.
    pub consumer: Option<ConsumerShown>,
    /// Every limit of the tier met (none without a route).
    pub limits: Vec<LimitShown>,
    /// Why what the limits have left could not be read (absent when it was, or not asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peek_error: Option<String>,
    pub request: RequestShown,
    /// The route matched (`None`: none).
    pub route: Option<RouteShown>,
    /// The route's upstream servers and their health now (none without a route).
    pub servers: Vec<ServerShown>,
    /// The client's standing in the address lists (`None`: refused before they were read).
    pub standing: Option<Standing>,
    /// The tier met (`None` without a route).
    pub tier: Option<TierShown>,
}

/// An upstream server of the route and its health now: `not-checked`, `healthy`,
/// `unhealthy` (active checks) or `ejected` (passive health); `None` when not known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerShown {
    pub server: String,
    pub state: Option<&'static str>,
}

/// The request as explained: its client address (after the trusted proxies' headers), and
/// its path normalized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestShown {
    pub client_ip: Option<IpAddr>,
    pub host: String,
    pub method: String,
    pub path: String,
}

/// The caller: its id, its plan's name (`None`: no plan), and how it was verified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerShown {
    pub id: String,
    pub plan: Option<String>,
    pub via: &'static str,
}

/// The tier met, in words (`default`, `plan pro`, `consumer acme`, `no plan`), and whether
/// a quota override changes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TierShown {
    pub name: String,
    pub overridden: bool,
}

/// What the gateway would answer before asking the limits: its status and detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AnswerShown {
    pub detail: &'static str,
    pub status: u16,
}

impl AnswerShown {
    fn of(answer: Answer) -> AnswerShown {
        AnswerShown {
            detail: answer.detail(),
            status: answer.status(),
        }
    }
}

/// A route: how it verifies callers, what it matches, its name, its upstream servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteShown {
    /// `auth:` as written.
    pub auth: &'static str,
    /// What it matches, as one line ([`describe::route_match`]).
    #[serde(rename = "match")]
    pub matches: String,
    pub name: String,
    pub upstream: Vec<String>,
}

impl RouteShown {
    /// `route`, shown.
    pub fn of(route: &Route) -> RouteShown {
        RouteShown {
            auth: route.auth.mode.label(),
            matches: describe::route_match(&route.matcher),
            name: route.name.to_string(),
            upstream: route
                .upstream
                .servers
                .iter()
                .map(ToString::to_string)
                .collect(),
        }
    }
}

/// `consumer`, as the caller of a request on `route`: none on a route that verifies no
/// caller; refused when its plan may not use the route.
fn presume(route: &Route, consumer: Consumer) -> Result<Option<Consumer>, Answer> {
    match route.auth.mode {
        AuthMode::Off => Ok(None),
        _ if route.auth.admits(&consumer) => Ok(Some(consumer)),
        _ => Err(Answer::AuthFailed(AuthFailure::PlanNotAllowed)),
    }
}
