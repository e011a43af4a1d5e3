//! What one configuration puts in force for requests: the compiled configuration, one runtime
//! per route (the route, its upstream servers, its metric handles), the handles of unrouted
//! requests, the access and audit logs and the rate limit service's counters. A request holds
//! the site it started with until it ends; `runtime::snapshot` builds the servers (Pingora's
//! pools, with their health checks), starts, swaps and retires it. A site is generic over what its routes'
//! servers are (`upstream::servers::Servers`), so nothing here names Pingora.

use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderValue, Method};

use super::meters::{self, Metrics, RouteMetrics};
use super::overrides::{OverrideList, SiteOverrides};
use crate::caller::consumers::{AuthMode, Consumer, PlanId};
use crate::caller::jwt::JwtVerifier;
use crate::config::{Config, ConfigError};
use crate::limiter::adaptive::{AdaptiveConcurrency, AdaptiveSettings};
use crate::limiter::clock::Clock;
use crate::limiter::paired;
use crate::limiter::per_thread::{Handle, ThreadCopies};
use crate::observe::access_log::{self, AccessLog};
use crate::observe::audit::AuditLog;
use crate::observe::live::LiveViews;
use crate::observe::metrics::ACCESS_LOG_DROPPED;
use crate::route::keys::Rotation;
use crate::route::table::Route;
use crate::route::tiers::{Tier, TierId};
use crate::upstream::health::HealthRecord;
use crate::upstream::servers::Servers;

/// One route as a request needs it, in one reference: the compiled route, its upstream
/// servers and its metric handles.
pub struct RouteRuntime<S> {
    pub route: Arc<Route>,
    pub servers: S,
    pub metrics: RouteMetrics,
    /// Each tier's turn among the shards of its split limits (by tier id).
    rotations: Box<[Rotation]>,
    /// Its upstream's adaptive concurrency limit on this gateway (`adaptive_concurrency`).
    pub adaptive: Option<Arc<AdaptiveConcurrency>>,
    /// Each tier's `RateLimit-Policy` (by tier id), copied per thread: every response on the
    /// route clones it.
    policy_headers: Box<[Option<ThreadCopies<HeaderValue>>]>,
    /// The `Host` sent upstream instead of the client's (`upstream.host`), copied per thread:
    /// every request forwarded clones it.
    pub upstream_host: Option<ThreadCopies<HeaderValue>>,
}

/// What lasts the whole process, built once at start (`edge::server`) and handed to every
/// site in turn: the clock every request reads and the dashboard's live views every request
/// counts into. Nothing of it is a static; a test builds its own.
#[derive(Clone)]
pub struct Lasting {
    pub clock: Arc<dyn Clock>,
    pub views: Arc<LiveViews>,
    /// The quota overrides in force, as this gateway last read them.
    pub overrides: Arc<OverrideList>,
}

impl Lasting {
    /// The process's `clock`, with live views empty from now.
    pub fn new(clock: Arc<dyn Clock>) -> Lasting {
        Lasting {
            clock,
            views: Arc::new(LiveViews::new()),
            overrides: Arc::default(),
        }
    }
}

/// What builds a site's routes besides each route: the configuration, the clock, and what the
/// site in force hands over.
struct RouteContext<'a> {
    config: &'a Config,
    clock: &'a Arc<dyn Clock>,
    handover: &'a Handover<'a>,
}

