//! Finding a request's route without trying every route: a byte trie of the path prefixes and a
//! map of the exact paths, each ending in the routes it names grouped by exact host. A lookup
//! walks the request's path once and reads only the routes whose path and exact host could
//! match, so its cost grows with the path's length and the routes that share its prefixes, not
//! with the size of the table. The route chosen is the one the ordered scan would choose (the
//! table's order: most specific first, then file order), which a property test holds it to.

use std::collections::HashMap;

/// Routes (by their position in the table's order) whose path condition ends at one place,
/// by host: those with an exact host under it, the others (a wildcard host, or none) apart.
#[derive(Debug, Default)]
struct Bucket {
    by_host: HashMap<Box<str>, Vec<u32>>,
    any_host: Vec<u32>,
}

impl Bucket {
    fn add(&mut self, position: u32, host: Option<&str>) {
        match host {
            Some(host) => self.by_host.entry(host.into()).or_default().push(position),
            None => self.any_host.push(position),
        }
    }

    /// The routes here a request for `host` may match, in the table's order within each part.
    fn candidates<'a>(&'a self, host: &str) -> impl Iterator<Item = u32> + 'a {
        let exact = self.by_host.get(host).map_or(&[][..], Vec::as_slice);
        exact.iter().chain(&self.any_host).copied()
    }
}

/// One node of the prefix trie: its children by next byte (sorted), and the routes whose
/// prefix ends here.
#[derive(Debug, Default)]
struct Node {
    children: Vec<(u8, u32)>,
    ends: Option<Box<Bucket>>,
}

/// What a route's path and host conditions are, as the index reads them.
pub struct Entry<'a> {
    /// Its place in the table's order.
    pub position: u32,
    pub path: PathKind<'a>,
    /// An exact host (lowercased); `None` for a wildcard host or none.
    pub exact_host: Option<&'a str>,
}

pub enum PathKind<'a> {
    Exact(&'a str),
    Prefix(&'a str),
}

#[derive(Debug)]
pub struct RouteIndex {
    /// The trie; its root, the empty prefix, is always there (a lookup starts at it).
    nodes: Vec<Node>,
    exact: HashMap<Box<str>, Bucket>,
}

/// The index of no routes: a root and nothing under it.
impl Default for RouteIndex {
    fn default() -> RouteIndex {
        RouteIndex::new([])
    }
}

impl RouteIndex {
    pub fn new<'a>(entries: impl IntoIterator<Item = Entry<'a>>) -> RouteIndex {
        let mut index = RouteIndex {
            nodes: vec![Node::default()],
            exact: HashMap::new(),
        };
        for entry in entries {
            let bucket = match entry.path {
                PathKind::Exact(path) => index.exact.entry(path.into()).or_default(),
                PathKind::Prefix(prefix) => {
                    let node = index.node_for(prefix.as_bytes());
                    index.nodes[node].ends.get_or_insert_default()
                }
            };
            bucket.add(entry.position, entry.exact_host);
        }
        index
    }

    /// The trie node reached by `prefix`, made as needed.
    fn node_for(&mut self, prefix: &[u8]) -> usize {
        let mut at = 0;
        for &byte in prefix {
            at = match self.child(at, byte) {
                Ok(child) => child,
                Err(slot) => {
                    let child = self.nodes.len();
                    self.nodes.push(Node::default());
                    self.nodes[at].children.insert(slot, (byte, child as u32));
                    child
                }
            };
        }
        at
    }

    /// The child of `node` by `byte`, or where it would go among the children.
    fn child(&self, node: usize, byte: u8) -> Result<usize, usize> {
        let children = &self.nodes[node].children;
        children
            .binary_search_by_key(&byte, |&(b, _)| b)
            .map(|i| children[i].1 as usize)
    }

    /// Every route a request for `host` and `path` may match, by position (not in order): those
    /// whose exact path is `path` or whose prefix starts it, under `host` or any host. The
    /// caller checks each one's full conditions and keeps the first in the table's order.
    pub fn candidates<'a>(
        &'a self,
        host: &'a str,
        path: &'a str,
    ) -> impl Iterator<Item = u32> + 'a {
        let exact = self.exact.get(path).into_iter();
        let prefixes = self.walk(path.as_bytes());
        exact
            .chain(prefixes)
            .flat_map(move |bucket| bucket.candidates(host))
    }

    /// The buckets of the prefixes of `path`, shortest first.
    fn walk<'a>(&'a self, path: &'a [u8]) -> impl Iterator<Item = &'a Bucket> + 'a {
        let mut at = Some(0usize);
        let mut bytes = path.iter();
        std::iter::from_fn(move || loop {
            let node = at?;
            at = bytes.next().and_then(|&byte| self.child(node, byte).ok());
            if let Some(bucket) = &self.nodes[node].ends {
                return Some(&**bucket);
            }
        })
    }
}
