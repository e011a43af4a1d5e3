//! Limiter keys: from the parts a limit names to bounded, hash-tagged Redis key bytes.
//!
//! Layout: `<prefix>:{<route>[.<tag>]}:<limit>:<digest>`.
//! * prefix, route and limit names come from the config (checked charset, no braces), so keys
//!   stay readable where that is safe;
//! * `digest` is a 128-bit keyed SipHash-1-3 of the limit's key parts, each tagged and
//!   length-prefixed, so no client byte reaches Redis, every key has the same bounded length, and
//!   without the secret nobody can craft two clients that share a bucket;
//! * the hash tag `{...}` holds the route and a 64-bit digest of the parts *every* limit of the
//!   route shares, so all keys of one call land in one Redis Cluster slot while different
//!   clients still spread across slots;
//! * a route with a split limit (`split: N`, a hot key cut into N sub-keys) tags its keys
//!   `{<route>.s<i>}` instead: `i` is the digest of the parts its other limits share, modulo N
//!   (a client always lands on the same shard, with its own keys), or a per-gateway round robin
//!   when the route has only split limits. Still one slot per call.
//! * a route that uses a common limit (a top-level `limits:` entry: one bucket for every route
//!   that uses it) keys every limit under a tag no route names: `<prefix>:{@[.<tag>]}:` then
//!   `@<limit>:<digest>` for the common limit, `<route>:<limit>:<digest>` for the route's own.
//!   The tag is the digest of the common limit's parts (sorted), the same on every route, and
//!   every own limit counted in Redis is keyed on at least those parts (`config/routes.rs`
//!   checks it), so one caller's keys of one call share one Cluster slot on every route. An
//!   own limit local to each gateway that is not keyed on them is counted untagged (its key
//!   never reaches Redis).

use std::borrow::Cow;
use std::hash::Hasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use http::header::HeaderName;
use http::HeaderMap;
use siphasher::sip128::{Hash128, Hasher128, SipHasher13};
use smallvec::SmallVec;

use crate::caller::consumers::Consumer;
use crate::limiter::{push_hex, Key};

/// One ingredient of a limit's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    ClientIp,
    Path,
    Route,
    Method,
    Host,
    Header(HeaderName),
    /// The first value of a query parameter, as sent (not decoded).
    Query(Box<str>),
    Const(Box<str>),
    /// The verified consumer (an anonymous caller: its address).
    Consumer,
    /// A claim of the caller's verified token.
    Claim(Box<str>),
}

/// Longest claim name a key part may name.
const MAX_CLAIM_NAME: usize = 64;

/// What a limit does when a header or query part is missing from a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMissing {
    /// A missing part counts as an empty one: all such requests share a bucket.
    #[default]
    UseEmpty,
    /// The request is refused with `400`.
    Deny,
    /// The limit is left out for this request: it neither counts nor denies (its state is only
    /// read, so the response headers still describe it).
    Skip,
}

/// A request lacks a part its limit requires (`on_missing: deny`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingPart;

impl KeyPart {
    pub fn parse(text: &str) -> Result<KeyPart, String> {
        let part = match text {
            "client_ip" => KeyPart::ClientIp,
            "path" => KeyPart::Path,
            "route" => KeyPart::Route,
            "method" => KeyPart::Method,
            "host" => KeyPart::Host,
            _ => {
                if let Some(name) = text.strip_prefix("header:") {
                    let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                        format!("invalid header name {name:?} in key part {text:?}")
                    })?;
                    KeyPart::Header(name)
                } else if let Some(name) = text.strip_prefix("query:") {
                    if name.is_empty() {
                        return Err(format!("empty query parameter name in key part {text:?}"));
                    }
                    // Compared decoded, as requests' parameter names are.
                    let (decoded, _) = form_urlencoded::parse(name.as_bytes())
                        .next()
                        .unwrap_or_default();
                    KeyPart::Query(decoded.into())
                } else if let Some(value) = text.strip_prefix("const:") {
                    KeyPart::Const(value.into())
                } else if text == "consumer" {
                    KeyPart::Consumer
                } else if let Some(name) = text.strip_prefix("claim:") {
                    if name.is_empty()
                        || name.len() > MAX_CLAIM_NAME
                        || !name.bytes().all(|b| b.is_ascii_graphic())
                    {
                        return Err(format!(
                            "invalid claim name in key part {text:?}: 1 to {MAX_CLAIM_NAME} printable characters"
                        ));
                    }
                    KeyPart::Claim(name.into())
                } else {
                    return Err(format!(
                        "unknown key part {text:?}: use client_ip, path, route, method, host, header:NAME, query:NAME, const:TEXT, consumer or claim:NAME"
                    ));
                }
            }
        };
        Ok(part)
    }

    /// Whether the part is the verified caller's (`consumer`, `claim:NAME`).
    pub fn is_caller(&self) -> bool {
        matches!(self, KeyPart::Consumer | KeyPart::Claim(_))
    }
}

