//! The `sluice` binary: parse the command line, load the config, run or check it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use mimalloc::MiMalloc;
use sluice::app::{self, RunOptions};
use sluice::config::{self, Config, ConfigError};
use sluice::daemon;

/// A Pingora reverse proxy with exact, shared rate limits in Redis.
#[derive(Debug, Parser)]
#[command(name = "sluice", version)]
struct Cli {
    /// Configuration file.
    #[arg(short = 'c', long = "conf", default_value = "/etc/sluice/sluice.yaml")]
    conf: PathBuf,
    /// Check the configuration, print every problem, and exit.
    #[arg(short = 't', long = "test")]
    test: bool,
    /// Run in the background; return once serving (exit 0), or with the reason it cannot.
    #[arg(short = 'd', long = "daemon")]
    daemon: bool,
    /// Take over the listening sockets of a running instance (graceful upgrade).
    #[arg(short = 'u', long = "upgrade")]
    upgrade: bool,
    /// Print the limiter's Lua script (docs/lua-contract.md) and exit; needs no configuration.
    #[arg(long = "print-script")]
    print_script: bool,
}

/// mimalloc instead of glibc malloc: the proxy path allocates small, short-lived buffers from
/// several threads, where glibc's arenas spent about a tenth of the gateway's CPU
/// (docs/performance.md).
#[global_allocator]
static ALLOCATOR: MiMalloc = MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Relative paths (the file's and those in it) are taken from here, before anything moves.
    sluice::config::paths::start_directory();
    if cli.print_script {
        print!("{}", sluice::limiter::script::SOURCE);
        return ExitCode::SUCCESS;
    }
    sluice::logging::init();

    let config = match checked(&cli.conf) {
        Ok((config, warnings)) => {
            for warning in warnings {
                eprintln!("sluice: warning: {warning}");
            }
            config
        }
        Err(error) => {
            eprintln!("{error}");
            eprintln!(
                "sluice: {} problem(s) in {}",
                error.problems.len(),
                cli.conf.display()
            );
            return ExitCode::from(1);
        }
    };
    if cli.test {
        println!("{}", config.summary());
        return ExitCode::SUCCESS;
    }
    let daemonize = cli.daemon || config.server.daemon;
    if daemonize && !daemon::launched() {
        return daemon::launch();
    }
    daemon::connect_to_launcher();
    match app::run(
        config,
        RunOptions {
            daemon: daemonize,
            upgrade: cli.upgrade,
        },
    ) {
        Ok(never) => match never {},
        Err(error) => {
            eprintln!("sluice: {error}");
            ExitCode::from(1)
        }
    }
}

/// The file compiled, and what start will need checked with it (certificates, users,
/// directories): `-t` passes only what can start. Those checks run on whatever compiled even
/// when the file has other problems, so that one run reports every problem.
fn checked(conf: &Path) -> Result<(Config, Vec<String>), ConfigError> {
    let (config, mut problems) = Config::load_all(conf);
    let warnings = match config.as_ref().map(app::preflight) {
        Some(Ok(warnings)) => warnings,
        Some(Err(mut error)) => {
            problems.append(&mut error.problems);
            Vec::new()
        }
        None => Vec::new(),
    };
    config::all_or_error(conf, (config, problems)).map(|config| (config, warnings))
}
