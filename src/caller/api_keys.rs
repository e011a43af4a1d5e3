//! API keys: the store of hashed keys (SHA-256, never the keys themselves), verifying a key a
//! caller presents in a header and naming its consumer, plan and whether it was revoked.
//!
//! Keys are high-entropy secrets that sluice generates (`sluice gen-key`), so a fast unsalted
//! SHA-256 is enough to keep them unreadable at rest (docs/consumers.md says why no
//! password hash and no keyed hash). Verifying hashes the presented key once, finds the stored
//! hashes that share the first bits of that digest (about one), and compares each whole digest
//! in constant time (`subtle`): the time taken tells a caller nothing about how near its key
//! is to a stored one.
//!
//! The store is compact, since a file may hold a million keys: 52 to 56 bytes a key (its hash,
//! its consumer's and plan's places in tables that hold each once, its index in the file, and
//! where its run of hashes starts), plus each distinct consumer id once. The file is read and
//! checked by `config::api_key_file`; this module knows no YAML.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use http::header::{HeaderMap, HeaderName};
use subtle::ConstantTimeEq;

/// How a stored hash is written: `sha256:` and 64 hex digits.
pub const HASH_PREFIX: &str = "sha256:";
/// The shortest key `sluice hash-key` hashes: shorter keys can be guessed from their hash.
pub const MIN_KEY_LEN: usize = 20;
/// The longest key read from a request; a longer header value is refused unhashed.
pub const MAX_KEY_LEN: usize = 256;
/// The longest consumer id: it becomes a key part and a field of the access log.
pub const MAX_CONSUMER_LEN: usize = 128;
/// The header a key is read from when the configuration names none.
pub const DEFAULT_HEADER: &str = "x-api-key";

/// The SHA-256 of a key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash([u8; 32]);

impl KeyHash {
    /// The hash of `key`.
    pub fn of(key: &[u8]) -> KeyHash {
        let digest = ring::digest::digest(&ring::digest::SHA256, key);
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(digest.as_ref());
        KeyHash(bytes)
    }

    /// Reads `sha256:` and 64 hex digits (either case), as [`KeyHash`]'s `Display` writes it.
    pub fn parse(text: &str) -> Result<KeyHash, String> {
        let explain = || {
            format!(
                "invalid hash {:?}: expected {HASH_PREFIX} and 64 hex digits, as `sluice hash-key` prints",
                shorten(text)
            )
        };
        let hex = text.strip_prefix(HASH_PREFIX).ok_or_else(explain)?;
        if hex.len() != 64 {
            return Err(explain());
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
            let (Some(high), Some(low)) = (hex_value(pair[0]), hex_value(pair[1])) else {
                return Err(explain());
            };
            *byte = high << 4 | low;
        }
        Ok(KeyHash(bytes))
    }

    /// The first 8 bytes, in the order the store sorts hashes by.
    fn prefix(&self) -> u64 {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(first)
    }
}

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(HASH_PREFIX)?;
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// At most 80 characters of `text`, for messages.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(80) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

/// A key to store: its consumer, its plan as the file names it (`None`: the default plan),
/// and whether it is revoked.
#[derive(Debug, Clone, Copy)]
pub struct NewKey<'a> {
    pub consumer: &'a str,
    pub plan: Option<&'a str>,
    pub disabled: bool,
}

/// What a verified key says about its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiKey<'a> {
    /// One customer across all of their keys: the keys of one consumer share one `Arc`.
    pub consumer: &'a Arc<str>,
    /// The consumer's plan as written in the file; `None` is the default plan.
    pub plan: Option<&'a str>,
    /// A revoked key: verified, then refused (403), so the caller learns it was revoked.
    pub disabled: bool,
}

/// [`Entry::plan`] of a key on the default plan.
const DEFAULT_PLAN: u32 = u32::MAX;

/// One stored key in 48 bytes: its hash, its consumer's and its plan's places in the store's
/// tables, and its index in the file.
#[derive(Debug)]
struct Entry {
    hash: KeyHash,
    consumer: u32,
    plan: u32,
    index: u32,
    disabled: bool,
}

/// The keys of a file as they are added, for [`KeysBuilder::build`].
#[derive(Debug, Default)]
pub struct KeysBuilder {
    entries: Vec<Entry>,
    consumers: Vec<Arc<str>>,
    consumer_at: HashMap<Arc<str>, u32>,
    plans: Vec<Box<str>>,
}

