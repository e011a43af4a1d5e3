//! Keeping a JWKS URL's keys fresh in the background, in the shape of the upstream health
//! checks: one fetch before a snapshot goes live ([`refresh_once`]), then a task that fetches
//! every `refresh` (and early, at most once per gap, when a token names an unknown `kid`) until
//! its [`JwksRefresh`] handle is dropped or stopped. A failed fetch, or one that gives garbage,
//! leaves the last good set in force; every outcome is logged and handed to the caller's
//! counter.

use super::fetch::{self, FetchError};
use super::verify::JwtVerifier;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;

/// What one fetch did.
#[derive(Debug)]
pub enum FetchOutcome {
    /// A new set is in force (`skipped` entries of the document were not usable keys).
    Updated { keys: usize, skipped: usize },
    /// The fetch failed; the previous set (possibly empty) stays in force.
    Failed(FetchError),
}

impl FetchOutcome {
    /// Every label [`FetchOutcome::label`] gives.
    pub const LABELS: [&'static str; 5] = [
        "updated",
        "unreachable",
        "http_status",
        "too_large",
        "invalid",
    ];

    /// The metric label: `updated` or the failure's.
    pub fn label(&self) -> &'static str {
        match self {
            FetchOutcome::Updated { .. } => "updated",
            FetchOutcome::Failed(e) => e.label(),
        }
    }
}

/// Stops the background refresh when dropped (or told to).
pub struct JwksRefresh {
    stop: watch::Sender<bool>,
}

impl JwksRefresh {
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for JwksRefresh {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Fetches the verifier's JWKS URL once and installs what verifies; `None` without a URL.
pub async fn refresh_once(verifier: &JwtVerifier) -> Option<FetchOutcome> {
    let source = verifier.url_source()?;
    let outcome = match fetch::client(source) {
        Ok(client) => fetch_and_install(verifier, &client).await,
        Err(e) => FetchOutcome::Failed(e),
    };
    Some(outcome)
}

/// Starts the background refresh of `verifier` in the current runtime; `on_outcome` sees each
/// fetch's outcome (to count it). Without a JWKS URL nothing runs.
pub fn start_refresh(
    verifier: &Arc<JwtVerifier>,
    on_outcome: impl Fn(&FetchOutcome) + Send + Sync + 'static,
) -> JwksRefresh {
    let (stop, stopped) = watch::channel(false);
    if verifier.url_source().is_some() {
        tokio::spawn(refresh_until_stopped(
            Arc::clone(verifier),
            on_outcome,
            stopped,
        ));
    }
    JwksRefresh { stop }
}

async fn refresh_until_stopped(
    verifier: Arc<JwtVerifier>,
    on_outcome: impl Fn(&FetchOutcome),
    mut stop: watch::Receiver<bool>,
) {
    let Some(source) = verifier.url_source() else {
        return;
    };
    let client = match fetch::client(source) {
        Ok(client) => client,
        Err(e) => {
            let outcome = FetchOutcome::Failed(e);
            report(source.url.as_ref(), &outcome);
            on_outcome(&outcome);
            return;
        }
    };
    let gap = source.early_refresh_gap;
    let mut last_fetch = Instant::now();
    loop {
        let due = last_fetch + source.refresh;
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            _ = verifier.refresh_wanted() => {
                if !wait_for_gap(last_fetch + gap, &mut stop).await {
                    return;
                }
            }
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        last_fetch = Instant::now();
        let outcome = fetch_and_install(&verifier, &client).await;
        on_outcome(&outcome);
    }
}

/// Waits until `earliest` (the early-refresh rate limit); `false` when stopped meanwhile.
async fn wait_for_gap(earliest: Instant, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep_until(earliest) => !*stop.borrow(),
        _ = stop.changed() => false,
    }
}

async fn fetch_and_install(verifier: &JwtVerifier, client: &reqwest::Client) -> FetchOutcome {
    let Some(source) = verifier.url_source() else {
        return FetchOutcome::Failed(FetchError::Client("no JWKS URL".into()));
    };
    let outcome = match fetch::fetch(client, source).await {
        Ok(parsed) => {
            let keys = parsed.set.keys.len();
            verifier.install(parsed.set);
            FetchOutcome::Updated {
                keys,
                skipped: parsed.skipped,
            }
        }
        Err(e) => FetchOutcome::Failed(e),
    };
    report(&source.url, &outcome);
    outcome
}

fn report(url: &str, outcome: &FetchOutcome) {
    match outcome {
        FetchOutcome::Updated { keys, skipped } => {
            log::debug!("JWKS {url}: {keys} keys in force ({skipped} entries skipped)")
        }
        FetchOutcome::Failed(e) => {
            log::warn!("JWKS {url}: {e}; the last good key set stays in force")
        }
    }
}