impl<S: Servers> RouteRuntime<S> {
    /// The runtime of `route`, whose servers are `servers`.
    fn new(route: &Arc<Route>, servers: &S, context: &RouteContext<'_>) -> RouteRuntime<S> {
        let plans = context.config.consumers.plans();
        let mut metrics = RouteMetrics::new(&route.name, route.tiers.written())
            .with_servers(&route.upstream.servers);
        if route.auth.mode != AuthMode::Off {
            metrics = metrics.with_callers(&route.name, plans);
        }
        if route.adaptive.is_some() {
            metrics = metrics.with_shedding(&route.name, plans);
        }
        let adaptive = route.adaptive.as_ref().map(|adaptive| {
            match context.handover.adaptive(&route.name, &adaptive.settings) {
                Some(kept) => Arc::clone(kept),
                None => Arc::new(AdaptiveConcurrency::new(
                    adaptive.settings.clone(),
                    Arc::clone(context.clock),
                    Metrics::adaptive(&route.name),
                )),
            }
        });
        RouteRuntime {
            route: Arc::clone(route),
            servers: servers.clone(),
            metrics,
            rotations: (0..route.tiers.count())
                .map(|_| Rotation::default())
                .collect(),
            adaptive,
            policy_headers: route
                .tiers
                .all()
                .iter()
                .map(|tier| tier.policy_header.clone().map(ThreadCopies::new))
                .collect(),
            upstream_host: route.upstream.host.clone().map(ThreadCopies::new),
        }
    }
}

impl<S> RouteRuntime<S> {
    /// The `RateLimit-Policy` of the route's tier `tier` as written, this thread's copy.
    pub fn policy_header(&self, tier: TierId) -> Option<&ThreadCopies<HeaderValue>> {
        self.policy_headers.get(usize::from(tier.0))?.as_ref()
    }

    /// The round robin of the route's tier `tier`.
    pub fn rotation(&self, tier: TierId) -> &Rotation {
        // An id the route does not have meets its default tier, as `Tiers::get` says.
        let rotations = &self.rotations;
        rotations.get(usize::from(tier.0)).unwrap_or(&rotations[0])
    }
}

/// A site as a request holds it to its end: its thread's handle to the site
/// (`limiter::per_thread::ThreadHandles`), so that taking it writes no count every core writes.
pub type SiteLease<S> = Arc<Handle<Site<S>>>;

/// What one configuration puts in force for requests: a request reads its routes, servers and
/// handles from the site it started with.
pub struct Site<S> {
    pub config: Config,
    /// Every route's runtime, by `Route::index`.
    pub(crate) routes: Box<[Arc<RouteRuntime<S>>]>,
    /// The handles of unrouted requests, and the series a reload may retire.
    pub metrics: Metrics,
    /// Open while this configuration is in force (and its last request logs).
    pub access_log: Option<AccessLog>,
    /// The quota admin audit log (`admin.audit_log`, else stdout), open while this
    /// configuration is in force; SIGUSR1 opens it again by name, a reload opens its own.
    pub audit_log: AuditLog,
    /// The rate limit service's counters, by domain.
    pub rls_metrics: HashMap<String, meters::DomainMetrics>,
    /// The process's clock, the only time a request reads (a manual one in tests).
    pub(crate) clock: Arc<dyn Clock>,
    /// The process's live views (the dashboard's): a denial counts its key and consumer here.
    pub views: Arc<LiveViews>,
    /// The verifier of bearer tokens (`identity.jwt`): the keys in force and the tokens it
    /// verified, state of this site alone but for what a [`Handover`] passes on.
    pub(crate) jwt: Option<Arc<JwtVerifier>>,
    /// The quota overrides in force (the admin API's), and their form for this site's routes.
    pub overrides: SiteOverrides,
    /// Each plan's name as a header value (`X-Consumer-Plan`, by plan id), copied per thread:
    /// every request of a caller on a plan clones it.
    plan_headers: Box<[ThreadCopies<HeaderValue>]>,
}

impl<S> Site<S> {
    /// `plan`'s name as a header value, this thread's copy.
    pub fn plan_header(&self, plan: PlanId) -> Option<HeaderValue> {
        self.plan_headers
            .get(usize::from(plan.0))
            .map(ThreadCopies::get)
    }