impl KeysBuilder {
    /// Adds the key whose hash is `hash`, `index`th in the file. A hash added twice keeps the
    /// key of the lower index (the file's reader refuses such a file first).
    pub fn add(&mut self, hash: KeyHash, key: NewKey<'_>, index: usize) {
        let consumer = self.consumer(key.consumer);
        let plan = key.plan.map_or(DEFAULT_PLAN, |plan| self.plan(plan));
        self.entries.push(Entry {
            hash,
            consumer,
            plan,
            index: u32::try_from(index).unwrap_or(u32::MAX),
            disabled: key.disabled,
        });
    }

    /// The place of consumer `id`, stored once.
    fn consumer(&mut self, id: &str) -> u32 {
        if let Some(&at) = self.consumer_at.get(id) {
            return at;
        }
        let at = table_place(self.consumers.len());
        let id: Arc<str> = id.into();
        self.consumers.push(Arc::clone(&id));
        self.consumer_at.insert(id, at);
        at
    }

    /// The place of plan `name`, stored once (a file names few plans).
    fn plan(&mut self, name: &str) -> u32 {
        match self.plans.iter().position(|plan| &**plan == name) {
            Some(at) => table_place(at),
            None => {
                self.plans.push(name.into());
                table_place(self.plans.len() - 1)
            }
        }
    }

    /// The store: the keys sorted by hash and their runs found, without the room and the
    /// index building needed.
    pub fn build(self) -> ApiKeys {
        let mut entries = self.entries;
        entries.sort_unstable_by(|a, b| a.hash.0.cmp(&b.hash.0).then(a.index.cmp(&b.index)));
        entries.dedup_by(|later, first| later.hash == first.hash);
        let bits = entries.len().next_power_of_two().trailing_zeros().min(32);
        let mut starts = vec![0u32; (1usize << bits) + 1];
        for entry in &entries {
            starts[run(entry.hash.prefix(), bits) + 1] += 1;
        }
        for at in 1..starts.len() {
            starts[at] += starts[at - 1];
        }
        ApiKeys {
            entries: entries.into_boxed_slice(),
            bits,
            starts: starts.into_boxed_slice(),
            consumers: self.consumers.into_boxed_slice(),
            plans: self.plans.into_boxed_slice(),
        }
    }
}

/// The run of a hash whose first 8 bytes are `prefix`: its first `bits` bits.
fn run(prefix: u64, bits: u32) -> usize {
    prefix.checked_shr(64 - bits).unwrap_or(0) as usize
}

/// A place in one of the store's tables; a table never holds more than a file's keys.
fn table_place(at: usize) -> u32 {
    u32::try_from(at).expect("fewer than 2^32 keys in a file")
}

/// Every key of the file, sorted by hash, in runs by the first `bits` bits of their hashes:
/// run `r` is `entries[starts[r]..starts[r + 1]]`. There are as many runs as keys, rounded up
/// to a power of two (4 to 8 bytes a key), so a run holds about one key and finding a key
/// reads one run: no search.
#[derive(Debug, Default)]
pub struct ApiKeys {
    entries: Box<[Entry]>,
    bits: u32,
    starts: Box<[u32]>,
    consumers: Box<[Arc<str>]>,
    plans: Box<[Box<str>]>,
}

impl ApiKeys {
    /// The key `presented` by a caller, if it is stored (disabled or not).
    pub fn verify(&self, presented: &[u8]) -> Option<ApiKey<'_>> {
        self.find(&KeyHash::of(presented))
            .map(|entry| self.key(entry))
    }

    /// The stored key with hash `hash`: every stored hash of its run is compared whole, in
    /// constant time.
    fn find(&self, hash: &KeyHash) -> Option<&Entry> {
        let run = run(hash.prefix(), self.bits);
        let (Some(&from), Some(&to)) = (self.starts.get(run), self.starts.get(run + 1)) else {
            return None;
        };
        let mut found = None;
        for entry in &self.entries[from as usize..to as usize] {
            if bool::from(entry.hash.0.ct_eq(&hash.0)) {
                found = Some(entry);
            }
        }
        found
    }

    fn key(&self, entry: &Entry) -> ApiKey<'_> {
        ApiKey {
            consumer: &self.consumers[entry.consumer as usize],
            plan: self.plans.get(entry.plan as usize).map(|plan| &**plan),
            disabled: entry.disabled,
        }
    }

    /// How many keys are stored.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every stored key, with its index in the file, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = (usize, ApiKey<'_>)> {
        self.entries
            .iter()
            .map(|entry| (entry.index as usize, self.key(entry)))
    }
}

