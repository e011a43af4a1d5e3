//! The files a configuration is built from. Every read of the configuration file and of the
//! files it names (listener certificates and keys, upstream and Redis CA bundles and client
//! certificates, secret files, the RLS directory and its files) goes through a [`Sources`] the
//! caller hands down, which notes the path and a digest of what was read — or that it could not
//! be read — and is what the caller gets back: no registry anyone could forget to take from.
//! `watch: true` (`runtime/reload.rs`) compares these notes with the files as they are now: a
//! difference is a reason to reload.
//!
//! Contents, not modification times, are compared: a Kubernetes ConfigMap or Secret volume
//! swaps its `..data` symlink to a new timestamped directory, and a file read through that link
//! changes while the link's own path and times do not; bind mounts and editors that rewrite in
//! place are seen the same way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What was seen at one path: the digest of a file's bytes, or of a directory's sorted entry
/// names; `None` when it could not be read (a file that appears later is a change too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    File(Option<u64>),
    Directory(Option<u64>),
}

impl Seen {
    /// What is at `path` now, looked at the way it was looked at before.
    fn again(self, path: &Path) -> Seen {
        match self {
            Seen::File(_) => Seen::File(std::fs::read(path).ok().map(|bytes| digest(&bytes))),
            Seen::Directory(_) => Seen::Directory(entry_names(path).ok().map(|n| names_digest(&n))),
        }
    }
}

/// The files (and directories) one configuration was built from, with what was seen in each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources(BTreeMap<PathBuf, Seen>);

impl Sources {
    /// Reads a file the configuration is built from, noting what was read.
    pub fn read(&mut self, path: &Path) -> std::io::Result<Vec<u8>> {
        let read = std::fs::read(path);
        self.note(path, Seen::File(read.as_ref().ok().map(|b| digest(b))));
        read
    }

    /// [`Sources::read`], as UTF-8 text.
    pub fn read_to_string(&mut self, path: &Path) -> std::io::Result<String> {
        let bytes = self.read(path)?;
        String::from_utf8(bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()))
    }

    /// The entries of a directory the configuration is built from, sorted, noting their names
    /// (a file added or removed is a change; each file read is noted by [`Sources::read`]).
    pub fn read_dir(&mut self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        let names = entry_names(dir);
        let seen = Seen::Directory(names.as_ref().ok().map(|n| names_digest(n)));
        self.note(dir, seen);
        Ok(names?.into_iter().map(|name| dir.join(name)).collect())
    }

    fn note(&mut self, path: &Path, seen: Seen) {
        self.0.insert(path.to_path_buf(), seen);
    }

    /// The same paths as they are now.
    pub fn now(&self) -> Sources {
        Sources(
            self.0
                .iter()
                .map(|(path, seen)| (path.clone(), seen.again(path)))
                .collect(),
        )
    }

    /// The first path whose contents differ between `self` and `other`.
    pub fn first_difference<'a>(&'a self, other: &Sources) -> Option<&'a Path> {
        self.0
            .iter()
            .find(|(path, seen)| other.0.get(*path) != Some(*seen))
            .map(|(path, _)| path.as_path())
    }

    /// `self` with what `newer` saw added or replacing what `self` saw.
    pub fn merge(&mut self, newer: Sources) {
        self.0.extend(newer.0);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, path: &Path) -> bool {
        self.0.contains_key(path)
    }
}

fn entry_names(dir: &Path) -> std::io::Result<Vec<std::ffi::OsString>> {
    let mut names = std::fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<std::io::Result<Vec<_>>>()?;
    names.sort();
    Ok(names)
}

fn digest(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

fn names_digest(names: &[std::ffi::OsString]) -> u64 {
    let mut joined = Vec::new();
    for name in names {
        joined.extend_from_slice(name.as_encoded_bytes());
        joined.push(0);
    }
    digest(&joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_file_is_noted_and_a_change_of_its_contents_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, "one").unwrap();
        let mut seen = Sources::default();
        assert_eq!(seen.read_to_string(&file).unwrap(), "one");
        assert_eq!(seen.len(), 1);
        assert_eq!(seen.first_difference(&seen.now()), None);
        std::fs::write(&file, "two").unwrap();
        assert_eq!(seen.first_difference(&seen.now()), Some(file.as_path()));
    }

    #[test]
    fn a_file_that_could_not_be_read_is_a_change_once_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("later.pem");
        let mut seen = Sources::default();
        assert!(seen.read(&file).is_err());
        assert_eq!(seen.first_difference(&seen.now()), None);
        std::fs::write(&file, "pem").unwrap();
        assert_eq!(seen.first_difference(&seen.now()), Some(file.as_path()));
    }

    #[test]
    fn a_symlink_swap_like_the_kubelets_is_seen_through_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        for (version, text) in [("..v1", "limit: 1"), ("..v2", "limit: 2")] {
            std::fs::create_dir(at(version)).unwrap();
            std::fs::write(at(version).join("sluice.yaml"), text).unwrap();
        }
        std::os::unix::fs::symlink("..v1", at("..data")).unwrap();
        std::os::unix::fs::symlink("..data/sluice.yaml", at("sluice.yaml")).unwrap();
        let mut seen = Sources::default();
        seen.read(&at("sluice.yaml")).unwrap();
        std::os::unix::fs::symlink("..v2", at("..data_tmp")).unwrap();
        std::fs::rename(at("..data_tmp"), at("..data")).unwrap();
        assert_eq!(
            seen.first_difference(&seen.now()),
            Some(at("sluice.yaml").as_path())
        );
    }

    #[test]
    fn a_directory_is_noted_by_its_entries() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), "a").unwrap();
        let mut seen = Sources::default();
        let listed = seen.read_dir(dir.path()).unwrap();
        assert_eq!(listed, vec![dir.path().join("a.yaml")]);
        assert_eq!(seen.first_difference(&seen.now()), None);
        std::fs::write(dir.path().join("b.yaml"), "b").unwrap();
        assert_eq!(seen.first_difference(&seen.now()), Some(dir.path()));
    }

    #[test]
    fn merging_keeps_what_only_the_older_saw() {
        let older = Sources(BTreeMap::from([
            (PathBuf::from("/a"), Seen::File(Some(1))),
            (PathBuf::from("/b"), Seen::File(Some(2))),
        ]));
        let mut merged = older.clone();
        merged.merge(Sources(BTreeMap::from([(
            PathBuf::from("/a"),
            Seen::File(Some(3)),
        )])));
        assert_eq!(merged.first_difference(&older), Some(Path::new("/a")));
        assert_eq!(merged.len(), 2);
    }
}
