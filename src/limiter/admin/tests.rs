//! The in-process admin book: credit ids remembered once, overrides stored, listed, expired
//! and restored, and the encodings shared with `lua/admin/`.

use super::*;

#[test]
fn a_credit_id_counts_once_while_remembered() {
    let mut book = AdminBook::default();
    assert_eq!(book.remember_credit(b"k", b"c-1", 0).ok(), Some(true));
    assert_eq!(book.remember_credit(b"k", b"c-1", 1_000).ok(), Some(false));
    assert_eq!(book.remember_credit(b"k", b"c-2", 1_000).ok(), Some(true));
    assert_eq!(
        book.remember_credit(b"j", b"c-1", 1_000).ok(),
        Some(true),
        "another key"
    );
    assert_eq!(book.remember_credit(b"k", b"\xff", 1_000).ok(), Some(true));
    assert_eq!(
        book.remember_credit(b"k", b"\xfe", 1_000).ok(),
        Some(true),
        "two ids that are not UTF-8 are two ids"
    );
    let later = CREDIT_MEMORY.as_micros() as i64 + 1;
    assert_eq!(book.remember_credit(b"k", b"c-1", later).ok(), Some(true));
}

#[test]
fn an_override_is_written_back_only_where_none_is_in_force() {
    let mut book = AdminBook::default();
    let second = Duration::from_secs(1);
    assert_eq!(
        book.restore_override("f", "a", second, 0),
        Restored::Written
    );
    assert_eq!(
        book.restore_override("f", "b", second, 10),
        Restored::Present
    );
    assert_eq!(book.overrides(10)[0].value, "a", "the one in force stays");
    let epoch = book.epoch;
    assert_eq!(
        book.restore_override("f", "c", second, 1_000_001),
        Restored::Written,
        "expired"
    );
    assert_eq!(book.epoch, epoch + 1);
}

#[test]
fn stored_overrides_are_in_force_until_their_expiry() {
    let stored = vec![
        ("a".to_string(), "2000 {\"x\":1}".to_string()),
        ("b".to_string(), "1000 {}".to_string()),
        ("c".to_string(), "not one".to_string()),
    ];
    let live = in_force(stored, 1000);
    assert_eq!(live.len(), 1);
    assert_eq!(
        (live[0].field.as_str(), live[0].value.as_str()),
        ("a", "{\"x\":1}")
    );
    assert_eq!(live[0].left_ms, 1000);
}

#[test]
fn overrides_expire_and_report_what_they_replace() {
    let mut book = AdminBook::default();
    let second = Duration::from_secs(1);
    assert_eq!(
        book.put_override("f", "a", second, 0),
        Put::Stored { previous: None }
    );
    let replaced = book.put_override("f", "b", second, 10);
    assert_eq!(
        replaced,
        Put::Stored {
            previous: Some("a".into())
        }
    );
    let listed = book.overrides(500_000);
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].value.as_str(), listed[0].left_ms), ("b", 500));
    assert!(book.overrides(1_000_011).is_empty(), "expired");
    assert_eq!(book.delete_override("f", 1_000_011), None);
}

#[test]
fn a_credit_id_key_keeps_the_state_key_s_hash_tag_and_hides_the_id() {
    let key = credit_id_key(b"p:{r\x01t}l:x", b"order-42");
    assert!(key.starts_with(b"p:{r\x01t}l:x:credit:"));
    assert!(!key.windows(8).any(|w| w == b"order-42"));
    assert_eq!(credit_id_key(b"k", b"a"), credit_id_key(b"k", b"a"));
    assert_ne!(credit_id_key(b"k", b"a"), credit_id_key(b"k", b"b"));
    assert_ne!(credit_id_key(b"k", b"\xff"), credit_id_key(b"k", b"\xfe"));
    // A UTF-8 id hashes as its text always did: ids remembered in Redis stay valid.
    assert_eq!(
        credit_id_key(b"k", b"order-42"),
        [
            &b"k:credit:"[..],
            format!("{:032x}", xxh3_128(b"order-42")).as_bytes()
        ]
        .concat()
    );
}
