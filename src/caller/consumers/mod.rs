//! Who is calling: the consumer a verified credential names, the plan it is on, and what a
//! route asks of callers (`auth: required | optional | off`).
//!
//! A consumer is one customer across all of their credentials (two API keys of one consumer
//! share its buckets). Identity comes only from a verified credential — an API key found in the
//! hashed key file, a JWT whose signature and claims check out, a client certificate the TLS
//! listener verified — never from an unverified header. Plans are names declared once
//! (`identity.plans`); a route's limits may differ per plan and per consumer, chosen at config
//! load (`crate::route::tiers`), so a request only picks its precompiled set.

mod challenge;
mod token;
mod verify;

use std::sync::Arc;

use smallvec::SmallVec;
use strum::{EnumCount, IntoStaticStr, VariantArray};

pub use verify::{CertificateCheck, CertificateField, Credentials, KeyCheck, Verifiers};

/// Longest consumer id accepted from any credential (ids are hashed into keys and written to the
/// access log; they are never labels).
pub const MAX_CONSUMER_ID: usize = 256;
/// Longest claim value a `claim:NAME` key part takes; a longer one counts as missing.
pub const MAX_CLAIM_VALUE: usize = 1024;

/// The `plan` label of callers without a plan (anonymous, or verified without one); no plan
/// may be named so.
pub const NO_PLAN: &str = "none";

/// A plan: its position in `identity.plans`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanId(pub u8);

/// A caller's row in a table kept per plan (a route's tiers by plan, its per-plan metric
/// handles): row 0 for callers without a plan, then one row per plan, in `identity.plans`
/// order (plan `n` at row `n + 1`). The one place that encoding is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanSlot(usize);

impl PlanSlot {
    /// The row of callers without a plan.
    pub const NO_PLAN: PlanSlot = PlanSlot(0);

    /// The row of callers on `plan` (`None`: without a plan).
    pub fn of(plan: Option<PlanId>) -> PlanSlot {
        PlanSlot(plan.map_or(0, |plan| usize::from(plan.0) + 1))
    }

    /// Every row of a table kept for `plans` plans, in order (the no-plan row first).
    pub fn all(plans: usize) -> impl Iterator<Item = PlanSlot> {
        (0..=plans).map(PlanSlot)
    }

    /// The plan of this row; `None` for the no-plan row.
    pub fn plan(self) -> Option<PlanId> {
        let plan = self.0.checked_sub(1)?;
        u8::try_from(plan).ok().map(PlanId)
    }

    /// Its index in the table.
    pub fn index(self) -> usize {
        self.0
    }
}

/// The plans a configuration declares, and the one a consumer without a plan is on.
#[derive(Debug, Clone, Default)]
pub struct Plans {
    names: Box<[Arc<str>]>,
    /// Each name as a header value (`X-Consumer-Plan`), made once.
    values: Box<[http::HeaderValue]>,
    default: Option<PlanId>,
}

impl Plans {
    /// At most 255 names (checked by the config compiler), distinct.
    pub fn new(names: Vec<Arc<str>>, default: Option<PlanId>) -> Plans {
        Plans {
            // Names are checked to be a safe ASCII subset.
            values: names
                .iter()
                .filter_map(|name| http::HeaderValue::from_str(name).ok())
                .collect(),
            names: names.into(),
            default,
        }
    }

    pub fn find(&self, name: &str) -> Option<PlanId> {
        self.names
            .iter()
            .position(|n| &**n == name)
            .map(|i| PlanId(i as u8))
    }

    pub fn name(&self, plan: PlanId) -> &str {
        self.names.get(usize::from(plan.0)).map_or("", |n| n)
    }

    /// Every plan's name as a header value, by plan id.
    pub fn header_values(&self) -> &[http::HeaderValue] {
        &self.values
    }

    /// The `plan` label of each [`PlanSlot`], in order: [`NO_PLAN`], then each plan's name.
    pub fn slot_labels(&self) -> impl Iterator<Item = &str> {
        std::iter::once(NO_PLAN).chain(self.names.iter().map(|name| &**name))
    }

