//! The quota admin API's audit log: one JSON line per write (who, what, before and after, the
//! result), appended to `admin.audit_log` or written to stdout, and counted in
//! `sluice_admin_changes_total{action,result}`. The API writes a line for every call it takes
//! (`edge::quota_admin`); the gateways write one for each override they restore after Redis
//! lost it (`runtime::overrides`).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use serde_json::{json, Map, Value};

use super::metrics::ADMIN_CHANGES;

/// Counts a change and writes its audit line to `path` (stdout when `None`): `line` with the
/// time, `audit`, `action` and `result`. A line that cannot be written is logged instead.
pub fn write(path: Option<&Path>, action: &str, result: &str, mut line: Map<String, Value>) {
    ADMIN_CHANGES.with_label_values(&[action, result]).inc();
    line.insert(
        "time".into(),
        json!(format!("{:.3}", jiff::Timestamp::now())),
    );
    line.insert("audit".into(), json!("quota"));
    line.insert("action".into(), json!(action));
    line.insert("result".into(), json!(result));
    let mut text = Value::Object(line).to_string();
    text.push('\n');
    let written = match path {
        Some(path) => OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| file.write_all(text.as_bytes())),
        None => std::io::stdout().lock().write_all(text.as_bytes()),
    };
    if let Err(e) = written {
        log::error!(
            "quota admin: cannot write the audit line ({e}): {}",
            text.trim_end()
        );
    }
}
