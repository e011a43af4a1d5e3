//! The quota admin API's audit log: one JSON line per write (who, what, before and after, the
//! result), appended to `admin.audit_log` or written to stdout, and counted in
//! `sluice_admin_changes_total{action,result}`. The API writes a line for every call it takes
//! (`edge::quota_admin`); the gateways write one for each override they restore after Redis
//! lost it (`runtime::overrides`).
//!
//! An [`AuditLog`] is opened with each configuration (`exchange::site::Site`) and keeps its file
//! open; SIGUSR1 and every reload open the path again by name, as for the access log: logrotate
//! moves the file, signals, and the next line starts the new one. A line is written off the
//! async workers (`spawn_blocking`), whole, under the log's lock, and the write has ended when
//! [`AuditLog::write`] returns: an admin call is answered after its line is written.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{json, Map, Value};

use super::metrics::ADMIN_CHANGES;

/// Where the audit lines of one configuration go; cloned handles share the file.
#[derive(Clone)]
pub struct AuditLog {
    output: Arc<Mutex<Output>>,
}

/// Stdout, or a file by name and what is open of it (`None` while it cannot be opened: each
/// line tries again, and is logged instead).
enum Output {
    Stdout,
    File(PathBuf, Option<File>),
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl AuditLog {
    /// The audit log at `path` (stdout when `None`), opened for appending now. A file that
    /// cannot be opened is said in the log; each line tries again (and is logged while it
    /// cannot be written).
    pub fn open(path: Option<&Path>) -> AuditLog {
        let output = match path {
            None => Output::Stdout,
            Some(path) => {
                let file = append(path)
                    .inspect_err(|e| {
                        log::error!(
                            "quota admin: cannot open the audit log {} for appending ({e}); each line tries again, and is logged while it cannot be written",
                            path.display()
                        );
                    })
                    .ok();
                Output::File(path.to_path_buf(), file)
            }
        };
        AuditLog {
            output: Arc::new(Mutex::new(output)),
        }
    }

    /// Counts a change and writes its audit line: `line` with the time, `audit`, `action` and
    /// `result`. Returns once the line is written (off the async workers); a line that cannot
    /// be written is logged instead, whole.
    pub async fn write(&self, action: &str, result: &str, line: Map<String, Value>) {
        ADMIN_CHANGES.with_label_values(&[action, result]).inc();
        let text: Arc<str> = audit_line(action, result, line).into();
        let output = Arc::clone(&self.output);
        let line = Arc::clone(&text);
        let written = tokio::task::spawn_blocking(move || write_line(&output, &line)).await;
        let error = match written {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(e) => format!("its writer ended: {e}"),
        };
        log::error!(
            "quota admin: cannot write the audit line ({error}): {}",
            text.trim_end()
        );
    }

    /// Opens the file again by name (off the async workers), after the lines being written;
    /// stdout has nothing to open. Returns once it is open, or said in the log why not.
    pub async fn reopen(&self) {
        let output = Arc::clone(&self.output);
        if let Err(e) = tokio::task::spawn_blocking(move || reopen(&output)).await {
            log::error!("quota admin: cannot open the audit log again: its opener ended: {e}");
        }
    }
}

/// The JSON text of an audit line, newline-ended: `line` with the time, `audit`, `action` and
/// `result`.
fn audit_line(action: &str, result: &str, mut line: Map<String, Value>) -> String {
    line.insert(
        "time".into(),
        json!(format!("{:.3}", jiff::Timestamp::now())),
    );
    line.insert("audit".into(), json!("quota"));
    line.insert("action".into(), json!(action));
    line.insert("result".into(), json!(result));
    let mut text = Value::Object(line).to_string();
    text.push('\n');
    text
}

/// Writes `text` whole under the log's lock (blocking): no two lines interleave. A file that
/// is not open is opened first.
fn write_line(output: &Mutex<Output>, text: &str) -> io::Result<()> {
    let mut output = output.lock().unwrap_or_else(PoisonError::into_inner);
    match &mut *output {
        Output::Stdout => io::stdout().lock().write_all(text.as_bytes()),
        Output::File(path, file) => {
            let open = match file {
                Some(open) => open,
                None => file.insert(append(path).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display()))
                })?),
            };
            open.write_all(text.as_bytes())
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
        }
    }
}