    pub fn names(&self) -> &[Arc<str>] {
        &self.names
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The plan of a consumer whose credential names `named` (if it names a known one), else the
    /// default plan.
    pub fn of(&self, named: Option<&str>) -> Option<PlanId> {
        named.and_then(|name| self.find(name)).or(self.default)
    }
}

/// What the configuration knows of a consumer named by an operator (the admin APIs): see
/// `Config::knows_consumer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// Listed: an API key, an `identity.mtls.plans` entry or a limit's `consumers:` entry names
    /// it.
    Listed,
    /// Not listed, but a verifier that cannot list its consumers (JWT claims, client
    /// certificates) may name it.
    Possible,
}

/// Which credential identified a consumer (the access log's and the metrics' `via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Via {
    ApiKey,
    Jwt,
    ClientCertificate,
}

impl Via {
    pub fn label(self) -> &'static str {
        self.into()
    }
}

/// A verified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    /// The consumer's id: one customer across all of their credentials.
    pub id: Arc<str>,
    pub plan: Option<PlanId>,
    /// The values of the claims `claim:NAME` key parts name, in `Verifiers::claim_names` order
    /// (only a JWT carries claims).
    pub claims: SmallVec<[Option<Box<str>>; 2]>,
    pub via: Via,
}

/// A consumer of API keys on plan `plan` (an index into the plans), without claims: the callers
/// of unit tests.
#[cfg(test)]
pub(crate) fn test_consumer(id: &str, plan: Option<u8>) -> Consumer {
    Consumer {
        id: id.into(),
        plan: plan.map(PlanId),
        claims: SmallVec::new(),
        via: Via::ApiKey,
    }
}

/// What a route asks of callers: read from `auth:` and shown (`label`) in the same words.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    strum::EnumString,
    strum::VariantNames,
    strum::IntoStaticStr,
)]
#[strum(serialize_all = "snake_case")]
pub enum AuthMode {
    /// Credentials are not looked at (the default).
    #[default]
    Off,
    /// A caller without a credential is anonymous (keyed by its address); a credential that is
    /// presented must verify.
    Optional,
    /// Every request carries a credential that verifies.
    Required,
}

impl AuthMode {
    /// `auth:` as written (`off`, `optional`, `required`): how the explain answer and the
    /// dashboard show it.
    pub fn label(self) -> &'static str {
        self.into()
    }
}

/// A route's `auth:`: the mode, and the plans allowed on it (`None`: any).
#[derive(Debug, Clone, Default)]
pub struct RouteAuth {
    pub mode: AuthMode,
    /// Bit i: plan i may use the route.
    pub plans: Option<u64>,
}

impl RouteAuth {
    /// Whether `consumer`'s plan may use the route.
    pub fn admits(&self, consumer: &Consumer) -> bool {
        match (self.plans, consumer.plan) {
            (None, _) => true,
            (Some(mask), Some(plan)) => mask & (1 << plan.0) != 0,
            (Some(_), None) => false,
        }
    }
}

/// Why a caller was refused before any limit: the `reason` of `sluice_auth_failures_total`, and
/// the answer's status (`401` with `WWW-Authenticate`, `403`, or `503` while a JWT verifier has
/// no keys yet). The labels are these names in snake case: a closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr, VariantArray, EnumCount)]
#[strum(serialize_all = "snake_case")]
pub enum AuthFailure {
    /// No credential, on a route that requires one.
    Missing,
    /// A credential header sent twice, too long, or not in its form (an API key header, or an
    /// `Authorization: Bearer` header without a token or with bytes no token holds).
    Malformed,
    /// An API key that is not in the key file.
    UnknownKey,
    /// An API key marked `disabled` in the key file.
    RevokedKey,
    /// A bearer token that is not a JWT, or has a claim of the wrong JSON type.
    MalformedToken,
    /// A token signed with a key the gateway does not have.
    UnknownSigningKey,
    /// A token whose algorithm is not allowed (`none` never is).
    AlgorithmNotAllowed,
    /// A token whose algorithm does not fit its key's kind (algorithm confusion).
    KeyMismatch,
    BadSignature,
    /// A token without `exp`.
    NoExpiry,
    Expired,
    NotYetValid,
    WrongIssuer,
    WrongAudience,
    /// A token without the claim that names its consumer (or with one over
    /// [`MAX_CONSUMER_ID`] bytes).
    NoConsumer,
    /// A verified token whose plan claim names a plan not in `identity.plans`.
    UnknownPlan,
    /// No JWT verification key is loaded yet (the JWKS URL has not answered since start): the
    /// gateway cannot verify any token, so it answers `503`, not `401`.
    NoKeys,
    /// A client certificate that names no consumer (no field the config takes it from).
    CertificateWithoutConsumer,
    /// The consumer's plan may not use this route.
    PlanNotAllowed,
}

