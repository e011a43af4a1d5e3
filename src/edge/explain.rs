//! The explain endpoint, `GET /v1/explain` on the admin listener (behind `admin.token`), and
//! `sluice explain` offline: a request described by its method, host, path, headers, client
//! address and (optionally) the consumer it stands for, taken through admission as the
//! gateway would take it (`exchange::explain`), answered as JSON. The endpoint also reads what
//! each limit has left (a peek, consuming nothing); offline there is no limiter to read.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use http::request::Parts;
use serde::Deserialize;

use crate::caller::consumers::Consumer;
use crate::config::{Config, Sources};
use crate::edge::admin_error::AdminError;
use crate::edge::usage::named_consumer;
use crate::exchange::explain::Explanation;
use crate::exchange::site::{Handover, Lasting};
use crate::exchange::{Exchange, Head, Site};
use crate::limiter::clock::SystemClock;
use crate::limiter::per_thread::Handle;
use crate::limiter::Policy;
use crate::runtime::snapshot::Snapshot;
use crate::upstream::servers::{InOrder, Servers};

/// The most header fields one explained request carries.
const MAX_HEADERS: usize = 64;

/// The parameters that describe a request to explain: the endpoint's query (`method`, `host`,
/// `path`, `header` as `Name: value`, repeated, `peer`, `consumer`, `plan`) and the dashboard's
/// form, which sends `headers`, one `Name: value` per line. A value left empty (or blank) is
/// not given.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Description {
    pub method: Option<String>,
    pub host: Option<String>,
    pub path: Option<String>,
    #[serde(default)]
    pub header: Vec<String>,
    pub headers: Option<String>,
    pub peer: Option<String>,
    pub consumer: Option<String>,
    pub plan: Option<String>,
}

impl Description {
    /// A field's value trimmed, when it is given (not empty nor blank).
    pub fn given(value: &Option<String>) -> Option<&str> {
        value
            .as_deref()
            .map(str::trim)
            .filter(|text| !text.is_empty())
    }
}

/// A request to explain, as its caller describes it.
#[derive(Debug, Clone)]
pub struct Described {
    pub method: String,
    /// The host the request names (its `Host`).
    pub host: String,
    /// The request target: a path, with its query.
    pub target: String,
    pub headers: Vec<(String, String)>,
    /// The TCP peer it comes from (trusted proxies then read the forwarding headers).
    pub peer: IpAddr,
    /// The consumer it stands for, instead of its credentials, and that consumer's plan.
    pub consumer: Option<(String, Option<String>)>,
}

impl Described {
    /// The request an endpoint's query describes (see [`Description`]).
    pub fn from_query(query: Option<&str>) -> Result<Described, AdminError> {
        let description: Description = crate::edge::query::read(query.unwrap_or("").as_bytes())?;
        Described::from_description(&description)
    }

    /// The request `description` describes: its method (GET), host (required), path (`/`,
    /// with its query), headers, peer (127.0.0.1), consumer and plan.
    pub fn from_description(description: &Description) -> Result<Described, AdminError> {
        let given = Description::given;
        let host = given(&description.host).ok_or(AdminError::Missing {
            name: "host",
            also: "",
        })?;
        let lines = description.headers.iter().flat_map(|text| text.lines());
        let fields = description.header.iter().map(String::as_str).chain(lines);
        let headers = fields
            .filter(|field| !field.trim().is_empty())
            .map(header_field)
            .collect::<Result<_, _>>()?;
        let consumer = given(&description.consumer).map(str::to_string);
        let plan = given(&description.plan).map(str::to_string);
        Ok(Described {
            method: given(&description.method).unwrap_or("GET").to_string(),
            host: host.to_string(),
            target: given(&description.path).unwrap_or("/").to_string(),
            headers,
            peer: given(&description.peer).map_or(Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)), peer)?,
            consumer: consumer.map(|id| (id, plan)),
        })
    }

    /// The request `sluice explain METHOD URL -H ...` describes (`URL`: `http://host/path`).
    pub fn from_url(method: &str, url: &str, headers: &[String]) -> Result<Described, AdminError> {
        let uri: http::Uri =
            url.parse()
                .map_err(|e: http::uri::InvalidUri| AdminError::NotUrl {
                    url: url.to_string(),
                    why: e.to_string(),
                })?;
        let host = uri
            .authority()
            .map(|a| a.as_str().to_string())
            .ok_or_else(|| AdminError::NoHost(url.to_string()))?;
        let target = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        let headers = headers
            .iter()
            .map(|field| header_field(field))
            .collect::<Result<_, _>>()?;
        Ok(Described {
            method: method.to_string(),
            host,
            target,
            headers,
            peer: IpAddr::V4(Ipv4Addr::LOCALHOST),
            consumer: None,
        })
    }

    /// Its method, host and path (without the query), as an explanation shows them.
    fn shown(&self) -> (&str, &str, &str) {
        let path = self.target.split('?').next().unwrap_or("/");
        (&self.method, &self.host, path)
    }

    /// The request's head, as a listener would hand it over.
    fn parts(&self) -> Result<Parts, AdminError> {
        if self.headers.len() > MAX_HEADERS {
            return Err(AdminError::TooManyHeaders(MAX_HEADERS));
        }
        let mut request = http::Request::builder()
            .method(self.method.as_str())
            .uri(self.target.as_str())
            .header(http::header::HOST, self.host.as_str());
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request
            .body(())
            .map_err(|e| AdminError::NotRequest(e.to_string()))?;
        Ok(request.into_parts().0)
    }
}

