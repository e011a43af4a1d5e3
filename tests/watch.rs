//! `watch: true` end to end: the real `sluice` binary started on a configuration file mounted the
//! way the kubelet mounts a ConfigMap or Secret (`sluice.yaml -> ..data/sluice.yaml`,
//! `..data -> ..<timestamp>`, a new timestamped directory and `..data` renamed over the old
//! link for every update), with its limits in a real redis-server.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::config::{route, Config};
use support::limits::gcra;
use support::{eventually, http_get, metric, GatewayConfig, RedisServer, Upstream};

/// A projected volume like the kubelet's: each file a link through `..data`.
struct Volume {
    dir: PathBuf,
    generation: u32,
}

impl Volume {
    /// `dir` with `files` (name, contents) projected into it.
    fn project(dir: PathBuf, files: &[(&str, &str)]) -> Volume {
        std::fs::create_dir_all(&dir).expect("volume dir");
        let mut volume = Volume { dir, generation: 0 };
        volume.update(files);
        for (name, _) in files {
            std::os::unix::fs::symlink(format!("..data/{name}"), volume.dir.join(name))
                .expect("file link");
        }
        volume
    }

    /// What the kubelet does on an update: write a new timestamped directory, point a new link
    /// at it, rename that link over `..data` (atomic), remove the old directory.
    fn update(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let old = self.timestamped(self.generation - 1);
        let new = self.timestamped(self.generation);
        std::fs::create_dir(&new).expect("timestamped dir");
        for (name, contents) in files {
            std::fs::write(new.join(name), contents).expect("write projected file");
        }
        let tmp = self.dir.join("..data_tmp");
        let target = new.file_name().expect("dir name");
        std::os::unix::fs::symlink(target, &tmp).expect("..data_tmp");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
        if old.exists() {
            std::fs::remove_dir_all(old).expect("remove the old dir");
        }
    }

