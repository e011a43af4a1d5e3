//! docs/lua-contract.md is true: the script `sluice --print-script` prints loads into a real
//! Redis, and the documented calls give the documented replies.

mod support;

use std::process::Command;

use support::RedisServer;

const DOC: &str = include_str!("../docs/lua-contract.md");

/// One limit's six reply integers.
type Reply = [i64; 6];

/// The example's calls after `EVALSHA $SHA`, and their replies, as the document shows them.
const CALLS: [(&str, Reply, Option<Reply>); 4] = [
    (
        "1 '{api}:user42' 1700000000000000 1 req-1 1 gcra 100000 600000 0 1 0",
        [1, 5, 0, 100, 0, 1700000000100000],
        None,
    ),
    (
        "2 '{api}:user42' '{api}:everyone' 1700000000000000 1 req-2 2 gcra 100000 600000 0 1 0 fixed_window 2 60000000 0 1 0",
        [1, 4, 0, 200, 0, 1700000000200000],
        Some([1, 1, 0, 60000, 0, 1700000060000000]),
    ),
    (
        "2 '{api}:user42' '{api}:everyone' 1700000000000000 1 req-3 2 gcra 100000 600000 0 1 0 fixed_window 2 60000000 0 1 0",
        [1, 3, 0, 300, 0, 1700000000300000],
        Some([1, 0, 0, 60000, 0, 1700000060000000]),
    ),
    (
        "2 '{api}:user42' '{api}:everyone' 1700000000000000 1 req-4 2 gcra 100000 600000 0 1 0 fixed_window 2 60000000 0 1 0",
        [1, 3, 0, 300, 0, 0],
        Some([0, 0, 60000, 60000, 0, 0]),
    ),
];

fn spaced(values: &[i64]) -> String {
    values
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// What `sluice ARG` printed, which it does without any configuration.
fn printed(arg: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg(arg)
        .output()
        .expect("run sluice");
    assert!(
        output.status.success(),
        "sluice {arg} needs no configuration"
    );
    String::from_utf8(output.stdout).expect("text")
}

#[test]
fn the_documented_calls_give_the_documented_replies() {
    let script = printed("--print-script");
    assert_eq!(
        script,
        sluice::limiter::script::decision_source(sluice::limiter::script::Algorithms::ALL),
        "the script sluice sends"
    );

    let redis = RedisServer::start();
    let mut connection = redis.connection();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(&script)
        .query(&mut connection)
        .expect("SCRIPT LOAD");
    for (call, first, second) in CALLS {
        assert!(
            DOC.contains(&format!("EVALSHA $SHA {call}\n")),
            "the document shows: EVALSHA $SHA {call}"
        );
        let mut command = redis::cmd("EVALSHA");
        command.arg(&sha);
        for word in call.split(' ') {
            command.arg(word.trim_matches('\''));
        }
        let reply: Vec<i64> = command.query(&mut connection).expect("EVALSHA");
        let mut expected = first.to_vec();
        expected.extend(second.iter().flatten());
        assert_eq!(reply, expected, "{call}");
        let shown = match second {
            None => first
                .iter()
                .enumerate()
                .map(|(i, v)| format!("{}) (integer) {v}", i + 1))
                .collect::<Vec<_>>()
                .join("\n"),
            Some(second) => format!("{} and {}", spaced(&first), spaced(&second)),
        };
        assert!(DOC.contains(&shown), "the document shows the reply {shown}");
    }
}

/// `--print-script=ALGORITHMS` prints the script a gateway sends for calls using only those; an
/// unknown name is refused with the known ones.
#[test]
fn the_script_of_some_algorithms_is_printed_and_an_unknown_name_refused() {
    use sluice::limiter::script::{decision_source, Algorithms};
    let print = |value: &str| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg(format!("--print-script={value}"))
            .output()
            .expect("run sluice --print-script")
    };
    let gcra = print("gcra,fixed_window");
    assert!(gcra.status.success());
    let expected = Algorithms::named(["gcra", "fixed_window"]).expect("known names");
    assert_eq!(
        String::from_utf8_lossy(&gcra.stdout),
        decision_source(expected)
    );
    assert!(!String::from_utf8_lossy(&gcra.stdout).contains("sliding_log_decide"));
    let unknown = print("gcra,leaky");
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        stderr.contains("\"gcra,leaky\"") && stderr.contains("known: gcra, fixed_window"),
        "{stderr}"
    );
}

/// `--print-library` prints the same script as a Redis 7 function library: loaded with
/// `FUNCTION LOAD`, its function answers the documented call as the script does.
#[test]
fn the_library_answers_the_documented_call_as_the_script_does() {
    let library = printed("--print-library");
    let redis = RedisServer::start();
    let mut connection = redis.connection();
    let name: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&library)
        .query(&mut connection)
        .expect("FUNCTION LOAD");
    assert!(
        library.starts_with(&format!("#!lua name={name}\n")),
        "{name}"
    );
    let reply: Vec<i64> = redis::cmd("FCALL")
        .arg(&name)
        .arg(1)
        .arg("{api}:user42")
        .arg(1_700_000_000_000_000_u64)
        .arg(1)
        .arg("req-1")
        .arg(1)
        .arg(("gcra", 100_000, 600_000, 0, 1, 0))
        .query(&mut connection)
        .expect("FCALL");
    assert_eq!(reply, CALLS[0].1);
}
