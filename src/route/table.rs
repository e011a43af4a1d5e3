//! The compiled route table: which route serves a request, by host, path prefix and method.
//!
//! Order (most specific first): an exact `path` before any prefix, then the longer
//! `path_prefix`, then an exact `host` before a wildcard `*.example.com` (longer suffix first)
//! before no host, then routes with `methods` before those without, then file order. The first
//! route whose every condition holds wins; it is found through an index (`index.rs`) that reads
//! only the routes the request's path and host could match.

use std::sync::Arc;

use http::Method;

use crate::caller::address_lists::AddressLists;
use crate::caller::consumers::{PlanId, RouteAuth};
use crate::limiter::adaptive::AdaptiveSettings;
use crate::route::index::{Entry, PathKind, RouteIndex};
use crate::route::tiers::Tiers;
use crate::route::upstream::UpstreamSettings;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// Lowercased, without port or trailing dot.
    Exact(String),
    /// `*.example.com` as `.example.com`: any subdomain, not the apex.
    Suffix(String),
}

#[derive(Debug, Clone)]
pub struct RouteMatch {
    pub path: PathMatch,
    /// `None` matches any host.
    pub host: Option<HostMatch>,
    /// `None` matches any method.
    pub methods: Option<Vec<Method>>,
}

impl RouteMatch {
    fn matches(&self, host: &str, path: &str, method: &Method) -> bool {
        let path_ok = match &self.path {
            PathMatch::Exact(exact) => path == exact,
            PathMatch::Prefix(prefix) => path.starts_with(prefix.as_str()),
        };
        let host_ok = match &self.host {
            None => true,
            Some(HostMatch::Exact(exact)) => host == exact,
            Some(HostMatch::Suffix(suffix)) => {
                host.len() > suffix.len() && host.ends_with(suffix.as_str())
            }
        };
        path_ok && host_ok && self.methods.as_ref().is_none_or(|m| m.contains(method))
    }

    /// Larger is more specific; routes are tried in descending order.
    fn specificity(&self) -> (bool, usize, u8, usize, bool) {
        let (exact, path_len) = match &self.path {
            PathMatch::Exact(p) => (true, p.len()),
            PathMatch::Prefix(p) => (false, p.len()),
        };
        let (host_rank, host_len) = match &self.host {
            Some(HostMatch::Exact(h)) => (2, h.len()),
            Some(HostMatch::Suffix(s)) => (1, s.len()),
            None => (0, 0),
        };
        (exact, path_len, host_rank, host_len, self.methods.is_some())
    }
}

/// One route, compiled: everything a request needs, built once at config load.
#[derive(Debug)]
pub struct Route {
    /// Position in the configuration file; indexes per-route metric handles and pools.
    pub index: usize,
    pub name: Arc<str>,
    pub matcher: RouteMatch,
    pub upstream: UpstreamSettings,
    /// Its limits per kind of caller (one tier when no plan or consumer differs).
    pub tiers: Tiers,
    /// What it asks of callers (`auth:`).
    pub auth: RouteAuth,
    /// Its own `addresses:` lists (the gateway's apply too).
    pub addresses: AddressLists,
    /// The largest request body accepted (`413` beyond); `None`: no limit.
    pub max_body_bytes: Option<u64>,
    /// How long a request may take from its arrival to the end of its response (`504`
    /// beyond); `None`: only the upstream's per-read timeouts apply.
    pub request_timeout: Option<std::time::Duration>,
    /// Its upstream's adaptive concurrency limit (`adaptive_concurrency:`), if it has one.
    pub adaptive: Option<AdaptiveRoute>,
}

/// A route's adaptive concurrency: the limiter's settings, and the priority level of each
/// kind of caller.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveRoute {
    pub settings: AdaptiveSettings,
    /// The level of a caller on each plan (by [`PlanId`]); a caller without a plan, or on a
    /// plan not listed in `priorities`, is on level 0, with the lowest plan listed.
    pub levels_by_plan: Box<[u8]>,
}

