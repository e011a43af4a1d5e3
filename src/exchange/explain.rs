//! What the gateway would do with a request, told without doing it: the route it matches (or
//! why none), the client's standing in the address lists, the verified caller and its plan,
//! the tier it meets, every limit with its parameters and the key it is counted under (as
//! stored: a digest, never the key secret), and, when a policy is at hand, what each limit has
//! left (a peek that consumes nothing). The same steps as a request's admission
//! ([`Exchange::admit`]), stopped before the decision: nothing is counted or consumed.

use serde_json::{json, Value};

use super::answer::Answer;
use super::{Exchange, Head, Seam};
use crate::caller::consumers::{AuthFailure, AuthMode, Consumer};
use crate::limiter::fields::whole_seconds;
use crate::limiter::{LimiterError, Policy};
use crate::route::describe;
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
            Some(consumer) => presume(&routed.route, consumer)?,
            None => self.caller(&routed.route, head)?,
        };
        self.ask_limits(head, &routed, consumer, true)
    }

    /// Reads what each limit the request would ask has left, consuming nothing.
    pub async fn peek<E: Seam>(&mut self, policy: &Policy<E>) -> Result<(), LimiterError> {
        match &self.route {
            Some(_) => self.limits.peek(policy).await,
            None => Ok(()),
        }
    }

    /// What [`Exchange::explain`] found (and [`Exchange::peek`] read), as JSON.
    /// `(method, host, path)` are the request's as described (the path before normalizing).
    pub fn explanation(&self, (method, host, path): (&str, &str, &str)) -> Value {
        let config = &self.site.config;
        let route = self.route();
        let standing = match (route, self.answer, self.exempt) {
            // Refused before the address lists were read.
            (None, ..) | (_, Some(Answer::BodyTooLarge), _) => Value::Null,
            (Some(_), Some(Answer::Forbidden), _) => json!("denied"),
            (Some(_), _, true) => json!("exempt"),
            (Some(_), _, false) => json!("limited"),
        };
        let plans = config.consumers.plans();
        let consumer = self.consumer.as_ref().map(|consumer| {
            json!({
                "id": &*consumer.id,
                "plan": consumer.plan.map(|plan| plans.name(plan)),
                "via": consumer.via.label(),
            })
        });
        json!({
            "request": {
                "method": method,
                "host": host,
                "path": self.normalized_path.as_deref().unwrap_or(path),
                "client_ip": self.client.map(|ip| ip.to_string()),
            },
            "route": route.map(route_shown),
            "answer": self.answer.map(answer_shown),
            "standing": standing,
            "consumer": consumer,
            "tier": route.map(|route| self.tier_shown(route)),
            "limits": route.map(|route| self.limits_shown(route)).unwrap_or_default(),
        })
    }

    /// The tier the request meets: the route's default, a plan's or the consumer's own, and
    /// whether a quota override changes it.
    fn tier_shown(&self, route: &Route) -> Value {
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
        json!({ "name": name, "overridden": overridden })
    }

    /// Every limit of the tier met: as configured, its key and cost for this request, and
    /// what it has left when read.
    fn limits_shown(&self, route: &Route) -> Vec<Value> {
        let shown = self.limits.shown(route).map(|(limit, record)| {
            let mut shown = describe::limit(&limit.limit.exact, &limit.key);
            let status = record.and_then(|record| record.status.as_ref());
            let asked = json!({
                "stored_key": record.map(|r| String::from_utf8_lossy(&r.ask.key).into_owned()),
                "request_cost": record.map(|r| r.ask.cost),
                "remaining": status.map(|s| s.remaining),
                "reset_seconds": status.map(|s| whole_seconds(s.reset_after_ms)),
            });
            if let (Value::Object(shown), Value::Object(asked)) = (&mut shown, asked) {
                shown.extend(asked);
            }
            shown
        });
        shown.collect()
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

/// A route: its name, what it matches, how it verifies callers, its upstream servers.
pub fn route_shown(route: &Route) -> Value {
    let servers: Vec<String> = route
        .upstream
        .servers
        .iter()
        .map(ToString::to_string)
        .collect();
    json!({
        "name": &*route.name,
        "match": describe::route_match(&route.matcher),
        "auth": route.auth.mode.label(),
        "upstream": servers,
    })
}

/// What the gateway would answer before asking the limits.
fn answer_shown(answer: Answer) -> Value {
    json!({ "status": answer.status(), "detail": answer.detail() })
}