/// A consumer id: 1 to [`MAX_CONSUMER_LEN`] visible ASCII characters (no spaces, no control
/// characters), since it becomes a key part and a field of the access log.
pub fn check_consumer(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("empty: name the consumer".to_string());
    }
    if id.len() > MAX_CONSUMER_LEN {
        return Err(format!(
            "{} bytes: a consumer id has at most {MAX_CONSUMER_LEN}",
            id.len()
        ));
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "invalid consumer id {:?}: use visible ASCII characters, without spaces",
            shorten(id)
        ));
    }
    Ok(())
}

/// Why the key header of a request cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresentedKeyError {
    /// The header occurs more than once: which key would be meant is not clear.
    Repeated,
    /// The value is longer than [`MAX_KEY_LEN`]: no issued key is.
    TooLong,
}

impl PresentedKeyError {
    /// A metric label.
    pub fn kind(self) -> &'static str {
        match self {
            PresentedKeyError::Repeated => "repeated_key_header",
            PresentedKeyError::TooLong => "oversize_key",
        }
    }
}

impl fmt::Display for PresentedKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PresentedKeyError::Repeated => f.write_str("the API key header is repeated"),
            PresentedKeyError::TooLong => {
                write!(f, "the API key is longer than {MAX_KEY_LEN} bytes")
            }
        }
    }
}

/// The key presented in header `name`: `None` when the header is absent, an error when it is
/// repeated or too long to be a key. The bytes are read in place.
pub fn presented_key<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'a [u8]>, PresentedKeyError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(PresentedKeyError::Repeated);
    }
    if value.len() > MAX_KEY_LEN {
        return Err(PresentedKeyError::TooLong);
    }
    Ok(Some(value.as_bytes()))
}