impl AdaptiveRoute {
    /// The priority level of a caller on `plan`.
    pub fn level(&self, plan: Option<PlanId>) -> u8 {
        plan.and_then(|plan| self.levels_by_plan.get(usize::from(plan.0)))
            .copied()
            .unwrap_or(0)
    }
}

#[derive(Debug, Default)]
pub struct RouteTable {
    /// Sorted most specific first.
    routes: Vec<Arc<Route>>,
    /// Where each request's candidates are, by position in `routes`.
    index: RouteIndex,
}

/// What stands for "every route that uses it" where a route is named (a common limit's
/// override, its series on the dashboard): no route's name has parentheses.
pub const COMMON: &str = "(common)";

impl RouteTable {
    pub fn new(mut routes: Vec<Route>) -> RouteTable {
        routes.sort_by_key(|r| std::cmp::Reverse(r.matcher.specificity()));
        let index = RouteIndex::new(routes.iter().enumerate().map(|(position, route)| Entry {
            position: position as u32,
            path: match &route.matcher.path {
                PathMatch::Exact(path) => PathKind::Exact(path),
                PathMatch::Prefix(prefix) => PathKind::Prefix(prefix),
            },
            exact_host: match &route.matcher.host {
                Some(HostMatch::Exact(host)) => Some(host),
                _ => None,
            },
        }));
        RouteTable {
            routes: routes.into_iter().map(Arc::new).collect(),
            index,
        }
    }

    /// `host` lowercased, without port: the first route in the table's order whose every
    /// condition holds, among the candidates the index names.
    pub fn find(&self, host: &str, path: &str, method: &Method) -> Option<&Arc<Route>> {
        let first = self
            .index
            .candidates(host, path)
            .filter(|&position| {
                self.routes
                    .get(position as usize)
                    .is_some_and(|route| route.matcher.matches(host, path, method))
            })
            .min()?;
        self.routes.get(first as usize)
    }