impl AuthFailure {
    pub const ALL: &'static [AuthFailure] = AuthFailure::VARIANTS;

    pub fn label(self) -> &'static str {
        self.into()
    }

    /// `403` for a verified caller that may not pass; `401` for a credential missing or wrong.
    pub fn forbids(self) -> bool {
        matches!(
            self,
            AuthFailure::RevokedKey
                | AuthFailure::UnknownPlan
                | AuthFailure::CertificateWithoutConsumer
                | AuthFailure::PlanNotAllowed
        )
    }

    /// `503`: the gateway cannot verify the credential now (no JWT keys yet).
    pub fn unavailable(self) -> bool {
        self == AuthFailure::NoKeys
    }

    /// Whether the answer is a `401`, which carries `WWW-Authenticate`.
    pub fn challenges(self) -> bool {
        !self.forbids() && !self.unavailable()
    }

    /// The kind of credential the failure is about; `None` for what is no one credential's
    /// (a missing credential, a malformed header, a plan the route does not allow).
    pub fn via(self) -> Option<Via> {
        match self {
            AuthFailure::Missing | AuthFailure::Malformed | AuthFailure::PlanNotAllowed => None,
            AuthFailure::UnknownKey | AuthFailure::RevokedKey => Some(Via::ApiKey),
            AuthFailure::CertificateWithoutConsumer => Some(Via::ClientCertificate),
            AuthFailure::MalformedToken
            | AuthFailure::UnknownSigningKey
            | AuthFailure::AlgorithmNotAllowed
            | AuthFailure::KeyMismatch
            | AuthFailure::BadSignature
            | AuthFailure::NoExpiry
            | AuthFailure::Expired
            | AuthFailure::NotYetValid
            | AuthFailure::WrongIssuer
            | AuthFailure::WrongAudience
            | AuthFailure::NoConsumer
            | AuthFailure::UnknownPlan
            | AuthFailure::NoKeys => Some(Via::Jwt),
        }
    }

    /// The problem's detail: fixed text, never a client's bytes (and free of `"` and `\`, so
    /// it can be a challenge's `error_description`).
    pub fn detail(self) -> &'static str {
        match self {
            AuthFailure::Missing => "This route requires a credential.",
            AuthFailure::Malformed => "The credential is not in its form (or sent twice).",
            AuthFailure::UnknownKey => "The API key is not valid.",
            AuthFailure::RevokedKey => "The API key has been revoked.",
            AuthFailure::MalformedToken => "The bearer token is not a well-formed JWT.",
            AuthFailure::UnknownSigningKey => "The token is signed with an unknown key.",
            AuthFailure::AlgorithmNotAllowed => "The token's algorithm is not accepted.",
            AuthFailure::KeyMismatch => "The token's algorithm does not fit its key.",
            AuthFailure::BadSignature => "The token's signature is not valid.",
            AuthFailure::NoExpiry => "The token has no expiry time.",
            AuthFailure::Expired => "The token has expired.",
            AuthFailure::NotYetValid => "The token is not valid yet.",
            AuthFailure::WrongIssuer => "The token is from an issuer this gateway does not trust.",
            AuthFailure::WrongAudience => "The token is not meant for this gateway.",
            AuthFailure::NoConsumer => "The token does not name its consumer.",
            AuthFailure::UnknownPlan => "The token names a plan this gateway does not know.",
            AuthFailure::NoKeys => "The gateway has no keys to verify tokens with yet.",
            AuthFailure::CertificateWithoutConsumer => {
                "The client certificate does not name a consumer."
            }
            AuthFailure::PlanNotAllowed => "The caller's plan may not use this route.",
        }
    }

    /// The RFC 6750 `error` of a bearer challenge: `invalid_request` for a malformed
    /// credential header, `invalid_token` for a token that does not verify; none when the
    /// credential is missing or the failure is another credential's (an unknown API key says
    /// nothing about tokens).
    pub fn bearer_error(self) -> Option<&'static str> {
        match (self, self.via()) {
            (AuthFailure::Malformed, _) => Some("invalid_request"),
            (_, Some(Via::Jwt)) if self.challenges() => Some("invalid_token"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_plan_slot_is_its_plan_after_the_no_plan_row() {
        assert_eq!(PlanSlot::of(None), PlanSlot::NO_PLAN);
        assert_eq!(PlanSlot::of(None).plan(), None);
        assert_eq!(PlanSlot::of(Some(PlanId(0))).index(), 1);
        assert_eq!(PlanSlot::of(Some(PlanId(4))).plan(), Some(PlanId(4)));
        let all: Vec<_> = PlanSlot::all(2).map(PlanSlot::plan).collect();
        assert_eq!(all, [None, Some(PlanId(0)), Some(PlanId(1))]);
        let plans = Plans::new(vec!["free".into(), "pro".into()], None);
        let labels: Vec<_> = plans.slot_labels().collect();
        assert_eq!(labels, [NO_PLAN, "free", "pro"]);
    }
    use super::*;

    #[test]
    fn an_auth_mode_is_shown_as_written() {
        for written in ["off", "optional", "required"] {
            let mode: AuthMode = written.parse().unwrap();
            assert_eq!(mode.label(), written);
        }
    }

    fn plans() -> Plans {
        Plans::new(vec!["free".into(), "pro".into()], Some(PlanId(0)))
    }

    #[test]
    fn a_named_plan_is_found_and_an_unknown_one_falls_to_the_default() {
        let plans = plans();
        assert_eq!(plans.of(Some("pro")), Some(PlanId(1)));
        assert_eq!(plans.of(Some("gold")), Some(PlanId(0)));
        assert_eq!(plans.of(None), Some(PlanId(0)));
        assert_eq!(plans.name(PlanId(1)), "pro");
        let without_default = Plans::new(vec!["free".into()], None);
        assert_eq!(without_default.of(Some("gold")), None);
    }

    #[test]
    fn a_route_admits_only_its_plans() {
        let consumer = |plan| Consumer {
            id: "acme".into(),
            plan,
            claims: SmallVec::new(),
            via: Via::ApiKey,
        };
        let any = RouteAuth::default();
        let pro_only = RouteAuth {
            mode: AuthMode::Required,
            plans: Some(1 << 1),
        };
        assert!(any.admits(&consumer(None)));
        assert!(pro_only.admits(&consumer(Some(PlanId(1)))));
        assert!(!pro_only.admits(&consumer(Some(PlanId(0)))));
        assert!(!pro_only.admits(&consumer(None)));
    }

    #[test]
    fn verified_callers_that_may_not_pass_are_forbidden_the_rest_unauthenticated() {
        let forbidden: Vec<_> = AuthFailure::ALL
            .iter()
            .filter(|f| f.forbids())
            .map(|f| f.label())
            .collect();
        assert_eq!(
            forbidden,
            [
                "revoked_key",
                "unknown_plan",
                "certificate_without_consumer",
                "plan_not_allowed"
            ]
        );
        assert_eq!(AuthFailure::Missing.bearer_error(), None);
        assert_eq!(AuthFailure::Expired.bearer_error(), Some("invalid_token"));
        assert_eq!(AuthFailure::UnknownKey.bearer_error(), None);
        assert_eq!(
            AuthFailure::Malformed.bearer_error(),
            Some("invalid_request")
        );
        assert_eq!(AuthFailure::NoKeys.bearer_error(), None);
        assert!(AuthFailure::NoKeys.unavailable() && !AuthFailure::NoKeys.challenges());
    }

    #[test]
    fn a_detail_can_be_an_error_description() {
        // RFC 6750 section 3: error_description is %x20-21 / %x23-5B / %x5D-7E.
        for failure in AuthFailure::ALL {
            let detail = failure.detail();
            assert!(
                detail
                    .bytes()
                    .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\'),
                "{detail}"
            );
        }
    }
}
