//! The compiled route table: which route serves a request, by host, path prefix and method.
//!
//! Order (most specific first): longer `path_prefix`, then routes with a `host` before those
//! without, then routes with `methods` before those without, then file order. The first
//! route whose every condition holds wins.

use std::sync::Arc;

use http::header::HeaderValue;
use http::Method;

use crate::keys::RouteKeys;
use crate::limiter::Limit;
use crate::upstream::Upstream;

#[derive(Debug, Clone)]
pub struct RouteMatch {
    pub path_prefix: String,
    /// Lowercased, without port; `None` matches any host.
    pub host: Option<String>,
    /// `None` matches any method.
    pub methods: Option<Vec<Method>>,
}

impl RouteMatch {
    fn matches(&self, host: &str, path: &str, method: &Method) -> bool {
        path.starts_with(&self.path_prefix)
            && self.host.as_deref().is_none_or(|h| h == host)
            && self.methods.as_ref().is_none_or(|m| m.contains(method))
    }
}

/// One route, compiled: everything a request needs, built once at config load.
#[derive(Debug)]
pub struct Route {
    /// Position in the configuration file; indexes per-route metric handles.
    pub index: usize,
    pub name: Arc<str>,
    pub matcher: RouteMatch,
    pub upstream: Upstream,
    pub limits: Box<[Limit]>,
    pub keys: RouteKeys,
    /// `RateLimit-Policy` value, or `None` when the route sends no rate-limit headers.
    pub policy_header: Option<HeaderValue>,
    /// Some limit stores per-request entries (sliding log, concurrency): calls need a request id.
    pub needs_request_id: bool,
    /// Some limit is a concurrency limit: admitted requests release their lease when done.
    pub holds_leases: bool,
}

#[derive(Debug, Default)]
pub struct RouteTable {
    /// Sorted most specific first.
    routes: Vec<Arc<Route>>,
}

impl RouteTable {
    pub fn new(mut routes: Vec<Route>) -> RouteTable {
        routes.sort_by(|a, b| {
            let (a, b) = (&a.matcher, &b.matcher);
            b.path_prefix
                .len()
                .cmp(&a.path_prefix.len())
                .then(b.host.is_some().cmp(&a.host.is_some()))
                .then(b.methods.is_some().cmp(&a.methods.is_some()))
        });
        RouteTable {
            routes: routes.into_iter().map(Arc::new).collect(),
        }
    }

    /// `host` lowercased, without port.
    pub fn find(&self, host: &str, path: &str, method: &Method) -> Option<&Arc<Route>> {
        self.routes
            .iter()
            .find(|r| r.matcher.matches(host, path, method))
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
    use std::time::Duration;

    fn route(
        index: usize,
        prefix: &str,
        host: Option<&str>,
        methods: Option<Vec<Method>>,
    ) -> Route {
        Route {
            index,
            name: format!("r{index}").into(),
            matcher: RouteMatch {
                path_prefix: prefix.into(),
                host: host.map(Into::into),
                methods,
            },
            upstream: Upstream::new(
                vec!["127.0.0.1:1".parse().unwrap()],
                Duration::ZERO,
                Duration::ZERO,
            ),
            limits: Box::new([]),
            keys: RouteKeys::new("p", "r", crate::keys::KeySecret::new("s"), &[]),
            policy_header: None,
            needs_request_id: false,
            holds_leases: false,
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
    fn no_match_is_none() {
        let table = RouteTable::new(vec![route(0, "/api/", None, Some(vec![Method::GET]))]);
        assert_eq!(found(&table, "x", "/other", Method::GET), None);
        assert_eq!(found(&table, "x", "/api/x", Method::DELETE), None);
    }
}
