//! `identity:` (the plans there are and the verifiers of credentials: `api_keys`, `jwt`,
//! `mtls`) and each route's `auth:`.

use std::collections::HashMap;
use std::sync::Arc;

use super::api_keys::compile_api_keys;
use super::choice::chosen;
use super::jwt::compile_jwt;
use super::problem::{check_name, Problems};
use super::raw::{RawAuth, RawAuthTable, RawIdentity, RawJwt, RawMtls};
use super::sources::Sources;
use crate::caller::consumers::{
    AuthMode, CertificateCheck, CertificateField, KeyCheck, PlanId, Plans, RouteAuth, Verifiers,
    NO_PLAN,
};
use crate::caller::jwt::JwtSettings;

/// Plans fit the bit mask of a route's allowed plans.
const MAX_PLANS: usize = 64;

/// `identity:`: the plans, the default plan, the verifiers; with none, no route may ask for
/// credentials. Tokens keep the claims the keys of `routes` and the common `limits` name.
pub fn compile(
    raw: Option<RawIdentity>,
    (routes, limits): (&[super::raw::RawRoute], &[super::raw::RawLimit]),
    p: &mut Problems,
    read: &mut Sources,
) -> Verifiers {
    let claim_names = claim_names(routes, limits);
    let mut raw = raw.unwrap_or_default();
    let written = raw.api_keys.is_some() || raw.jwt.is_some() || raw.mtls.is_some();
    let plans = compile_plans(&raw, p);
    let known = |name: &str| {
        plans
            .find(name)
            .map(|_| ())
            .ok_or_else(|| format!("unknown plan {name:?}: {}", known_plans(&plans)))
    };
    let api_keys = raw
        .api_keys
        .take()
        .and_then(|keys| compile_api_keys(keys, "identity.api_keys", known, p, read));
    let api_keys = api_keys.map(|settings| KeyCheck {
        header: settings.header,
        keys: settings.keys,
    });
    let certificates = raw
        .mtls
        .take()
        .and_then(|mtls| compile_mtls(mtls, &plans, p));
    let jwt = raw
        .jwt
        .take()
        .and_then(|jwt| compile_jwt_settings(jwt, api_keys.as_ref(), p, read));
    Verifiers::new(plans, claim_names)
        .with_api_keys(api_keys)
        .with_certificates(certificates)
        .with_jwt(jwt)
        .written(written)
}

/// `identity.jwt`: how bearer tokens are verified (a JWKS file's keys are read now; a JWKS
/// URL's are fetched by the running site's verifier). API keys, if any, must come in another
/// header than `Authorization`.
fn compile_jwt_settings(
    raw: RawJwt,
    api_keys: Option<&KeyCheck>,
    p: &mut Problems,
    read: &mut Sources,
) -> Option<JwtSettings> {
    if api_keys.is_some_and(|keys| keys.header == http::header::AUTHORIZATION) {
        p.add(
            "identity.api_keys.header",
            "authorization carries the bearer tokens of identity.jwt: present API keys in another header",
        );
    }
    compile_jwt(raw, "identity.jwt", p, read)
}

/// `identity.mtls`: the certificate field (default `subject_cn`) and consumers' plans.
fn compile_mtls(raw: RawMtls, plans: &Plans, p: &mut Problems) -> Option<CertificateCheck> {
    let field = chosen(
        raw.consumer.as_ref(),
        CertificateField::SubjectCn,
        "identity.mtls.consumer",
        p,
    )?;
    let mut by_consumer = HashMap::new();
    for (consumer, plan) in raw.plans {
        match plans.find(&plan) {
            Some(id) => {
                by_consumer.insert(Arc::from(consumer), id);
            }
            None => p.add(
                format!("identity.mtls.plans.{consumer}"),
                format!("unknown plan {plan:?}: {}", known_plans(plans)),
            ),
        }
    }
    Some(CertificateCheck {
        field,
        plans: by_consumer,
    })
}

/// The claims `claim:NAME` key parts of `routes` name, each once: what verified tokens keep.
fn claim_names(routes: &[super::raw::RawRoute], common: &[super::raw::RawLimit]) -> Vec<Arc<str>> {
    let mut names: Vec<Arc<str>> = Vec::new();
    let texts = routes
        .iter()
        .flat_map(|route| &route.limits)
        .chain(common)
        .flat_map(|limit| limit.key.iter().flatten());
    for name in texts.filter_map(|text| text.strip_prefix("claim:")) {
        if !names.iter().any(|n| **n == *name) {
            names.push(name.into());
        }
    }
    names
}

/// `identity.plans` (distinct names, at most [`MAX_PLANS`]) and `identity.default_plan`.
fn compile_plans(raw: &RawIdentity, p: &mut Problems) -> Plans {
    if let Some(i) = raw.plans.iter().position(|name| name == NO_PLAN) {
        p.add(
            format!("identity.plans[{i}]"),
            format!("{NO_PLAN:?} is the metrics' name of callers without a plan: choose another"),
        );
    }
    if raw.plans.len() > MAX_PLANS {
        p.add("identity.plans", format!("at most {MAX_PLANS} plans"));
    }
    let mut names: Vec<Arc<str>> = Vec::new();
    for (i, name) in raw.plans.iter().take(MAX_PLANS).enumerate() {
        let at = format!("identity.plans[{i}]");
        if !check_name(name, &at, p) {
            continue;
        }
        if names.iter().any(|n| **n == **name) {
            p.add(at, format!("duplicate plan {name:?}"));
            continue;
        }
        names.push(name.as_str().into());
    }
    let plans = Plans::new(names, None);
    let default = raw.default_plan.as_deref().and_then(|name| {
        let found = plans.find(name);
        if found.is_none() {
            p.add(
                "identity.default_plan",
                format!("unknown plan {name:?}: {}", known_plans(&plans)),
            );
        }
        found
    });
    Plans::new(plans.names().to_vec(), default)
}