impl std::fmt::Display for KeyPart {
    /// As written in the config.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::ClientIp => f.write_str("client_ip"),
            KeyPart::Path => f.write_str("path"),
            KeyPart::Route => f.write_str("route"),
            KeyPart::Method => f.write_str("method"),
            KeyPart::Host => f.write_str("host"),
            KeyPart::Header(name) => write!(f, "header:{name}"),
            KeyPart::Query(name) => write!(f, "query:{name}"),
            KeyPart::Const(text) => write!(f, "const:{text}"),
            KeyPart::Consumer => f.write_str("consumer"),
            KeyPart::Claim(name) => write!(f, "claim:{name}"),
        }
    }
}

/// What a request offers to key parts. Borrowed from the request, never copied.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    pub client_ip: IpAddr,
    pub method: &'a str,
    /// Lowercased, without port.
    pub host: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
    pub route: &'a str,
    /// The verified caller; `None`: anonymous (or the route does not verify callers).
    pub consumer: Option<&'a Consumer>,
    /// The claim names of [`Consumer::claims`], in its order.
    pub claim_names: &'a [Arc<str>],
}

impl RequestFacts<'_> {
    /// The value of the caller's claim `name`, if its token had it.
    fn claim(&self, name: &str) -> Option<&str> {
        let index = self.claim_names.iter().position(|n| &**n == name)?;
        self.consumer?.claims.get(index)?.as_deref()
    }
}

/// The first value of the query parameter `name`, read as HTML forms are
/// (`form_urlencoded`: `+` a space, `%XX` its byte, a malformed escape kept as written, bytes
/// that are not UTF-8 as U+FFFD) and compared on decoded names: one value is one bucket however
/// a client spells it (`tenant=a%62c` is `tenant=abc`). Borrowed from the query when nothing
/// needed decoding.
fn query_value<'q>(query: Option<&'q str>, name: &str) -> Option<Cow<'q, str>> {
    form_urlencoded::parse(query?.as_bytes())
        .find_map(|(key, value)| (key == name).then_some(value))
}

/// Feeds one part; returns whether the request had it (header and query parts can be missing).
fn feed(hasher: &mut impl Hasher, facts: &RequestFacts<'_>, part: &KeyPart) -> bool {
    // The tag and the length go in as integers: the same bytes as slices (little-endian), through
    // SipHash's short path.
    let mut field = |tag: u8, bytes: &[u8]| {
        hasher.write_u8(tag);
        hasher.write_u64(bytes.len() as u64);
        hasher.write(bytes);
    };
    match part {
        KeyPart::ClientIp => match facts.client_ip {
            IpAddr::V4(v4) => field(1, &v4.octets()),
            IpAddr::V6(v6) => field(2, &v6.octets()),
        },
        KeyPart::Path => field(3, facts.path.as_bytes()),
        KeyPart::Route => field(4, facts.route.as_bytes()),
        KeyPart::Method => field(5, facts.method.as_bytes()),
        KeyPart::Host => field(6, facts.host.as_bytes()),
        KeyPart::Header(name) => {
            let value = facts.headers.get(name);
            field(7, value.map_or(&b""[..], |v| v.as_bytes()));
            return value.is_some();
        }
        KeyPart::Query(name) => {
            let value = query_value(facts.query, name);
            field(8, value.as_deref().map_or(&b""[..], str::as_bytes));
            return value.is_some();
        }
        KeyPart::Const(text) => field(9, text.as_bytes()),
        KeyPart::Consumer => match facts.consumer {
            Some(consumer) => field(10, consumer.id.as_bytes()),
            // An anonymous caller counts as its address, never as anyone's consumer.
            None => match facts.client_ip {
                IpAddr::V4(v4) => field(11, &v4.octets()),
                IpAddr::V6(v6) => field(12, &v6.octets()),
            },
        },
        KeyPart::Claim(name) => {
            let value = facts.claim(name);
            field(13, value.map_or(&b""[..], str::as_bytes));
            return value.is_some();
        }
    }
    true
}

/// A 64-bit digest of `parts` for choosing an upstream server (consistent hashing).
pub fn digest_parts(facts: &RequestFacts<'_>, parts: &[KeyPart]) -> u64 {
    let mut hasher = SipHasher13::new();
    for part in parts {
        feed(&mut hasher, facts, part);
    }
    hasher.finish()
}

/// The SipHash key of every key digest: from the configured secret, shared by all gateways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySecret(u64, u64);

impl KeySecret {
    pub fn new(secret: &str) -> KeySecret {
        let digest = xxhash_rust::xxh3::xxh3_128(secret.as_bytes());
        KeySecret((digest >> 64) as u64, digest as u64)
    }

    /// The two SipHash keys, for other key builders (`rls`).
    pub fn keys(&self) -> (u64, u64) {
        (self.0, self.1)
    }

    fn hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.0, self.1)
    }
}