/// A new key: `sk_` and 32 random bytes in unpadded base64url (46 characters), from the
/// operating system's generator (ring's `SystemRandom`, which reads `getrandom`).
pub fn generate_key() -> Result<String, String> {
    use base64::Engine as _;
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "the operating system's random generator failed".to_string())?;
    Ok(format!(
        "sk_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// Whether `key` may be issued (`sluice hash-key`): [`MIN_KEY_LEN`] to [`MAX_KEY_LEN`] visible
/// ASCII characters, which a header carries unchanged.
pub fn check_new_key(key: &[u8]) -> Result<(), String> {
    if key.len() < MIN_KEY_LEN {
        return Err(format!(
            "the key has {} bytes: use at least {MIN_KEY_LEN} (`sluice gen-key` makes one)",
            key.len()
        ));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(format!(
            "the key has {} bytes: a request may present at most {MAX_KEY_LEN}",
            key.len()
        ));
    }
    if !key.iter().all(u8::is_ascii_graphic) {
        return Err(
            "the key must be visible ASCII characters without spaces, as a header carries them"
                .to_string(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const ENTRIES: [(&str, &str, Option<&str>, bool); 4] = [
        ("acme-key-one-0123456789", "acme", Some("pro"), false),
        ("acme-key-two-0123456789", "acme", None, false),
        ("acme-revoked-0123456789", "acme", Some("pro"), true),
        ("bolt-key-one-0123456789", "bolt", Some("free"), false),
    ];

    fn new_key<'a>(consumer: &'a str, plan: Option<&'a str>, disabled: bool) -> NewKey<'a> {
        NewKey {
            consumer,
            plan,
            disabled,
        }
    }

    fn store() -> ApiKeys {
        let mut keys = KeysBuilder::default();
        for (i, (secret, consumer, plan, disabled)) in ENTRIES.into_iter().enumerate() {
            let hash = KeyHash::of(secret.as_bytes());
            keys.add(hash, new_key(consumer, plan, disabled), i);
        }
        keys.build()
    }

    /// What `keys` says of `secret`: its consumer, plan and whether it is revoked.
    fn said<'a>(keys: &'a ApiKeys, secret: &str) -> Option<(&'a str, Option<&'a str>, bool)> {
        let key = keys.verify(secret.as_bytes())?;
        Some((&**key.consumer, key.plan, key.disabled))
    }

    #[test]
    fn the_hash_is_sha256_written_in_hex() {
        // printf 'abc' | sha256sum
        let hash = KeyHash::of(b"abc");
        let text = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(hash.to_string(), text);
        assert_eq!(KeyHash::parse(text), Ok(hash));
        assert_eq!(
            KeyHash::parse(&text.to_uppercase().replace("SHA256", "sha256")),
            Ok(hash)
        );
    }

    #[test]
    fn malformed_hashes_are_explained() {
        let expected = |shown: &str| {
            format!("invalid hash {shown:?}: expected sha256: and 64 hex digits, as `sluice hash-key` prints")
        };
        let no_prefix = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(KeyHash::parse(no_prefix), Err(expected(no_prefix)));
        assert_eq!(KeyHash::parse("sha256:abcd"), Err(expected("sha256:abcd")));
        let not_hex = format!("sha256:{}", "g".repeat(64));
        assert_eq!(KeyHash::parse(&not_hex), Err(expected(&not_hex)));
        let long = format!("sha256:{}", "a".repeat(100));
        assert_eq!(
            KeyHash::parse(&long),
            Err(expected(&format!("{}...", &long[..80])))
        );
    }

    #[test]
    fn a_stored_key_names_its_consumer_and_plan() {
        let keys = store();
        assert_eq!(keys.len(), 4);
        for (secret, consumer, plan, disabled) in ENTRIES {
            assert_eq!(
                said(&keys, secret),
                Some((consumer, plan, disabled)),
                "{secret}"
            );
        }
        let mut listed: Vec<_> = keys
            .keys()
            .map(|(i, key)| (i, &**key.consumer, key.plan))
            .collect();
        listed.sort();
        assert_eq!(
            listed,
            [
                (0, "acme", Some("pro")),
                (1, "acme", None),
                (2, "acme", Some("pro")),
                (3, "bolt", Some("free"))
            ]
        );
    }

    #[test]
    fn an_unknown_key_is_not_verified() {
        let keys = store();
        assert_eq!(keys.verify(b"acme-key-one-012345678"), None);
        assert_eq!(keys.verify(b"acme-key-one-0123456789 "), None);
        assert_eq!(keys.verify(b""), None);
        // The hash itself is not a key.
        let hash = KeyHash::of(b"acme-key-one-0123456789").to_string();
        assert_eq!(keys.verify(hash.as_bytes()), None);
        assert_eq!(ApiKeys::default().verify(b"acme-key-one-0123456789"), None);
        assert_eq!(KeysBuilder::default().build().verify(b""), None);
    }

    #[test]
    fn a_revoked_key_is_verified_and_says_so() {
        let keys = store();
        let revoked = keys.verify(b"acme-revoked-0123456789").unwrap();
        assert!(revoked.disabled);
        assert_eq!(&**revoked.consumer, "acme");
    }

    #[test]
    fn keys_of_one_consumer_share_one_id_and_not_another_consumers() {
        let keys = store();
        let one = keys.verify(b"acme-key-one-0123456789").unwrap();
        let two = keys.verify(b"acme-key-two-0123456789").unwrap();
        let other = keys.verify(b"bolt-key-one-0123456789").unwrap();
        assert!(Arc::ptr_eq(one.consumer, two.consumer));
        assert_ne!(one.consumer, other.consumer);
        assert_eq!(store().consumers.len(), 2);
    }

    #[test]
    fn a_hash_added_twice_keeps_the_first_key() {
        let mut keys = KeysBuilder::default();
        let hash = KeyHash::of(b"bolt-key-one-0123456789");
        keys.add(hash, new_key("later", None, false), 7);
        keys.add(hash, new_key("first", None, false), 3);
        let keys = keys.build();
        assert_eq!(keys.len(), 1);
        assert_eq!(
            said(&keys, "bolt-key-one-0123456789"),
            Some(("first", None, false))
        );
    }

    #[test]
    fn hashes_sharing_their_first_bytes_are_told_apart() {
        let real = KeyHash::of(b"acme-key-one-0123456789");
        let mut keys = KeysBuilder::default();
        // Hashes with the same first 8 bytes, one sorted before the real one and one after.
        for (i, fill) in [0x00, 0xff].into_iter().enumerate() {
            let mut near = real;
            near.0[8..].fill(fill);
            keys.add(near, new_key("near", None, false), i);
        }
        keys.add(real, new_key("real", None, false), 2);
        let keys = keys.build();
        // Three keys, four runs: the three in one.
        assert_eq!((keys.bits, keys.starts.len()), (2, 5));
        let at = run(real.prefix(), keys.bits);
        assert_eq!(keys.starts[at + 1] - keys.starts[at], 3);
        assert_eq!(
            said(&keys, "acme-key-one-0123456789"),
            Some(("real", None, false))
        );
        let mut unknown = real;
        unknown.0[20] ^= 1;
        assert!(keys.find(&unknown).is_none());
    }

    #[test]
    fn a_key_is_found_among_many() {
        let mut keys = KeysBuilder::default();
        for i in 0..10_000 {
            let secret = format!("many-key-{i:05}-0123456789");
            keys.add(
                KeyHash::of(secret.as_bytes()),
                new_key("c", None, i % 2 == 0),
                i,
            );
        }
        let keys = keys.build();
        for i in 0..10_000 {
            let secret = format!("many-key-{i:05}-0123456789");
            let found = keys.verify(secret.as_bytes()).map(|key| key.disabled);
            assert_eq!(found, Some(i % 2 == 0), "{secret}");
        }
        assert_eq!(said(&keys, "many-key-10000-0123456789"), None);
        // 10,000 keys in 16,384 runs: none holds more than a handful.
        assert_eq!((keys.bits, keys.starts.len()), (14, 16_385));
        let longest = keys.starts.windows(2).map(|w| w[1] - w[0]).max();
        assert!(longest.is_some_and(|n| n <= 8), "{longest:?}");
    }

    #[test]
    fn a_stored_key_takes_48_bytes_and_its_run_4_to_8() {
        assert_eq!(std::mem::size_of::<Entry>(), 48);
        for n in [1, 2, 3, 1000, 1024, 1025] {
            let mut keys = KeysBuilder::default();
            for i in 0..n {
                let hash = KeyHash::of(format!("k{i}").as_bytes());
                keys.add(hash, new_key("c", None, false), i);
            }
            let runs = keys.build().starts.len() - 1;
            assert!(runs >= n && runs < 2 * n, "{n} keys, {runs} runs");
        }
    }

    #[test]
    fn consumer_ids_are_bounded_and_visible() {
        assert_eq!(check_consumer("acme-corp_1@eu"), Ok(()));
        assert_eq!(check_consumer(&"a".repeat(128)), Ok(()));
        assert_eq!(
            check_consumer(""),
            Err("empty: name the consumer".to_string())
        );
        assert_eq!(
            check_consumer(&"a".repeat(129)),
            Err("129 bytes: a consumer id has at most 128".to_string())
        );
        for bad in ["acme corp", "acme\n", "acmé"] {
            assert_eq!(
                check_consumer(bad),
                Err(format!(
                    "invalid consumer id {bad:?}: use visible ASCII characters, without spaces"
                ))
            );
        }
    }

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn the_presented_key_is_the_headers_only_value() {
        let name = HeaderName::from_static("x-api-key");
        let one = headers(&[("x-api-key", b"sk_abc"), ("x-other", b"1")]);
        assert_eq!(presented_key(&one, &name), Ok(Some(&b"sk_abc"[..])));
        let missing = headers(&[("x-other", b"sk_abc")]);
        assert_eq!(presented_key(&missing, &name), Ok(None));
        let repeated = headers(&[("x-api-key", b"sk_abc"), ("x-api-key", b"sk_abc")]);
        assert_eq!(
            presented_key(&repeated, &name),
            Err(PresentedKeyError::Repeated)
        );
        let longest = vec![b'k'; MAX_KEY_LEN];
        let at_most = headers(&[("x-api-key", &longest)]);
        assert_eq!(presented_key(&at_most, &name), Ok(Some(&longest[..])));
        let oversize = headers(&[("x-api-key", &[b'k'; MAX_KEY_LEN + 1])]);
        assert_eq!(
            presented_key(&oversize, &name),
            Err(PresentedKeyError::TooLong)
        );
    }

    #[test]
    fn generated_keys_are_fresh_and_may_be_issued() {
        let one = generate_key().unwrap();
        let two = generate_key().unwrap();
        assert_ne!(one, two);
        assert_eq!(one.len(), 3 + 43);
        assert!(one.starts_with("sk_"));
        assert!(one[3..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(check_new_key(one.as_bytes()), Ok(()));
    }

    #[test]
    fn short_long_or_invisible_keys_are_not_issued() {
        assert_eq!(
            check_new_key(b"short"),
            Err("the key has 5 bytes: use at least 20 (`sluice gen-key` makes one)".to_string())
        );
        assert_eq!(check_new_key(&[b'k'; 20]), Ok(()));
        assert_eq!(
            check_new_key(&[b'k'; 257]),
            Err("the key has 257 bytes: a request may present at most 256".to_string())
        );
        assert_eq!(
            check_new_key(b"twenty bytes and more"),
            Err(
                "the key must be visible ASCII characters without spaces, as a header carries them"
                    .to_string()
            )
        );
    }
}
