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

use crate::caller::consumers::Consumer;
use crate::config::{Config, Sources};
use crate::edge::admin_error::AdminError;
use crate::edge::usage::named_consumer;
use crate::exchange::explain::Explanation;
use crate::exchange::site::{Handover, Lasting};
use crate::exchange::{Exchange, Head, Site};
use crate::limiter::clock::SystemClock;
use crate::limiter::Policy;
use crate::runtime::snapshot::Snapshot;
use crate::upstream::servers::{InOrder, Servers};

/// The most header fields one explained request carries.
const MAX_HEADERS: usize = 64;

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
    /// The request an endpoint's query describes: `method` (GET), `host`, `path` (`/`, with
    /// its query), `header` (`Name: value`, repeated), `peer` (127.0.0.1), `consumer`, `plan`.
    pub fn from_query(query: Option<&str>) -> Result<Described, AdminError> {
        let fields: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .into_owned()
            .collect();
        Described::from_form(&fields)
    }

    /// The request `fields` describe, as [`Described::from_query`] reads them; the dashboard's
    /// form also sends `headers`, one `Name: value` per line. Empty fields are not given.
    pub fn from_form(fields: &[(String, String)]) -> Result<Described, AdminError> {
        let mut described = Described {
            method: "GET".into(),
            host: String::new(),
            target: "/".into(),
            headers: Vec::new(),
            peer: IpAddr::V4(Ipv4Addr::LOCALHOST),
            consumer: None,
        };
        let (mut consumer, mut plan) = (None, None);
        for (name, value) in fields.iter().filter(|(_, value)| !value.trim().is_empty()) {
            let value = value.trim().to_string();
            match name.as_str() {
                "method" => described.method = value,
                "host" => described.host = value,
                "path" => described.target = value,
                "header" => described.headers.push(header_field(&value)?),
                "headers" => {
                    for line in value.lines().filter(|line| !line.trim().is_empty()) {
                        described.headers.push(header_field(line)?);
                    }
                }
                "peer" => described.peer = peer(&value)?,
                "consumer" => consumer = Some(value),
                "plan" => plan = Some(value),
                _ => {
                    return Err(AdminError::UnknownParameter {
                        name: name.clone(),
                        takes: ": use method, host, path, header, peer, consumer and plan",
                    })
                }
            }
        }
        described.consumer = consumer.map(|id| (id, plan));
        if described.host.is_empty() {
            return Err(AdminError::Missing {
                name: "host",
                also: "",
            });
        }
        Ok(described)
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
    let mut exchange = Exchange::new(Arc::clone(site), Instant::now());
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