/// What a problem with a plan name tells the operator: the plans there are.
pub fn known_plans(plans: &Plans) -> String {
    if plans.is_empty() {
        "no plans are declared (identity.plans)".to_string()
    } else {
        let names: Vec<&str> = plans.names().iter().map(|n| &**n).collect();
        format!("the plans are {}", names.join(", "))
    }
}

/// A route's `auth:` at `at` (default `off`); asking for credentials needs a verifier.
pub fn compile_auth(
    raw: Option<RawAuth>,
    verifiers: &Verifiers,
    at: &str,
    p: &mut Problems,
) -> RouteAuth {
    let (mode, plan_names, mode_at) = match raw {
        None => return RouteAuth::default(),
        Some(RawAuth::Mode(mode)) => (Some(mode), None, at.to_string()),
        Some(RawAuth::Table(RawAuthTable { mode, plans })) => (mode, plans, format!("{at}.mode")),
    };
    let mode = match mode {
        Some(mode) => mode.known(&mode_at, p).unwrap_or_default(),
        None => AuthMode::Required,
    };
    if mode != AuthMode::Off && !verifiers.any_written() {
        p.add(
            &mode_at,
            "needs a verifier of credentials: identity.api_keys, identity.jwt or identity.mtls",
        );
    }
    let plans = plan_names.map(|names| {
        let mut mask = 0u64;
        for (i, name) in names.iter().enumerate() {
            match verifiers.plans().find(name) {
                Some(PlanId(bit)) => mask |= 1 << bit,
                None => p.add(
                    format!("{at}.plans[{i}]"),
                    format!("unknown plan {name:?}: {}", known_plans(verifiers.plans())),
                ),
            }
        }
        mask
    });
    if plans.is_some() && mode == AuthMode::Off {
        p.add(
            format!("{at}.plans"),
            "needs auth (mode required or optional): a caller's plan is known only once it is verified",
        );
    }
    RouteAuth { mode, plans }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::problem::problems_of;

    fn identity(yaml: &str) -> (Option<Verifiers>, Vec<String>) {
        problems_of(yaml, |raw: RawIdentity, p: &mut Problems| {
            Some(compile(Some(raw), (&[], &[]), p, &mut Sources::default()))
        })
    }

    #[test]
    fn plans_are_named_once_and_the_default_is_one_of_them() {
        let (verifiers, problems) = identity("plans: [free, pro]\ndefault_plan: free\n");
        assert!(problems.is_empty(), "{problems:?}");
        let plans = verifiers.unwrap();
        assert_eq!(plans.plans().of(None), Some(PlanId(0)));
        let (_, problems) = identity("plans: [free, free, \"a b\"]\ndefault_plan: gold\n");
        assert_eq!(
            problems,
            [
                "identity.plans[1]: duplicate plan \"free\"",
                "identity.plans[2]: invalid name \"a b\": use 1 to 64 of A-Z a-z 0-9 _ . -",
                "identity.default_plan: unknown plan \"gold\": the plans are free",
            ]
        );
    }

    #[test]
    fn a_route_asking_for_credentials_needs_a_verifier_and_known_plans() {
        let verifiers = Verifiers::new(Plans::new(vec!["free".into()], None), Vec::new());
        let auth = |yaml: &str| {
            problems_of(yaml, |raw: RawAuth, p: &mut Problems| {
                Some(compile_auth(Some(raw), &verifiers, "routes[0].auth", p))
            })
            .1
        };
        assert_eq!(
            auth("required"),
            ["routes[0].auth: needs a verifier of credentials: identity.api_keys, identity.jwt or identity.mtls"]
        );
        assert_eq!(
            auth("maybe"),
            ["routes[0].auth: unknown auth mode \"maybe\": use off, optional or required"]
        );
        assert_eq!(
            auth("{ mode: off, plans: [gold] }"),
            [
                "routes[0].auth.plans[0]: unknown plan \"gold\": the plans are free",
                "routes[0].auth.plans: needs auth (mode required or optional): a caller's plan is known only once it is verified",
            ]
        );
    }

    #[test]
    fn a_jwt_section_is_a_verifier_and_a_broken_one_is_reported_once() {
        let (verifiers, problems) = identity(
            "jwt: { hmac_secret: 0123456789abcdef0123456789abcdef, algorithms: [HS256] }\n",
        );
        assert!(problems.is_empty(), "{problems:?}");
        let verifiers = verifiers.unwrap();
        assert!(verifiers.jwt().is_some() && verifiers.verify_anything());
        let (verifiers, problems) = identity("jwt: { algorithms: [HS256] }\n");
        assert_eq!(
            problems,
            ["identity.jwt: give jwks_file, jwks_url or hmac_secret: where the keys come from"]
        );
        let verifiers = verifiers.unwrap();
        let auth = problems_of("required", |raw: RawAuth, p: &mut Problems| {
            Some(compile_auth(Some(raw), &verifiers, "routes[0].auth", p))
        });
        assert!(
            auth.1.is_empty(),
            "not reported again at the route: {:?}",
            auth.1
        );
    }
}
