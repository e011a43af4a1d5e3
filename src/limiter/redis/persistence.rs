//! What Redis keeps across a restart, read from every master (the one server, the master the
//! Sentinels name, each master of a Cluster): an append-only file (`INFO persistence`'s
//! `aof_enabled`), RDB snapshots (`CONFIG GET save` names save points), or nothing — a restart
//! then starts empty, and every count with it, monthly quotas and the quota admin API's
//! overrides included. A master that will not say (`CONFIG` renamed or refused, as managed
//! Redis services often do) is "cannot tell". Read on demand (`RedisLimiter::persistence`),
//! never on the request path; what it means for the configuration's quotas is the runtime's to
//! say (`runtime::durability`).

use std::collections::HashMap;
use std::fmt;

use redis::Value;

/// What one master keeps across a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// An append-only file (`appendonly yes`): every write, up to its fsync policy.
    AppendOnlyFile,
    /// RDB snapshots only (`save` points): the writes since the last snapshot are lost.
    Snapshots,
    /// Neither: a restart starts empty.
    Nothing,
    /// It would not say: why, in words.
    CannotTell(String),
}

impl Kept {
    /// What `INFO persistence` (its text) and `CONFIG GET save` (its reply) said, each as
    /// answered or refused (in words).
    pub fn of(info: Result<&str, &str>, save: Result<&Value, &str>) -> Kept {
        let aof = match info {
            Ok(text) => text.lines().any(|line| line.trim() == "aof_enabled:1"),
            Err(why) => return Kept::CannotTell(format!("INFO persistence refused: {why}")),
        };
        if aof {
            return Kept::AppendOnlyFile;
        }
        let points =
            save.map_err(|why| Kept::CannotTell(format!("CONFIG GET save refused: {why}")));
        let points = match points {
            Ok(reply) => redis::from_redis_value::<HashMap<String, String>>(reply.clone())
                .ok()
                .and_then(|config| config.get("save").cloned()),
            Err(cannot) => return cannot,
        };
        match points {
            Some(points) if points.trim().is_empty() => Kept::Nothing,
            Some(_) => Kept::Snapshots,
            None => Kept::CannotTell("CONFIG GET save named no save setting".into()),
        }
    }
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kept::AppendOnlyFile => f.write_str("keeps an append-only file"),
            Kept::Snapshots => f.write_str("keeps RDB snapshots only"),
            Kept::Nothing => f.write_str("runs without persistence (neither AOF nor RDB)"),
            Kept::CannotTell(why) => write!(f, "cannot tell whether it persists ({why})"),
        }
    }
}

/// What every master keeps, as one reading found it: each master by its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    pub masters: Vec<(String, Kept)>,
}

impl Persistence {
    /// The masters that lose everything on a restart, or cannot tell whether they do.
    pub fn at_risk(&self) -> impl Iterator<Item = &(String, Kept)> {
        self.masters
            .iter()
            .filter(|(_, kept)| matches!(kept, Kept::Nothing | Kept::CannotTell(_)))
    }

    /// Whether every master keeps what it holds (an append-only file or snapshots).
    pub fn kept(&self) -> bool {
        self.at_risk().next().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(points: &str) -> Value {
        Value::Array(vec![
            Value::BulkString(b"save".to_vec()),
            Value::BulkString(points.as_bytes().to_vec()),
        ])
    }

    #[test]
    fn a_master_keeps_its_append_only_file_its_snapshots_or_nothing() {
        let aof = "# Persistence\r\nloading:0\r\naof_enabled:1\r\n";
        let none = "# Persistence\r\nloading:0\r\naof_enabled:0\r\n";
        let refused = Err("ERR unknown command 'CONFIG'");
        assert_eq!(Kept::of(Ok(aof), refused), Kept::AppendOnlyFile);
        assert_eq!(Kept::of(Ok(none), Ok(&save(""))), Kept::Nothing);
        assert_eq!(
            Kept::of(Ok(none), Ok(&save("3600 1 300 100"))),
            Kept::Snapshots
        );
        assert!(
            matches!(Kept::of(Ok(none), refused), Kept::CannotTell(why) if why.contains("CONFIG GET save refused"))
        );
        assert!(matches!(
            Kept::of(Err("NOPERM"), Ok(&save(""))),
            Kept::CannotTell(_)
        ));
        let map = Value::Map(vec![(
            Value::BulkString(b"save".to_vec()),
            Value::BulkString(Vec::new()),
        )]);
        assert_eq!(
            Kept::of(Ok(none), Ok(&map)),
            Kept::Nothing,
            "RESP3 answers a map"
        );
        let reading = Persistence {
            masters: vec![
                ("a".into(), Kept::AppendOnlyFile),
                ("b".into(), Kept::Nothing),
            ],
        };
        assert!(!reading.kept());
        assert_eq!(reading.at_risk().count(), 1);
    }
}