    /// The route named `name` (names are unique).
    pub fn named(&self, name: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|route| *route.name == *name)
    }

    /// The first route (in file order) that uses the common limit named `limit`: the one bucket
    /// of it is reached through any of them.
    pub fn using_common(&self, limit: &str) -> Option<&Arc<Route>> {
        self.in_file_order()
            .into_iter()
            .find(|route| route.tiers.uses_common(limit))
    }

    /// Whether a limit of some route has a `consumers:` entry for consumer `id`.
    pub fn names_consumer(&self, id: &str) -> bool {
        self.routes.iter().any(|route| route.tiers.has_own(id))
    }

    /// Routes in file order.
    pub fn in_file_order(&self) -> Vec<&Arc<Route>> {
        let mut routes: Vec<_> = self.routes.iter().collect();
        routes.sort_by_key(|r| r.index);
        routes
    }

    pub fn len(&self) -> usize {
        self.routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(
        index: usize,
        prefix: &str,
        host: Option<&str>,
        methods: Option<Vec<Method>>,
    ) -> Route {
        let path = match prefix.strip_prefix('=') {
            Some(exact) => PathMatch::Exact(exact.into()),
            None => PathMatch::Prefix(prefix.into()),
        };
        let host = host.map(|h| match h.strip_prefix('*') {
            Some(suffix) => HostMatch::Suffix(suffix.into()),
            None => HostMatch::Exact(h.into()),
        });
        Route {
            index,
            name: format!("r{index}").into(),
            matcher: RouteMatch {
                path,
                host,
                methods,
            },
            upstream: UpstreamSettings::round_robin(vec!["127.0.0.1:1".parse().unwrap()]),
            tiers: Tiers::unlimited(),
            auth: RouteAuth::default(),
            addresses: AddressLists::default(),
            max_body_bytes: None,
            request_timeout: None,
            adaptive: None,
        }
    }

    fn found(table: &RouteTable, host: &str, path: &str, method: Method) -> Option<usize> {
        table.find(host, path, &method).map(|r| r.index)
    }

    #[test]
    fn most_specific_route_wins() {
        let table = RouteTable::new(vec![
            route(0, "/", None, None),
            route(1, "/api/", None, None),
            route(2, "/api/", Some("api.example.com"), None),
            route(
                3,
                "/api/",
                Some("api.example.com"),
                Some(vec![Method::POST]),
            ),
            route(4, "/api/v2/", None, None),
        ]);
        assert_eq!(found(&table, "x", "/index.html", Method::GET), Some(0));
        assert_eq!(found(&table, "x", "/api/users", Method::GET), Some(1));
        assert_eq!(
            found(&table, "api.example.com", "/api/users", Method::GET),
            Some(2)
        );
        assert_eq!(
            found(&table, "api.example.com", "/api/users", Method::POST),
            Some(3)
        );
        assert_eq!(
            found(&table, "api.example.com", "/api/v2/x", Method::POST),
            Some(4)
        );
    }

    #[test]
    fn exact_paths_and_wildcard_hosts() {
        let table = RouteTable::new(vec![
            route(0, "/", None, None),
            route(1, "/", Some("*.example.com"), None),
            route(2, "/", Some("*.eu.example.com"), None),
            route(3, "=/health", None, None),
            route(4, "/", Some("www.example.com"), None),
        ]);
        assert_eq!(found(&table, "a.example.com", "/x", Method::GET), Some(1));
        assert_eq!(
            found(&table, "a.eu.example.com", "/x", Method::GET),
            Some(2)
        );
        assert_eq!(found(&table, "www.example.com", "/x", Method::GET), Some(4));
        assert_eq!(
            found(&table, "example.com", "/x", Method::GET),
            Some(0),
            "a wildcard is not the apex"
        );
        assert_eq!(
            found(&table, "www.example.com", "/health", Method::GET),
            Some(3)
        );
        assert_eq!(found(&table, "x", "/health/more", Method::GET), Some(0));
    }

    /// What `find` must answer: the first route in the table's order whose conditions hold.
    fn scanned(table: &RouteTable, host: &str, path: &str, method: &Method) -> Option<usize> {
        table
            .routes
            .iter()
            .find(|r| r.matcher.matches(host, path, method))
            .map(|r| r.index)
    }

    proptest::proptest! {
        #[test]
        fn the_index_finds_the_route_the_ordered_scan_finds(
            specs in proptest::collection::vec((0usize..8, 0usize..5, 0usize..3), 1..40),
            requests in proptest::collection::vec((0usize..8, 0usize..6, proptest::bool::ANY), 1..40),
        ) {
            const PATHS: [&str; 8] = ["/", "/a", "/a/", "/a/b", "=/a", "=/a/b", "/b", "=/"];
            const HOSTS: [Option<&str>; 5] =
                [None, Some("a.com"), Some("b.com"), Some("*.a.com"), Some("*.com")];
            const ASKED: [&str; 8] = ["/", "/a", "/a/", "/a/b", "/a/bc", "/b/x", "/c", ""];
            const ASKED_HOSTS: [&str; 6] = ["a.com", "b.com", "x.a.com", "y.b.com", "c.org", ""];
            let methods = [None, Some(vec![Method::GET]), Some(vec![Method::POST])];
            let table = RouteTable::new(
                specs
                    .iter()
                    .enumerate()
                    .map(|(i, &(path, host, method))| {
                        route(i, PATHS[path], HOSTS[host], methods[method].clone())
                    })
                    .collect(),
            );
            for &(path, host, get) in &requests {
                let method = if get { Method::GET } else { Method::POST };
                let (host, path) = (ASKED_HOSTS[host], ASKED[path]);
                proptest::prop_assert_eq!(
                    found(&table, host, path, method.clone()),
                    scanned(&table, host, path, &method),
                    "{} {} {}", host, path, method
                );
            }
        }
    }

    #[test]
    fn no_match_is_none() {
        let table = RouteTable::new(vec![route(0, "/api/", None, Some(vec![Method::GET]))]);
        assert_eq!(found(&table, "x", "/other", Method::GET), None);
        assert_eq!(found(&table, "x", "/api/x", Method::DELETE), None);
        assert_eq!(found(&RouteTable::default(), "x", "/", Method::GET), None);
    }
}
