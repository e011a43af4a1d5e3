//! `sluice hash-key` and `sluice gen-key`, run as an operator runs them: the built binary, a key
//! on standard input, the printed hash listed in a key file that then verifies the key; and the
//! configuration flags still work beside the subcommands.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `sluice ARGS` with `stdin`; returns (exit code, stdout, stderr).
fn sluice(args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(support::repo_path(""))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sluice");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write the key");
    let output = child.wait_with_output().expect("sluice ends");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `printf 'sk_test_key_0123456789abc' | sha256sum`
const TEST_KEY_HASH: &str =
    "sha256:38428a68da06727199ef2073fdd74241cc0d761cd88cd0b650e50f396b209439";

#[test]
fn hash_key_prints_the_sha256_of_the_line() {
    for input in [
        &b"sk_test_key_0123456789abc\n"[..],
        b"sk_test_key_0123456789abc\r\n",
        b"sk_test_key_0123456789abc",
    ] {
        let (code, stdout, stderr) = sluice(&["hash-key"], input);
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(stdout, format!("{TEST_KEY_HASH}\n"));
    }
}

#[test]
fn hash_key_refuses_what_cannot_be_a_key() {
    let cases: [(&[u8], &str); 5] = [
        (
            b"",
            "sluice: the key has 0 bytes: use at least 20 (`sluice gen-key` makes one)\n",
        ),
        (
            b"\n",
            "sluice: the key has 0 bytes: use at least 20 (`sluice gen-key` makes one)\n",
        ),
        (
            b"short-key\n",
            "sluice: the key has 9 bytes: use at least 20 (`sluice gen-key` makes one)\n",
        ),
        (
            b"sk_first_key_0123456789\nsk_second_key_0123456789\n",
            "sluice: give one key, on one line\n",
        ),
        (
            b"sk_a key with spaces 0123456789\n",
            "sluice: the key must be visible ASCII characters without spaces, as a header carries them\n",
        ),
    ];
    for (input, message) in cases {
        let (code, stdout, stderr) = sluice(&["hash-key"], input);
        assert_eq!(code, 1, "{input:?} must be refused; stdout: {stdout}");
        assert_eq!(stdout, "");
        assert_eq!(stderr, message);
    }
}

#[test]
fn gen_key_prints_a_fresh_key_and_its_hash() {
    let (code, first, stderr) = sluice(&["gen-key"], b"");
    assert_eq!(code, 0, "{stderr}");
    let (_, second, _) = sluice(&["gen-key"], b"");
    let lines: Vec<&str> = first.lines().collect();
    let [key, hash] = lines[..] else {
        panic!("two lines expected: {first:?}");
    };
    assert_ne!(first, second, "each key is new");
    assert!(key.starts_with("sk_") && key.len() == 46, "{key}");
    assert!(key[3..]
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    let (code, hashed, _) = sluice(&["hash-key"], format!("{key}\n").as_bytes());
    assert_eq!(code, 0);
    assert_eq!(hashed, format!("{hash}\n"));
}

#[test]
fn an_issued_key_is_verified_by_the_file_its_hash_is_listed_in() {
    let (_, issued, _) = sluice(&["gen-key"], b"");
    let (key, hash) = issued.split_once('\n').expect("key, then hash");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.yaml");
    std::fs::write(
        &file,
        format!(
            "keys:\n  - hash: \"{}\"\n    consumer: acme\n    plan: pro\n",
            hash.trim()
        ),
    )
    .unwrap();
    let keys = sluice::config::api_key_file::read(&file, &mut sluice::config::Sources::default())
        .expect("the file reads");
    let found = keys
        .verify(key.as_bytes())
        .expect("the issued key verifies");
    assert_eq!(
        (&**found.consumer, found.plan, found.disabled),
        ("acme", Some("pro"), false)
    );
    assert!(keys.verify(hash.trim().as_bytes()).is_none());
}

#[test]
fn the_configuration_flags_work_beside_the_subcommands() {
    let (code, stdout, stderr) = sluice(&["-c", "conf/sluice.yaml", "-t"], b"");
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "conf/sluice.yaml: ok: 2 routes, 3 limits, redis at redis://127.0.0.1:6379/0\n"
    );
    let (code, stdout, _) = sluice(&["--print-script"], b"");
    assert_eq!(code, 0);
    assert!(!stdout.is_empty());
    let (code, _, stderr) = sluice(&["no-such-command"], b"");
    assert_eq!(code, 2);
    assert!(stderr.contains("no-such-command"), "{stderr}");
}