    fn timestamped(&self, generation: u32) -> PathBuf {
        self.dir
            .join(format!("..2026_11_24_18_00_{generation:02}.000000001"))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// `sluice -c config` as a child, its log in `log`, reaped when dropped.
struct Watched {
    child: Child,
    config: GatewayConfig,
    log: PathBuf,
}

impl Watched {
    fn start(config: GatewayConfig, path: &Path) -> Watched {
        let log = config.dir.path().join("stderr.log");
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("-c")
            .arg(path)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start sluice");
        let mut watched = Watched { child, config, log };
        let (proxy, admin) = (watched.config.proxy, watched.config.admin);
        eventually(Duration::from_secs(20), "sluice listening", || {
            assert!(
                matches!(watched.child.try_wait(), Ok(None)),
                "sluice exited during startup: {}",
                watched.log()
            );
            std::net::TcpStream::connect(proxy).is_ok()
                && std::net::TcpStream::connect(admin).is_ok()
        });
        watched
    }

    fn get(&self, path: &str) -> u16 {
        http_get(self.config.proxy, path, None, &[]).status
    }

    fn reloads(&self, result: &str) -> f64 {
        let metrics = http_get(self.config.admin, "/metrics", None, &[]).body;
        metric(
            &metrics,
            "sluice_config_reloads_total",
            &[("result", result)],
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The file the harness writes for `body` (its ports, upstream and Redis filled in).
fn text_of(config: &GatewayConfig, body: &str) -> String {
    config.rewrite(body);
    std::fs::read_to_string(&config.path).expect("read the written config")
}

#[test]
fn a_configmap_symlink_swap_changes_a_limit_and_a_broken_one_keeps_the_running_config() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let body = |rate: &str, burst: u64| {
        Config::new()
            .redis("REDIS_URL")
            .set("watch", true)
            .route(
                route("api")
                    .prefix("/api/")
                    .limit(gcra("tight", rate).key(&["route"]).burst(burst)),
            )
            .yaml()
    };
    let config = GatewayConfig::write(&body("1/h", 0), &upstream, Some(&redis), 0);
    let text = text_of(&config, &body("1/h", 0));
    let mut volume = Volume::project(config.dir.path().join("volume"), &[("sluice.yaml", &text)]);
    let gateway = Watched::start(config, &volume.path("sluice.yaml"));
    assert_eq!(gateway.get("/api/x"), 200);
    assert_eq!(gateway.get("/api/x"), 429, "1/h, no burst");

    // The kubelet swaps in a relaxed limit: in force within 2 s, no signal sent.
    volume.update(&[("sluice.yaml", &text_of(&gateway.config, &body("100/s", 99)))]);
    let swapped = Instant::now();
    eventually(Duration::from_secs(2), "the relaxed limit in force", || {
        gateway.get("/api/x") == 200
    });
    eprintln!("limit changed {:?} after the swap", swapped.elapsed());
    assert_eq!(gateway.reloads("success"), 1.0);
    assert!(
        gateway.log().contains("sluice.yaml changed"),
        "{}",
        gateway.log()
    );

    // A broken file: refused, logged and counted once; the relaxed limit keeps serving.
    volume.update(&[(
        "sluice.yaml",
        &text_of(&gateway.config, &body("1/fortnight", 0)),
    )]);
    eventually(Duration::from_secs(5), "the broken file refused", || {
        gateway.reloads("error") == 1.0
    });
    assert!(
        gateway
            .log()
            .contains("reload rejected, keeping the running configuration"),
        "{}",
        gateway.log()
    );
    for _ in 0..5 {
        assert_eq!(gateway.get("/api/x"), 200, "the running limit still serves");
    }

    // The fix is the next change: it reloads, and the broken file was not retried meanwhile.
    volume.update(&[("sluice.yaml", &text_of(&gateway.config, &body("2/h", 0)))]);
    eventually(Duration::from_secs(5), "the fixed file in force", || {
        gateway.reloads("success") == 2.0
    });
    assert_eq!(
        gateway.reloads("error"),
        1.0,
        "one refusal per broken change"
    );
    assert_eq!(gateway.get("/api/x"), 200);
    assert_eq!(gateway.get("/api/x"), 429, "2/h, no burst");
}

#[test]
fn a_secret_file_the_config_names_is_followed_through_its_own_symlink_swap() {
    let upstream = Upstream::start();
    let (first, second) = ("first-admin-token-0123", "second-admin-token-4567");
    let config = GatewayConfig::write("routes: []\n", &upstream, None, 0);
    let mut secret = Volume::project(config.dir.path().join("secret"), &[("token", first)]);
    let body = Config::new()
        .set("watch", true)
        .set(
            "admin",
            format!(
                "{{ token: {{ file: {} }} }}",
                secret.path("token").display()
            ),
        )
        .route(route("api").prefix("/api/"))
        .yaml();
    let text = text_of(&config, &body);
    let volume = Volume::project(config.dir.path().join("config"), &[("sluice.yaml", &text)]);
    let gateway = Watched::start(config, &volume.path("sluice.yaml"));
    let status_with = |token: &str| {
        let bearer = format!("Bearer {token}");
        let headers = [("Authorization", bearer.as_str())];
        http_get(gateway.config.admin, "/v1/quota", None, &headers).status
    };
    assert_ne!(status_with(first), 401, "the first token is accepted");
    assert_eq!(status_with(second), 401);

    secret.update(&[("token", second)]);
    eventually(Duration::from_secs(2), "the rotated token in force", || {
        status_with(second) != 401
    });
    assert_eq!(status_with(first), 401, "the old token is refused");
    assert_eq!(gateway.reloads("success"), 1.0);
}

#[test]
fn without_watch_a_changed_file_waits_for_sighup() {
    let upstream = Upstream::start();
    let body = |prefix: &str| Config::new().route(route("api").prefix(prefix)).yaml();
    let config = GatewayConfig::write(&body("/api/"), &upstream, None, 0);
    let text = text_of(&config, &body("/api/"));
    let mut volume = Volume::project(config.dir.path().join("volume"), &[("sluice.yaml", &text)]);
    let gateway = Watched::start(config, &volume.path("sluice.yaml"));
    assert_eq!(gateway.get("/other"), 404);
    volume.update(&[("sluice.yaml", &text_of(&gateway.config, &body("/other")))]);
    // Three watch intervals: time enough for a watcher to have seen it, were one on.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        gateway.get("/other"),
        404,
        "not reloaded without watch or a signal"
    );
    assert_eq!(gateway.reloads("success"), 0.0);
}
