//! `limits:` at the top of the file → common limits: each defined once, with its plans and
//! consumers, and counted in one bucket for every route that uses it (`- use: NAME` among a
//! route's `limits:`): a customer's monthly quota over the whole API. Its key cannot name the
//! route and it is not split (one bucket, whichever route a request takes); what a route that
//! uses one must be is checked with the route (`routes.rs`).

use super::problem::Problems;
use super::raw::RawLimit;
use super::tiers::{compile_variants, LimitVariants};
use super::wording::nearest;
use crate::caller::consumers::Plans;
use crate::limiter::regions::Regions;

/// The common limits of a configuration, in file order.
#[derive(Default)]
pub struct CommonLimits {
    /// Each by name: compiled, or `None` when it did not (its problems reported).
    limits: Vec<(String, Option<LimitVariants>)>,
}

/// What a route's `use:` finds.
pub enum Found<'a> {
    /// The common limit, compiled.
    Limit(&'a LimitVariants),
    /// A common limit of that name that did not compile (its problems are told at its path).
    Broken,
    /// No common limit of that name: the words saying so.
    Unknown(String),
}

impl std::fmt::Debug for CommonLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.limits.iter().map(|(name, _)| name))
            .finish()
    }
}

impl CommonLimits {
    /// The common limit named `name`.
    pub fn find(&self, name: &str) -> Found<'_> {
        match self.limits.iter().find(|(known, _)| known == name) {
            Some((_, Some(limit))) => Found::Limit(limit),
            Some((_, None)) => Found::Broken,
            None => Found::Unknown(self.unknown(name)),
        }
    }

    fn unknown(&self, name: &str) -> String {
        let mut names: Vec<&str> = Vec::new();
        for (known, _) in &self.limits {
            if !known.is_empty() && !names.contains(&known.as_str()) {
                names.push(known);
            }
        }
        let suggestion = nearest(name, names.iter().copied())
            .map(|near| format!(": did you mean `{near}`?"))
            .unwrap_or_default();
        match names.is_empty() {
            true => format!(
                "no common limit named {name:?}: define it under limits: at the top of the file"
            ),
            false => format!(
                "no common limit named {name:?}{suggestion} (limits: {})",
                names.join(", ")
            ),
        }
    }
}

/// `limits:` at the top, every problem reported with its path.
pub fn compile(
    raw: Vec<RawLimit>,
    plans: &Plans,
    regions: Option<&Regions>,
    p: &mut Problems,
) -> CommonLimits {
    let mut limits: Vec<(String, Option<LimitVariants>)> = Vec::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let at = format!("limits[{i}]");
        if raw.uses.is_some() {
            p.add(
                format!("{at}.use"),
                "use: names a common limit from a route's limits; here, define it",
            );
            continue;
        }
        let keyed_on_route = raw.key.iter().flatten().any(|part| part == "route");
        if keyed_on_route {
            p.add(
                format!("{at}.key"),
                "a common limit counts one bucket for every route that uses it: its key cannot name the route",
            );
        }
        if raw.split.is_some() {
            p.add(
                format!("{at}.split"),
                "a common limit is one bucket whichever route a request takes: it cannot be split",
            );
        }
        let name = raw.name.clone().unwrap_or_default();
        if !name.is_empty() && limits.iter().any(|(known, _)| *known == name) {
            p.add(
                format!("{at}.name"),
                format!("duplicate common limit name {name:?}"),
            );
        }
        let compiled = compile_variants(&at, raw, plans, regions, p).map(LimitVariants::common);
        limits.push((name, compiled));
    }
    CommonLimits { limits }
}