/// `Name: value`.
fn header_field(field: &str) -> Result<(String, String), AdminError> {
    let (name, value) = field
        .split_once(':')
        .ok_or_else(|| AdminError::HeaderField(field.to_string()))?;
    Ok((name.trim().to_string(), value.trim().to_string()))
}

fn peer(text: &str) -> Result<IpAddr, AdminError> {
    text.parse().map_err(|_| AdminError::Malformed {
        name: "peer",
        why: format!("{text:?} is not an IP address").into(),
    })
}

/// `described` taken through admission on `site`, up to its limits' decision.
fn explained<S: Servers>(
    site: &Arc<Site<S>>,
    described: &Described,
) -> Result<Exchange<S>, AdminError> {
    let parts = described.parts()?;
    let presumed: Option<Consumer> = match &described.consumer {
        Some((id, plan)) => Some(named_consumer(site.as_ref(), id, plan.as_deref())?),
        None => None,
    };
    let head = Head {
        parts: &parts,
        raw_target: described.target.as_bytes(),
        peer: Some(described.peer),
        client_certificate: None,
        cut: Default::default(),
    };
    let mut exchange = Exchange::new(Handle::of(Arc::clone(site)), Instant::now());
    exchange.explain(&head, presumed);
    Ok(exchange)
}

/// `GET /v1/explain`: the explanation of the request the query describes, with what each
/// limit has left (`remaining: null` when the limiter cannot be read; `peek_error` says why).
pub async fn explain(
    policy: &Policy,
    snapshot: &Snapshot,
    query: Option<&str>,
) -> Result<Explanation, AdminError> {
    explain_described(policy, snapshot, &Described::from_query(query)?).await
}

/// The explanation of `described`, with what each limit has left.
pub async fn explain_described(
    policy: &Policy,
    snapshot: &Snapshot,
    described: &Described,
) -> Result<Explanation, AdminError> {
    let mut exchange = explained(&snapshot.site, described)?;
    let peeked = exchange.peek(policy).await;
    let mut answer = exchange.explanation(described.shown());
    answer.peek_error = peeked.err().map(|e| e.to_string());
    Ok(answer)
}

/// Why `sluice explain` has no answer: the configuration does not load, or the request
/// cannot be described.
#[derive(Debug)]
pub enum Unexplained {
    Config(String),
    Request(String),
}

/// `sluice explain`: the explanation of `described` under the configuration at `conf`,
/// without a limiter (what each limit has left is not read) and without opening anything the
/// configuration names (its access log, its audit log).
pub fn offline(conf: &Path, described: &Described) -> Result<Explanation, Unexplained> {
    let mut read = Sources::default();
    let mut config =
        Config::load(conf, &mut read).map_err(|e| Unexplained::Config(e.to_string()))?;
    config.access_log = None;
    config.admin_audit_log = None;
    let servers = InOrder::of(&config.routes);
    let site = Site::build(
        config,
        &servers,
        &Lasting::new(Arc::new(SystemClock)),
        Handover::default(),
    )
    .map_err(|e| Unexplained::Config(e.to_string()))?;
    let exchange =
        explained(&Arc::new(site), described).map_err(|e| Unexplained::Request(e.to_string()))?;
    Ok(exchange.explanation(described.shown()))
}