    /// `consumer` on the plan a plan override puts it on, while one applies (before its tier
    /// is chosen, whether its plan may use a route is asked, and its plan is counted, logged
    /// and sent upstream).
    pub fn on_plan_in_force(&self, mut consumer: Consumer) -> Consumer {
        let compiled = self.overrides.compiled();
        if let Some(plan) = compiled.plan_of(&consumer.id) {
            consumer.plan = Some(plan);
        }
        consumer
    }
}

/// What a new site takes over from the one in force, said in one place: the keys its JWT
/// verifier fetched from a JWKS URL, when the new configuration names the same URL (they stay
/// in force until its next fetch); and each route's adaptive concurrency limiter, when the
/// route keeps its name and settings (its limit, baseline and requests in flight carry on); and
/// each upstream server's passive health (an ejected server kept stays ejected). Nothing else
/// crosses a reload: pools are built and probed again, rotations and the
/// verified-token cache start anew; the quota overrides in force are the process's
/// (`Lasting`), which every site compiles for its own routes.
#[derive(Clone, Default)]
pub struct Handover<'a> {
    jwt: Option<&'a JwtVerifier>,
    /// Read from the routes in force (each route's runtime holds its own; no second list).
    adaptive: Vec<AdaptiveByRoute>,
    /// The upstream servers' health in force: the passive state of each server kept.
    health: Option<&'a HealthRecord>,
}

/// A route's adaptive concurrency limiter, by the route's name.
type AdaptiveByRoute = (Arc<str>, Arc<AdaptiveConcurrency>);

impl<'a> Handover<'a> {
    /// What `previous`, the site in force, hands over.
    pub fn of<S>(previous: &'a Site<S>) -> Handover<'a> {
        let adaptive = previous.routes.iter().filter_map(|runtime| {
            let limiter = runtime.adaptive.as_ref()?;
            Some((Arc::clone(&runtime.route.name), Arc::clone(limiter)))
        });
        Handover {
            jwt: previous.jwt.as_deref(),
            adaptive: adaptive.collect(),
            health: None,
        }
    }

    /// With the health record in force, whose servers' passive state a server kept keeps.
    pub fn with_health(self, health: &'a HealthRecord) -> Handover<'a> {
        Handover {
            health: Some(health),
            ..self
        }
    }

    /// The health record in force, if handed over.
    pub fn health(&self) -> Option<&'a HealthRecord> {
        self.health
    }

    /// The limiter of the route named `route` in force, if it has the same `settings`.
    fn adaptive(
        &self,
        route: &str,
        settings: &AdaptiveSettings,
    ) -> Option<&Arc<AdaptiveConcurrency>> {
        let (_, limiter) = self.adaptive.iter().find(|(name, _)| &**name == route)?;
        (limiter.settings() == settings).then_some(limiter)
    }
}

/// The access log `config` asks for, opened (its writer starts with the snapshot).
fn open_access_log(config: &Config) -> Result<Option<AccessLog>, ConfigError> {
    let Some(settings) = &config.access_log else {
        return Ok(None);
    };
    AccessLog::open(settings, ACCESS_LOG_DROPPED.clone())
        .map(Some)
        .map_err(|e| {
            ConfigError::single(
                &config.source,
                "access_log.path",
                access_log::cannot_open(e),
            )
        })
}

/// The JWT verifier of `config`, with the keys `handover` passes on.
fn jwt_verifier(config: &Config, handover: &Handover<'_>) -> Option<Arc<JwtVerifier>> {
    let verifier = config.consumers.jwt_verifier()?;
    if let Some(previous) = handover.jwt {
        if verifier.keep_keys_of(previous) {
            log::info!(
                "reload: the same JWKS URL: its {} keys stay in force until its next fetch",
                verifier.keys().keys.len()
            );
        }
    }
    Some(Arc::new(verifier))
}

impl<S: Servers> Site<S> {
    /// Builds the metric handles of `config` with `servers` (one per route, in file order) and
    /// opens its access and audit logs; its requests read `lasting`'s clock and count into its views.
    pub fn build(
        config: Config,
        servers: &[S],
        lasting: &Lasting,
        handover: Handover<'_>,
    ) -> Result<Site<S>, ConfigError> {
        let routes = config.routes.in_file_order();
        let Ok(pairs) = paired("routes and upstreams", &routes, servers) else {
            let detail = format!("{} upstreams for {} routes", servers.len(), routes.len());
            return Err(ConfigError::single(&config.source, "routes", detail));
        };
        let context = RouteContext {
            config: &config,
            clock: &lasting.clock,
            handover: &handover,
        };
        let routes: Box<[Arc<RouteRuntime<S>>]> = pairs
            .map(|(&route, servers)| Arc::new(RouteRuntime::new(route, servers, &context)))
            .collect();
        let mut metrics = Metrics::new(&config.routes, config.consumers.plans());
        let mut rls_metrics = HashMap::new();
        if let Some(rls) = &config.rls {
            metrics = metrics.with_rls(&rls.domains);
            rls_metrics = meters::rls_metrics(&rls.domains);
        }
        let access_log = open_access_log(&config)?;
        let audit_log = AuditLog::open(config.admin_audit_log.as_deref());
        Ok(Site {
            overrides: SiteOverrides::new(Arc::clone(&lasting.overrides), &config),
            routes,
            metrics,
            access_log,
            audit_log,
            rls_metrics,
            clock: Arc::clone(&lasting.clock),
            views: Arc::clone(&lasting.views),
            jwt: jwt_verifier(&config, &handover),
            plan_headers: config
                .consumers
                .plans()
                .header_values()
                .iter()
                .cloned()
                .map(ThreadCopies::new)
                .collect(),
            config,
        })
    }

