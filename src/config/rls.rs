//! The `rls:` section: Envoy's rate limit service on a listener of its own, limits read from a
//! directory of envoyproxy/ratelimit configuration files.

use std::net::SocketAddr;
use std::path::Path;

use super::choice::{AlgorithmName, Spelled};
use super::listeners::socket_addr;
use super::problem::Problems;
use super::raw::RawRls;
use super::rls_files::Sharing;
use super::sources::Sources;
use crate::limiter::FailureMode;
use crate::route::descriptors::Domains;

/// `rls:`, compiled: where it listens and the domains it serves.
#[derive(Debug)]
pub struct RlsSettings {
    pub listen: SocketAddr,
    pub domains: Domains,
    pub failure_mode: FailureMode,
    /// The key prefix and secret of every counter key (those of the configuration).
    pub key_prefix: String,
    pub secret: (u64, u64),
    /// Gateways sharing the limits, for `failure_mode: local`.
    pub instances: u64,
    /// Answers carry `dynamic_metadata` as envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA`:
    /// the call's domain, descriptors and hits, and the `metadata` of its passing descriptors.
    pub response_dynamic_metadata: bool,
}

pub struct RlsDefaults<'a> {
    pub failure_mode: FailureMode,
    pub key_prefix: &'a str,
    pub secret: (u64, u64),
    pub instances: u64,
    /// The configuration file's directory: a relative `config_dir` is taken from there.
    pub base: &'a Path,
}

pub fn compile(
    raw: Option<RawRls>,
    defaults: RlsDefaults,
    p: &mut Problems,
    read: &mut Sources,
) -> Option<RlsSettings> {
    let raw = raw?;
    let listen = match raw.listen {
        Some(text) => socket_addr(&text, "rls.listen", p),
        None => {
            p.add("rls.listen", "required: the address of the gRPC listener");
            None
        }
    };
    let algorithm = raw
        .algorithm
        .unwrap_or(Spelled::Known(AlgorithmName::FixedWindow));
    let failure_mode = match &raw.failure_mode {
        Some(mode) => mode.known("rls.failure_mode", p),
        None => Some(defaults.failure_mode),
    };
    let sharing = Sharing {
        instances: defaults.instances,
    };
    let domains = match raw.config_dir {
        Some(dir) => super::rls_files::load(&defaults.base.join(dir), &algorithm, sharing, p, read),
        None => {
            p.add(
                "rls.config_dir",
                "required: the directory of envoyproxy/ratelimit YAML files",
            );
            Domains::default()
        }
    };
    Some(RlsSettings {
        listen: listen?,
        domains,
        failure_mode: failure_mode?,
        key_prefix: defaults.key_prefix.to_string(),
        secret: defaults.secret,
        instances: defaults.instances,
        response_dynamic_metadata: raw.response_dynamic_metadata.unwrap_or(false),
    })
}
