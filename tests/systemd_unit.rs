//! `systemd/sluice.service` passes `systemd-analyze verify` without a single warning, and agrees
//! with where sluice puts its pid file under systemd.

mod support;

use std::process::Command;

#[test]
fn the_unit_verifies_cleanly() {
    let unit = std::fs::read_to_string(support::repo_path("systemd/sluice.service"))
        .expect("read the unit");
    // verify insists that ExecStart binaries exist: point them at the binary under test.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.service");
    std::fs::write(
        &path,
        unit.replace("/usr/bin/sluice", env!("CARGO_BIN_EXE_sluice")),
    )
    .unwrap();
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("systemd-analyze is required ({e}): scripts/test.sh installs it (apt-get install systemd)"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "systemd-analyze verify failed: {stderr}"
    );
    assert_eq!(stderr.trim(), "", "systemd-analyze verify warned");
}

#[test]
fn the_unit_matches_the_runtime_directory_convention() {
    let unit = std::fs::read_to_string(support::repo_path("systemd/sluice.service")).unwrap();
    let position = |line: &str| unit.lines().position(|l| l == line);
    assert!(
        position("ExecReload=/usr/bin/sluice -u -d -c /etc/sluice/sluice.yaml")
            < position("ExecReload=/bin/kill -QUIT $MAINPID"),
        "the new instance must be started before the old one is told to hand over"
    );
    for line in [
        "Type=forking",
        "RuntimeDirectory=sluice",
        "PIDFile=/run/sluice/sluice.pid",
        "ExecStartPre=/usr/bin/sluice -t -c /etc/sluice/sluice.yaml",
        "ExecReload=/usr/bin/sluice -u -d -c /etc/sluice/sluice.yaml",
        "ExecReload=/bin/kill -QUIT $MAINPID",
        "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "DynamicUser=yes",
    ] {
        assert!(unit.lines().any(|l| l == line), "missing {line:?}");
    }
}