/// Opens the file again by name (blocking); one that cannot be opened keeps the old one.
fn reopen(output: &Mutex<Output>) {
    let path = match &*output.lock().unwrap_or_else(PoisonError::into_inner) {
        Output::Stdout => return,
        Output::File(path, _) => path.clone(),
    };
    match append(&path) {
        Ok(opened) => {
            if let Output::File(_, file) =
                &mut *output.lock().unwrap_or_else(PoisonError::into_inner)
            {
                *file = Some(opened);
            }
        }
        Err(e) => log::error!(
            "quota admin: cannot open the audit log {} again, still writing the old file: {e}",
            path.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of the file at `path`, as JSON.
    fn lines(path: &Path) -> Vec<Value> {
        let text = std::fs::read_to_string(path).expect("the audit file");
        text.lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    }

    fn written(n: u64) -> Map<String, Value> {
        let mut line = Map::new();
        line.insert("n".into(), json!(n));
        line
    }

    #[tokio::test]
    async fn a_reopen_after_a_rename_starts_the_new_file_and_keeps_the_old_lines() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (path, rotated) = (dir.path().join("audit.jsonl"), dir.path().join("audit.1"));
        let log = AuditLog::open(Some(&path));
        log.write("reset", "applied", written(1)).await;
        log.write("credit", "applied", written(2)).await;
        std::fs::rename(&path, &rotated).expect("rotated");
        log.reopen().await;
        assert!(path.exists(), "opened again by name");
        log.write("reset", "refused", written(3)).await;
        let old = lines(&rotated);
        let numbers = |lines: &[Value]| lines.iter().map(|l| l["n"].clone()).collect::<Vec<_>>();
        assert_eq!(numbers(&old), [json!(1), json!(2)], "{old:?}");
        assert_eq!(
            (&old[1]["action"], &old[1]["audit"]),
            (&json!("credit"), &json!("quota"))
        );
        let new = lines(&path);
        assert_eq!(numbers(&new), [json!(3)], "{new:?}");
        assert_eq!(new[0]["result"], "refused");
    }

    #[tokio::test]
    async fn lines_written_at_once_never_interleave() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(Some(&path));
        let long = "x".repeat(64 << 10);
        let writes = (0..16).map(|n| {
            let (log, long) = (log.clone(), long.clone());
            tokio::spawn(async move {
                let mut line = written(n);
                line.insert("long".into(), json!(long));
                log.write("reset", "applied", line).await;
            })
        });
        for write in writes.collect::<Vec<_>>() {
            write.await.expect("a write");
        }
        let mut numbers: Vec<u64> = lines(&path)
            .iter()
            .map(|line| line["n"].as_u64().expect("n"))
            .collect();
        numbers.sort_unstable();
        assert_eq!(
            numbers,
            (0..16).collect::<Vec<_>>(),
            "every line whole, once"
        );
    }

    #[tokio::test]
    async fn a_file_that_cannot_be_opened_yet_is_opened_by_the_next_line() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("later").join("audit.jsonl");
        let log = AuditLog::open(Some(&path));
        log.write("reset", "applied", written(1)).await;
        assert!(
            !path.exists(),
            "no directory yet: the line is logged instead"
        );
        std::fs::create_dir(dir.path().join("later")).expect("the directory");
        log.write("reset", "applied", written(2)).await;
        let new = lines(&path);
        assert_eq!((new.len(), &new[0]["n"]), (1, &json!(2)), "{new:?}");
    }
}