    /// The route that serves a request for `host`, `path` and `method`, if one does.
    pub fn find(&self, host: &str, path: &str, method: &Method) -> Option<&Arc<RouteRuntime<S>>> {
        let route = self.config.routes.find(host, path, method)?;
        self.routes.get(route.index)
    }

    /// The tier `consumer` meets on `route`, and that tier as a quota override changed it
    /// while one applies.
    pub fn tier_for(
        &self,
        route: &Route,
        consumer: Option<&Consumer>,
    ) -> (TierId, Option<Arc<Tier>>) {
        let tier = route.tiers.choose(consumer);
        let compiled = self.overrides.compiled();
        if compiled.is_empty() {
            return (tier, None);
        }
        (tier, compiled.tier(route, tier, consumer))
    }

    /// The runtime of the route at `index` (file order).
    pub fn route(&self, index: usize) -> Option<&Arc<RouteRuntime<S>>> {
        self.routes.get(index)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::caller::jwt::testing::{self, Family, TestKey};
    use crate::caller::jwt::{jwks, Algorithm};
    use crate::limiter::clock::ManualClock;
    use crate::upstream::servers::InOrder;

    /// A site verifying ES256 tokens with the keys of `url`.
    fn site(url: &str, handover: Handover<'_>) -> Site<InOrder> {
        let yaml = format!(
            "listen: [127.0.0.1:1]\n\
             identity: {{ jwt: {{ jwks_url: \"{url}\", algorithms: [ES256] }} }}\n\
             routes: [{{ name: r, match: {{ path_prefix: / }}, upstream: {{ servers: [127.0.0.1:1] }}, auth: required }}]\n"
        );
        let config = Config::from_yaml(Path::new("site.yaml"), &yaml).expect("a valid config");
        let clock = Arc::new(ManualClock::default());
        let servers = InOrder::of(&config.routes);
        Site::build(config, &servers, &Lasting::new(clock), handover).expect("a site")
    }

    fn verifier(site: &Site<InOrder>) -> &JwtVerifier {
        site.jwt.as_deref().expect("a JWT verifier")
    }

    #[test]
    fn a_site_takes_over_the_keys_of_the_same_jwks_url_and_nothing_else() {
        let first = site("http://127.0.0.1:9/keys", Handover::default());
        assert!(
            verifier(&first).awaits_keys(),
            "a URL's keys are fetched, not read"
        );
        let key = TestKey::generate(Family::P256, Algorithm::ES256, Some("k1"));
        let fetched = jwks::parse(testing::jwks(&[&key]).as_bytes()).expect("a JWKS");
        verifier(&first).install(fetched.set);

        let same = site("http://127.0.0.1:9/keys", Handover::of(&first));
        assert_eq!(verifier(&same).keys().keys.len(), 1, "the same URL: kept");
        assert!(!verifier(&same).awaits_keys());
        assert_eq!(
            verifier(&same).verified_tokens(),
            0,
            "the token cache starts anew"
        );

        let other = site("http://127.0.0.1:9/other", Handover::of(&first));
        assert!(verifier(&other).awaits_keys(), "another URL: nothing kept");
        let fresh = site("http://127.0.0.1:9/keys", Handover::default());
        assert!(verifier(&fresh).awaits_keys(), "no handover: nothing kept");
    }

    #[test]
    fn a_site_compiles_the_overrides_in_force_into_the_tiers_its_callers_meet() {
        use crate::exchange::overrides::Read;
        use crate::route::overrides::{Override, QuotaOverride};
        let yaml = "listen: [127.0.0.1:1]\n\
             routes: [{ name: r, match: { path_prefix: / }, upstream: { servers: [127.0.0.1:1] }, \
             limits: [{ name: a, rate: 10/m, algorithm: fixed_window }, { name: b, rate: 5/s }] }]\n";
        let config = Config::from_yaml(Path::new("site.yaml"), yaml).expect("a valid config");
        let servers = InOrder::of(&config.routes);
        let lasting = Lasting::new(Arc::new(ManualClock::default()));
        let site = Site::build(config, &servers, &lasting, Handover::default()).expect("a site");
        let route = Arc::clone(&site.route(0).expect("route r").route);
        assert!(
            site.tier_for(&route, None).1.is_none(),
            "no override: the tier as written"
        );
        let until = site.clock.instant() + std::time::Duration::from_secs(60);
        let one = |limit: &str, quota| Read {
            one: Override::Limit(QuotaOverride {
                route: "r".into(),
                limit: limit.into(),
                consumer: None,
                quota,
                actor: None,
            }),
            until,
        };
        site.overrides
            .list()
            .replace(vec![one("a", Some(20)), one("b", None)]);
        assert!(
            site.tier_for(&route, None).1.is_none(),
            "compiled at the next refresh"
        );
        site.overrides.refresh(&site.config);
        let (_, tier) = site.tier_for(&route, None);
        let tier = tier.expect("an overridden tier");
        let names: Vec<&str> = tier.limits.iter().map(|l| &*l.limit.exact.name).collect();
        assert_eq!(names, ["a"], "b is lifted");
        let policy = tier.policy_header.as_ref().and_then(|v| v.to_str().ok());
        assert_eq!(policy, Some("\"a\";q=20;w=60"));
        let next = Site::build(
            Config::from_yaml(Path::new("site.yaml"), yaml).expect("a valid config"),
            &servers,
            &lasting,
            Handover::of(&site),
        )
        .expect("a site");
        assert!(
            next.tier_for(&route, None).1.is_some(),
            "a reload keeps them in force: the process's, compiled for the new site"
        );
    }

    /// The header values a route's requests clone are copies of the compiled ones, made per
    /// thread: the same bytes, never the same allocation.
    #[test]
    fn a_route_runtime_copies_the_header_values_its_requests_clone() {
        let yaml = "listen: [127.0.0.1:1]\n\
             routes: [{ name: r, match: { path_prefix: / }, upstream: { servers: [127.0.0.1:1], host: backend.internal }, limits: [{ name: a, rate: 10/s }] }]\n";
        let config = Config::from_yaml(Path::new("site.yaml"), yaml).expect("a valid config");
        let servers = InOrder::of(&config.routes);
        let lasting = Lasting::new(Arc::new(ManualClock::default()));
        let site = Site::build(config, &servers, &lasting, Handover::default()).expect("a site");
        let runtime = site.route(0).expect("route r");
        let at = |v: &HeaderValue| v.as_bytes().as_ptr();
        let compiled = runtime.route.tiers.default().policy_header.clone();
        let compiled = compiled.expect("a policy");
        let copy = runtime.policy_header(TierId(0)).expect("copies").get();
        assert_eq!(copy, "\"a\";q=10;w=1");
        assert_ne!(at(&copy), at(&compiled), "a copy, not the compiled value");
        let host = runtime.upstream_host.as_ref().expect("a host").get();
        assert_eq!(host, "backend.internal");
        let compiled = runtime.route.upstream.host.as_ref().expect("a host");
        assert_ne!(at(&host), at(compiled), "a copy, not the compiled value");
    }

    #[test]
    fn every_site_of_a_process_counts_into_the_live_views_it_was_handed() {
        let lasting = Lasting::new(Arc::new(ManualClock::default()));
        let build = |handover| {
            let yaml = "listen: [127.0.0.1:1]\n\
                 routes: [{ name: r, match: { path_prefix: / }, upstream: { servers: [127.0.0.1:1] } }]\n";
            let config = Config::from_yaml(Path::new("site.yaml"), yaml).expect("a valid config");
            let servers = InOrder::of(&config.routes);
            Site::build(config, &servers, &lasting, handover).expect("a site")
        };
        let first = build(Handover::default());
        first.views.limited_consumers.count(&["alice"]);
        let next = build(Handover::of(&first));
        assert!(
            Arc::ptr_eq(&first.views, &next.views),
            "a reload keeps them"
        );
        assert_eq!(next.views.limited_consumers.top()[0].name, "alice");
        let other = Lasting::new(Arc::new(ManualClock::default()));
        assert!(
            other.views.limited_consumers.top().is_empty(),
            "no static between them"
        );
    }

    /// A site whose route `r` has adaptive concurrency of at least `min_limit`.
    fn adaptive_site(min_limit: u32, handover: Handover<'_>) -> Site<InOrder> {
        let yaml = format!(
            "listen: [127.0.0.1:1]\n\
             routes: [{{ name: r, match: {{ path_prefix: / }}, upstream: {{ servers: [127.0.0.1:1] }}, adaptive_concurrency: {{ min_limit: {min_limit} }} }}]\n"
        );
        let config = Config::from_yaml(Path::new("site.yaml"), &yaml).expect("a valid config");
        let clock = Arc::new(ManualClock::default());
        let servers = InOrder::of(&config.routes);
        Site::build(config, &servers, &Lasting::new(clock), handover).expect("a site")
    }

    fn limiter(site: &Site<InOrder>) -> &Arc<AdaptiveConcurrency> {
        let route = site.route(0).expect("route r");
        route.adaptive.as_ref().expect("an adaptive limiter")
    }

    #[test]
    fn a_route_keeping_its_adaptive_settings_keeps_its_limiter_across_a_reload() {
        let first = adaptive_site(3, Handover::default());
        let held = limiter(&first).admit(0).expect("a place");
        let same = adaptive_site(3, Handover::of(&first));
        assert!(Arc::ptr_eq(limiter(&first), limiter(&same)), "kept");
        let changed = adaptive_site(4, Handover::of(&first));
        assert!(
            !Arc::ptr_eq(limiter(&first), limiter(&changed)),
            "other settings: anew"
        );
        assert_eq!(
            limiter(&changed).limit(),
            4,
            "starting with a probe at its minimum"
        );
        drop(held);
    }
}