/// How one limit's key is made: its name between the tag and the digest, the parts it is
/// keyed on, what a missing part does, and whether its digest is the route's tag's.
#[derive(Debug, Clone)]
pub struct LimitKey {
    middle: Box<[u8]>,
    parts: Box<[KeyPart]>,
    on_missing: OnMissing,
    /// A common limit's: one bucket for every route that uses it.
    common: bool,
    /// Keyed under no tag: an own limit local to each gateway on a route of common limits,
    /// not keyed on their parts (the tag would split its buckets; its key never reaches Redis).
    untagged: bool,
    /// Its parts are exactly the tag's: its digest's upper half is the tag's digest (SipHash's
    /// 64-bit result is the upper half of its 128-bit one), so the parts are hashed once.
    gives_tag: bool,
    /// The whole key, when nothing in it depends on the request: its parts and the route's tag
    /// are the route's name and constants (a per-route limit). Made once, at load.
    fixed: Option<Key>,
}

/// One limit's digest of one request, and whether the limit is skipped (a part is missing and
/// it says `on_missing: skip`).
#[derive(Debug, Clone, Copy)]
pub struct Digest {
    hash: Hash128,
    pub skipped: bool,
}

/// Whether `parts` are the route's name and constants only: nothing a request changes.
fn constant(parts: &[KeyPart]) -> bool {
    parts
        .iter()
        .all(|part| matches!(part, KeyPart::Route | KeyPart::Const(_)))
}

/// The variable end of a request's hash tag (`.<digest>` or a shard suffix) and its `}`:
/// every key of the call starts with the route's head and this. Inline up to 40 bytes.
#[derive(Debug, Clone, Default)]
pub struct Tag(SmallVec<[u8; 40]>);

/// How one limit's key is made, as configured.
#[derive(Debug, Clone)]
pub struct KeySpec {
    pub limit: String,
    pub parts: Vec<KeyPart>,
    pub on_missing: OnMissing,
    /// Sub-keys (shards) of a split limit; 1 for an ordinary limit.
    pub shards: u32,
    /// A common limit: defined at the top of the file, one bucket for every route using it.
    pub common: bool,
    /// Counted by each gateway, never in Redis (`scope: local`).
    pub local: bool,
}

impl KeySpec {
    /// An own limit of a route named `limit`, counted in Redis, keyed on `parts`.
    pub fn new(limit: &str, parts: Vec<KeyPart>) -> KeySpec {
        KeySpec {
            limit: limit.to_string(),
            parts,
            on_missing: OnMissing::UseEmpty,
            shards: 1,
            common: false,
            local: false,
        }
    }
}

/// The parts a common limit's key tag is made of, in one order whatever order they were
/// written in: the same tag on every route.
pub fn canonical_parts(parts: &[KeyPart]) -> Vec<KeyPart> {
    let mut sorted = parts.to_vec();
    sorted.sort_by_key(|part| part.to_string());
    sorted.dedup();
    sorted
}

/// The `.s<i>` suffix of each shard's hash tag, made at load.
type ShardSuffixes = Box<[Box<[u8]>]>;

fn shard_suffixes(shards: u32) -> ShardSuffixes {
    (0..shards)
        .map(|i| format!(".s{i}").into_bytes().into())
        .collect()
}

/// Which shard the next request of a tier whose limits are all split takes: state of the
/// running configuration, held by the route's runtime (`exchange::site::RouteRuntime`) and
/// started at 0 with each configuration; the compiled keys hold none.
#[derive(Debug, Default)]
pub struct Rotation(AtomicU32);

impl Rotation {
    /// The same turn, apart from this rotation: what explain reads the next shard from
    /// without taking a turn of the requests'.
    pub fn copy(&self) -> Rotation {
        Rotation(AtomicU32::new(self.0.load(Ordering::Relaxed)))
    }

