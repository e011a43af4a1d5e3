//! Relative paths in the file, made absolute once, when the file is compiled.
//!
//! A relative certificate, key, CA or password file, pid file, upgrade socket or error log is
//! taken from the directory sluice was started in (as a relative path always was, before
//! `sluice -d` moved to `/`); `rls.config_dir` from the configuration file's directory. Both are
//! resolved at compile time, so a later change of directory (daemonizing) changes nothing: a
//! reload reads the same files start read.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static START_DIRECTORY: OnceLock<PathBuf> = OnceLock::new();

/// The directory sluice was started in: the working directory the first time this is asked
/// (`main` asks before anything can change it).
pub fn start_directory() -> &'static Path {
    START_DIRECTORY.get_or_init(|| std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")))
}

/// `path`, from the start directory when it is relative.
pub fn absolute(path: impl AsRef<Path>) -> PathBuf {
    let path = path.as_ref();
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        start_directory().join(path)
    }
}

/// `path` as text, from the start directory when it is relative.
pub fn absolute_text(path: &str) -> String {
    absolute(path).to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_taken_from_the_start_directory() {
        assert_eq!(absolute("/etc/a.pem"), PathBuf::from("/etc/a.pem"));
        assert_eq!(
            absolute("certs/a.pem"),
            start_directory().join("certs/a.pem")
        );
        assert!(absolute("a").is_absolute());
    }
}