    /// This request's turn.
    fn next(&self) -> u32 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// How the hash tag of a route's call is chosen.
#[derive(Debug, Clone)]
enum TagChoice {
    /// `{route[.digest of the shared parts]}`.
    SharedParts,
    /// `{route.s<i>}`, `i` = digest of the shared parts of the unsplit limits mod the shards.
    ShardBySharedParts { suffixes: ShardSuffixes },
    /// `{route.s<i>}`, `i` from a round robin over the shards (the route has only split limits).
    ShardRoundRobin { suffixes: ShardSuffixes },
}

/// Builds the keys of every limit of one route.
#[derive(Debug, Clone)]
pub struct RouteKeys {
    /// `<prefix>:{<route>`, or `<prefix>:{@` on a route of common limits.
    head: Box<[u8]>,
    /// The route uses common limits: its own limits name it after the tag.
    common_tag: bool,
    /// The route's name, what its requests' `route` part is.
    route: Box<str>,
    secret: KeySecret,
    tag_parts: Box<[KeyPart]>,
    tag_choice: TagChoice,
}

impl RouteKeys {
    /// One key per spec; names are checked by the config compiler, and split limits of one
    /// route have the same number of shards. A route of common limits (no split limit, its
    /// common limits keyed on the same parts: checked at load) is tagged by their parts.
    pub fn new(prefix: &str, route: &str, secret: KeySecret, specs: &[KeySpec]) -> RouteKeys {
        if let Some(common) = specs.iter().find(|spec| spec.common) {
            return RouteKeys {
                head: format!("{prefix}:{{@").into_bytes().into(),
                common_tag: true,
                route: route.into(),
                secret,
                tag_parts: canonical_parts(&common.parts).into(),
                tag_choice: TagChoice::SharedParts,
            };
        }
        let shards = specs.iter().map(|s| s.shards).max().unwrap_or(1);
        // With split limits, the tag follows the parts the *unsplit* limits share.
        let tagging: Vec<&KeySpec> = specs
            .iter()
            .filter(|spec| shards <= 1 || spec.shards <= 1)
            .collect();
        let tag_parts: Vec<KeyPart> = match tagging.split_first() {
            Some((first, rest)) => first
                .parts
                .iter()
                .filter(|part| rest.iter().all(|spec| spec.parts.contains(part)))
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        let tag_choice = match (shards, tagging.is_empty()) {
            (0 | 1, _) => TagChoice::SharedParts,
            (shards, false) => TagChoice::ShardBySharedParts {
                suffixes: shard_suffixes(shards),
            },
            (shards, true) => TagChoice::ShardRoundRobin {
                suffixes: shard_suffixes(shards),
            },
        };
        RouteKeys {
            head: format!("{prefix}:{{{route}").into_bytes().into(),
            common_tag: false,
            route: route.into(),
            secret,
            tag_parts: tag_parts.into(),
            tag_choice,
        }
    }

    /// How the key of the limit `spec` describes is made on this route.
    pub fn limit_key(&self, spec: &KeySpec) -> LimitKey {
        let middle = match (self.common_tag, spec.common) {
            (true, true) => format!(":@{}:", spec.limit),
            (true, false) => format!(":{}:{}:", self.route, spec.limit),
            (false, _) => format!(":{}:", spec.limit),
        };
        let untagged = self.common_tag
            && !spec.common
            && !self.tag_parts.iter().all(|part| spec.parts.contains(part));
        let mut limit = LimitKey {
            middle: middle.into_bytes().into(),
            gives_tag: !untagged && *spec.parts == *self.tag_parts,
            parts: spec.parts.clone().into(),
            on_missing: spec.on_missing,
            common: spec.common,
            untagged,
            fixed: None,
        };
        limit.fixed = self.fixed_key(&limit);
        limit
    }

    /// `limit`'s whole key, when no request changes it: its parts and the tag's are the route's
    /// name and constants, and no round robin picks the shard. Made as a request's would be.
    fn fixed_key(&self, limit: &LimitKey) -> Option<Key> {
        let rotating = matches!(self.tag_choice, TagChoice::ShardRoundRobin { .. });
        if rotating || !constant(&limit.parts) || !constant(&self.tag_parts) {
            return None;
        }
        let headers = HeaderMap::new();
        let facts = RequestFacts {
            client_ip: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            method: "",
            host: "",
            path: "",
            query: None,
            headers: &headers,
            route: &self.route,
            consumer: None,
            claim_names: &[],
        };
        let digest = self.digest(limit, &facts).ok()?;
        let tag = self.tag(&facts, None, &Rotation::default());
        Some(self.key(&tag, limit, &digest))
    }

    /// Whether the key of `limit` follows from the caller alone (its parts are `consumer`,
    /// `route` or `const:`, and no round robin picks its shard): what the usage API can read
    /// for a consumer without a request.
    pub fn follows_from_caller(&self, limit: &LimitKey) -> bool {
        self.follows_from(limit, true, false)
    }

    /// Whether the route has split limits (their shards' tags are chosen per request).
    pub fn has_split_limits(&self) -> bool {
        !matches!(self.tag_choice, TagChoice::SharedParts)
    }

    /// Whether `limit`'s key follows from a consumer (when `consumer`) and a client address
    /// (when `client_ip`) alone: the quota admin API's targets.
    pub fn follows_from(&self, limit: &LimitKey, consumer: bool, client_ip: bool) -> bool {
        let given = |part: &KeyPart| match part {
            KeyPart::Consumer => consumer,
            KeyPart::ClientIp => client_ip,
            KeyPart::Route | KeyPart::Const(_) => true,
            _ => false,
        };
        !matches!(self.tag_choice, TagChoice::ShardRoundRobin { .. })
            && limit.parts.iter().all(given)
    }

    /// `limit`'s digest of the request; `Err` when a part is missing and the limit says
    /// `on_missing: deny`.
    pub fn digest(
        &self,
        limit: &LimitKey,
        facts: &RequestFacts<'_>,
    ) -> Result<Digest, MissingPart> {
        let mut hasher = self.secret.hasher();
        let mut complete = true;
        for part in limit.parts.iter() {
            complete &= feed(&mut hasher, facts, part);
        }
        let skipped = match (complete, limit.on_missing) {
            (false, OnMissing::Deny) => return Err(MissingPart),
            (false, OnMissing::Skip) => true,
            _ => false,
        };
        Ok(Digest {
            hash: hasher.finish128(),
            skipped,
        })
    }

    /// The request's hash tag. `from`: the digest of a limit that gives the tag
    /// ([`LimitKey::gives_tag`]), if the request has one (its parts are not hashed again). A
    /// round robin over shards takes its turn from `rotation`.
    pub fn tag(&self, facts: &RequestFacts<'_>, from: Option<&Digest>, rotation: &Rotation) -> Tag {
        let mut tag = Tag::default();
        let shared_digest = || match from {
            Some(digest) => digest.hash.h2,
            None => {
                let mut hasher = self.secret.hasher();
                for part in self.tag_parts.iter() {
                    feed(&mut hasher, facts, part);
                }
                hasher.finish()
            }
        };
        match &self.tag_choice {
            TagChoice::SharedParts if self.tag_parts.is_empty() => {}
            TagChoice::SharedParts => {
                tag.0.push(b'.');
                push_hex(&mut tag.0, &shared_digest().to_be_bytes());
            }
            TagChoice::ShardBySharedParts { suffixes } => {
                let shard = shared_digest() % suffixes.len() as u64;
                tag.0.extend_from_slice(&suffixes[shard as usize]);
            }
            TagChoice::ShardRoundRobin { suffixes } => {
                let turn = rotation.next();
                tag.0
                    .extend_from_slice(&suffixes[turn as usize % suffixes.len()]);
            }
        }
        tag.0.push(b'}');
        tag
    }

    /// `limit`'s key: the route's head, the request's `tag`, the limit's name and its `digest`.
    /// Built in place, on the heap only past `KEY_INLINE` bytes.
    pub fn key(&self, tag: &Tag, limit: &LimitKey, digest: &Digest) -> Key {
        let mut key = Key::new();
        key.extend_from_slice(&self.head);
        match limit.untagged {
            true => key.push(b'}'),
            false => key.extend_from_slice(&tag.0),
        }
        key.extend_from_slice(&limit.middle);
        push_hex(&mut key, &digest.hash.as_u128().to_be_bytes());
        key
    }
}

impl LimitKey {
    /// Its digest is the route's tag's (see [`RouteKeys::tag`]).
    pub fn gives_tag(&self) -> bool {
        self.gives_tag
    }

    /// Whether it is a common limit's (one bucket for every route that uses it).
    pub fn common(&self) -> bool {
        self.common
    }

    /// The parts it is made of, as written.
    pub fn parts(&self) -> &[KeyPart] {
        &self.parts
    }

    /// Its whole key, when no request changes it (see [`RouteKeys::limit_key`]).
    pub fn fixed(&self) -> Option<&Key> {
        self.fixed.as_ref()
    }

    /// Whether it counts one bucket for the whole route (its parts are the route's name and
    /// constants; a split limit's shards are equal shares of it): then no partition is worth
    /// naming to a client.
    pub fn one_bucket(&self) -> bool {
        constant(&self.parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(ip: &str, path: &'a str, headers: &'a HeaderMap) -> RequestFacts<'a> {
        RequestFacts {
            client_ip: ip.parse().unwrap(),
            method: "GET",
            host: "example.com",
            path,
            query: Some("api_key=abc&flag"),
            headers,
            route: "api",
            consumer: None,
            claim_names: &[],
        }
    }

    fn spec(limit: &str, list: &[&str]) -> KeySpec {
        KeySpec::new(
            limit,
            list.iter().map(|p| KeyPart::parse(p).unwrap()).collect(),
        )
    }

    fn tag(key: &[u8]) -> String {
        let text = String::from_utf8(key.to_vec()).unwrap();
        text[..=text.find('}').unwrap()].to_string()
    }

    #[test]
    fn a_split_limit_shards_the_tag_by_the_parts_the_other_limits_share() {
        let keys = keys(&[
            spec("per_client", &["client_ip"]),
            KeySpec {
                shards: 4,
                ..spec("global", &[])
            },
        ]);
        let h = HeaderMap::new();
        let mut shards = std::collections::BTreeSet::new();
        for i in 0..64 {
            let ip = format!("10.0.0.{i}");
            let built = keys
                .build(&facts(&ip, "/", &h), &Rotation::default())
                .unwrap()
                .keys;
            assert_eq!(tag(&built[0]), tag(&built[1]), "one slot per call");
            assert_eq!(
                built,
                keys.build(&facts(&ip, "/", &h), &Rotation::default())
                    .unwrap()
                    .keys
            );
            shards.insert(tag(&built[0]));
        }
        let expected: std::collections::BTreeSet<String> =
            (0..4).map(|i| format!("sluice:{{api.s{i}}}")).collect();
        assert_eq!(shards, expected);
    }

    #[test]
    fn a_route_of_split_limits_only_takes_the_shards_in_turn() {
        let keys = keys(&[KeySpec {
            shards: 12,
            ..spec("global", &["route"])
        }]);
        let h = HeaderMap::new();
        let rotation = Rotation::default();
        let tags: Vec<String> = (0..13)
            .map(|_| {
                tag(&keys
                    .build(&facts("10.0.0.1", "/", &h), &rotation)
                    .unwrap()
                    .keys[0])
            })
            .collect();
        assert_eq!(tags[0], "sluice:{api.s0}");
        assert_eq!(tags[10], "sluice:{api.s10}");
        assert_eq!(tags[12], tags[0]);
    }

    #[test]
    fn two_rotations_of_one_route_take_their_turns_apart() {
        let keys = keys(&[KeySpec {
            shards: 4,
            ..spec("global", &["route"])
        }]);
        let h = HeaderMap::new();
        let (old, new) = (Rotation::default(), Rotation::default());
        let turn = |rotation| {
            tag(&keys
                .build(&facts("10.0.0.1", "/", &h), rotation)
                .unwrap()
                .keys[0])
        };
        assert_eq!(turn(&old), "sluice:{api.s0}");
        assert_eq!(turn(&old), "sluice:{api.s1}");
        assert_eq!(
            turn(&new),
            "sluice:{api.s0}",
            "a new configuration starts its own turn"
        );
        assert_eq!(turn(&old), "sluice:{api.s2}");
    }

    #[test]
    fn a_key_no_request_changes_is_made_once_and_is_the_key_a_request_would_make() {
        let h = HeaderMap::new();
        let request = facts("10.0.0.1", "/x", &h);
        let per_route = [
            spec("global", &["route"]),
            spec("tenant", &["const:a", "route"]),
        ];
        let route = keys(&per_route);
        let built = route.build(&request, &Rotation::default()).unwrap().keys;
        let fixed: Vec<Key> = route
            .limits
            .iter()
            .map(|limit| limit.fixed().cloned().expect("fixed"))
            .collect();
        assert_eq!(fixed, built);
        // A request's part in a key, or in the route's tag, or a shard taken in turn: made per
        // request.
        for specs in [
            vec![spec("per_client", &["client_ip"])],
            vec![
                spec("global", &["route"]),
                spec("per_client", &["client_ip"]),
            ],
            vec![KeySpec {
                shards: 4,
                ..spec("global", &["route"])
            }],
        ] {
            let route = keys(&specs);
            assert!(
                route.limits.iter().any(|l| l.fixed().is_none()),
                "{specs:?}"
            );
        }
        // Split by the shared parts of constant limits: one shard, always the same, made once.
        let split = keys(&[
            spec("tenant", &["route"]),
            KeySpec {
                shards: 4,
                ..spec("global", &["route"])
            },
        ]);
        let built = split.build(&request, &Rotation::default()).unwrap().keys;
        let fixed: Vec<Key> = split
            .limits
            .iter()
            .filter_map(|l| l.fixed().cloned())
            .collect();
        assert_eq!(fixed, built);
    }

    /// A route's keys with its limits' keys, as a tier holds them.
    struct TestKeys {
        route: RouteKeys,
        limits: Vec<LimitKey>,
    }

    /// One request's keys, and which limits it skips (bit i: limit i).
    #[derive(Debug, PartialEq, Eq)]
    struct BuiltKeys {
        keys: Vec<Key>,
        skipped: u32,
    }

    impl TestKeys {
        fn new(route: RouteKeys, specs: &[KeySpec]) -> TestKeys {
            let limits = specs.iter().map(|spec| route.limit_key(spec)).collect();
            TestKeys { route, limits }
        }

        /// Every limit's key, as `Tier::records` builds them: digests, the tag, then keys.
        fn build(
            &self,
            facts: &RequestFacts<'_>,
            rotation: &Rotation,
        ) -> Result<BuiltKeys, MissingPart> {
            let digests = self
                .limits
                .iter()
                .map(|limit| self.route.digest(limit, facts))
                .collect::<Result<Vec<_>, _>>()?;
            let giver = self.limits.iter().position(LimitKey::gives_tag);
            let tag = self.route.tag(facts, giver.map(|i| &digests[i]), rotation);
            let mut built = BuiltKeys {
                keys: Vec::new(),
                skipped: 0,
            };
            for (i, limit) in self.limits.iter().enumerate() {
                built.keys.push(self.route.key(&tag, limit, &digests[i]));
                built.skipped |= u32::from(digests[i].skipped) << i;
            }
            Ok(built)
        }
    }

    fn keys(specs: &[KeySpec]) -> TestKeys {
        TestKeys::new(
            RouteKeys::new("sluice", "api", KeySecret::new("s3cret"), specs),
            specs,
        )
    }

    /// `spec` as a common limit (a top-level `limits:` entry).
    fn common(limit: &str, list: &[&str]) -> KeySpec {
        KeySpec {
            common: true,
            ..spec(limit, list)
        }
    }

    #[test]
    fn a_common_limit_is_one_key_on_every_route_and_each_call_one_slot() {
        let on = |route: &str, specs: &[KeySpec]| {
            TestKeys::new(
                RouteKeys::new("sluice", route, KeySecret::new("s3cret"), specs),
                specs,
            )
        };
        let orders = on(
            "orders",
            &[
                common("monthly", &["client_ip"]),
                spec("per_second", &["path", "client_ip"]),
            ],
        );
        let billing = on(
            "billing",
            &[
                spec("per_minute", &["client_ip"]),
                common("monthly", &["client_ip"]),
                KeySpec {
                    local: true,
                    ..spec("ceiling", &["route"])
                },
            ],
        );
        let h = HeaderMap::new();
        let text = |k: &Key| String::from_utf8(k.to_vec()).unwrap();
        let (a, b) = (facts("10.0.0.1", "/x", &h), facts("10.0.0.2", "/x", &h));
        let orders_a = orders.build(&a, &Rotation::default()).unwrap().keys;
        let billing_a = billing.build(&a, &Rotation::default()).unwrap().keys;
        let billing_b = billing.build(&b, &Rotation::default()).unwrap().keys;
        assert_eq!(orders_a[0], billing_a[1], "one bucket whichever route");
        assert_ne!(billing_a[1], billing_b[1], "one per caller");
        assert!(
            text(&orders_a[0]).starts_with("sluice:{@."),
            "{}",
            text(&orders_a[0])
        );
        assert!(text(&orders_a[0]).contains("}:@monthly:"));
        assert!(text(&orders_a[1]).contains("}:orders:per_second:"));
        assert_eq!(tag(&orders_a[0]), tag(&orders_a[1]), "one slot per call");
        assert_eq!(tag(&billing_a[0]), tag(&billing_a[1]));
        assert_ne!(tag(&billing_a[1]), tag(&billing_b[1]), "callers spread");
        // The local ceiling is not keyed on the caller: untagged, one bucket for all callers.
        assert_eq!(billing_a[2], billing_b[2]);
        assert!(text(&billing_a[2]).starts_with("sluice:{@}:billing:ceiling:"));
        // A route of its own limits only keeps the layout it always had.
        let own = on("orders", &[spec("per_second", &["path", "client_ip"])]);
        let built = own.build(&a, &Rotation::default()).unwrap().keys;
        assert!(text(&built[0]).starts_with("sluice:{orders."));
    }

    #[test]
    fn keys_are_readable_bounded_and_share_a_hash_tag() {
        let keys = keys(&[
            spec("per_client", &["client_ip", "path"]),
            spec("per_ip", &["client_ip"]),
        ]);
        let headers = HeaderMap::new();
        let hostile = format!("/{}\r\n{{}}", "a".repeat(8192));
        let built = keys
            .build(&facts("10.0.0.1", &hostile, &headers), &Rotation::default())
            .unwrap()
            .keys;
        let first = String::from_utf8(built[0].to_vec()).unwrap();
        assert!(first.starts_with("sluice:{api."), "{first}");
        assert!(first.contains("}:per_client:"), "{first}");
        assert_eq!(built[0].len(), "sluice:{api.}:per_client:".len() + 16 + 32);
        let tag = |k: &[u8]| k.split(|&b| b == b'}').next().unwrap().to_vec();
        assert_eq!(tag(&built[0]), tag(&built[1]));
    }

    /// A key names a bucket every gateway of a fleet shares, across releases: a rolling upgrade
    /// that changed a digest would split each bucket in two (and double every limit) until the
    /// last old gateway left.
    #[test]
    fn keys_stay_the_same_across_releases() {
        let by_client = keys(&[
            spec("per_client", &["client_ip", "path"]),
            spec("per_ip", &["client_ip"]),
        ]);
        let by_tenant = keys(&[spec(
            "per_tenant",
            &[
                "header:x-tenant",
                "query:api_key",
                "method",
                "host",
                "route",
                "const:v1",
            ],
        )]);
        // No limit's parts are the tag's: the tag's digest is its own.
        let by_client_and = keys(&[
            spec("per_path", &["client_ip", "path"]),
            spec("per_method", &["client_ip", "method"]),
        ]);
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant", "acme".parse().unwrap());
        let long_path = format!("/v1/{}", "p".repeat(100));
        let text = |keys: &TestKeys, path: &str, ip: &str| -> Vec<String> {
            let built = keys
                .build(&facts(ip, path, &headers), &Rotation::default())
                .unwrap()
                .keys;
            built
                .iter()
                .map(|k| String::from_utf8(k.to_vec()).unwrap())
                .collect()
        };
        assert_eq!(
            text(&by_client, "/v1/items", "10.0.0.1"),
            [
                "sluice:{api.51b2c513a9551dc4}:per_client:aa5b7a08515ecf28fb2e732b204bf8e9",
                "sluice:{api.51b2c513a9551dc4}:per_ip:51b2c513a9551dc4530ee3e63e2c5852"
            ]
        );
        assert_eq!(
            text(&by_client, &long_path, "2001:db8::7"),
            [
                "sluice:{api.24166de461d664f8}:per_client:1d6bfb9ddc5531ee4d5a3553a00e2311",
                "sluice:{api.24166de461d664f8}:per_ip:24166de461d664f8ed1b801623a414d9"
            ]
        );
        assert_eq!(
            text(&by_tenant, "/", "10.0.0.1"),
            ["sluice:{api.931473480a5d560b}:per_tenant:931473480a5d560b77ad6376b4ae0914"]
        );
        assert_eq!(
            text(&by_client_and, "/v1/items", "10.0.0.1"),
            [
                "sluice:{api.51b2c513a9551dc4}:per_path:aa5b7a08515ecf28fb2e732b204bf8e9",
                "sluice:{api.51b2c513a9551dc4}:per_method:985d99dab14aa84e48df5ad503ac6e8a"
            ]
        );
    }

    #[test]
    fn different_parts_give_different_keys_and_same_parts_the_same() {
        let keys = keys(&[spec("l", &["client_ip", "path"])]);
        let h = HeaderMap::new();
        let a = keys
            .build(&facts("10.0.0.1", "/a", &h), &Rotation::default())
            .unwrap();
        assert_eq!(
            a,
            keys.build(&facts("10.0.0.1", "/a", &h), &Rotation::default())
                .unwrap()
        );
        assert_ne!(
            a,
            keys.build(&facts("10.0.0.2", "/a", &h), &Rotation::default())
                .unwrap()
        );
        assert_ne!(
            a,
            keys.build(&facts("10.0.0.1", "/b", &h), &Rotation::default())
                .unwrap()
        );
    }

    #[test]
    fn the_secret_changes_every_digest() {
        let h = HeaderMap::new();
        let specs = [spec("l", &["client_ip"])];
        let with = |secret| {
            TestKeys::new(
                RouteKeys::new("p", "r", KeySecret::new(secret), &specs),
                &specs,
            )
        };
        let a = with("one").build(&facts("10.0.0.1", "/", &h), &Rotation::default());
        let b = with("two").build(&facts("10.0.0.1", "/", &h), &Rotation::default());
        assert_ne!(a, b);
    }

    #[test]
    fn limits_without_common_parts_share_the_route_tag() {
        let keys = keys(&[spec("a", &["client_ip"]), spec("b", &["route"])]);
        let h = HeaderMap::new();
        let built = keys
            .build(&facts("10.0.0.1", "/", &h), &Rotation::default())
            .unwrap()
            .keys;
        assert!(built.iter().all(|k| k.starts_with(b"sluice:{api}:")));
    }

    #[test]
    fn missing_parts_are_empty_or_refused() {
        let mut present = HeaderMap::new();
        present.insert("x-api-key", "".parse().unwrap());
        let missing = HeaderMap::new();
        let lenient = keys(&[spec("l", &["header:x-api-key"])]);
        assert_eq!(
            lenient.build(&facts("10.0.0.1", "/", &missing), &Rotation::default()),
            lenient.build(&facts("10.0.0.1", "/", &present), &Rotation::default())
        );
        let strict = keys(&[KeySpec {
            on_missing: OnMissing::Deny,
            ..spec("l", &["header:x-api-key", "query:api_key"])
        }]);
        assert_eq!(
            strict.build(&facts("10.0.0.1", "/", &missing), &Rotation::default()),
            Err(MissingPart)
        );
        assert!(strict
            .build(&facts("10.0.0.1", "/", &present), &Rotation::default())
            .is_ok());
        let optional = keys(&[
            spec("always", &["client_ip"]),
            KeySpec {
                on_missing: OnMissing::Skip,
                ..spec("keyed", &["header:x-api-key"])
            },
        ]);
        assert_eq!(
            optional
                .build(&facts("10.0.0.1", "/", &missing), &Rotation::default())
                .unwrap()
                .skipped,
            0b10
        );
        assert_eq!(
            optional
                .build(&facts("10.0.0.1", "/", &present), &Rotation::default())
                .unwrap()
                .skipped,
            0
        );
    }

    #[test]
    fn query_parts_read_the_first_value_decoded() {
        let value = |query, name| query_value(Some(query), name).map(|v| v.into_owned());
        assert_eq!(value("a=1&b=2&a=3", "a"), Some("1".to_string()));
        assert_eq!(value("flag&x=1", "flag"), Some(String::new()));
        assert_eq!(value("ab=1", "a"), None);
        assert_eq!(query_value(None, "a"), None);
        for spelling in [
            "tenant=acme+co",
            "tenant=acme%20co",
            "ten%61nt=acm%65%20co",
            "%74enant=acme co",
        ] {
            assert_eq!(
                value(spelling, "tenant"),
                Some("acme co".to_string()),
                "{spelling}"
            );
        }
        assert_eq!(
            value("t=%zz%4", "t"),
            Some("%zz%4".to_string()),
            "malformed escapes stay"
        );
        assert_eq!(
            value("t=%FFa", "t"),
            Some("\u{FFFD}a".to_string()),
            "a byte that is not UTF-8 reads as U+FFFD"
        );
        assert!(
            matches!(
                query_value(Some("a=plain&b=2"), "a"),
                Some(Cow::Borrowed("plain"))
            ),
            "nothing to decode, nothing copied"
        );
    }

    #[test]
    fn unknown_key_parts_are_named() {
        assert!(KeyPart::parse("cookie")
            .unwrap_err()
            .contains("unknown key part \"cookie\""));
        assert!(KeyPart::parse("header:bad name").is_err());
        assert!(KeyPart::parse("query:").is_err());
    }
}
