//! The `sluice` binary: parse the command line, load the config, run or check it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mimalloc::MiMalloc;
use sluice::config::{self, Config, ConfigError, Sources};
use sluice::edge::server::{self, RunOptions};
use sluice::runtime::daemon;

/// A Pingora reverse proxy with exact, shared rate limits in Redis.
#[derive(Debug, Parser)]
#[command(name = "sluice", version)]
struct Cli {
    /// Configuration file.
    #[arg(
        short = 'c',
        long = "conf",
        default_value = "/etc/sluice/sluice.yaml",
        global = true
    )]
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
    /// With a comma-separated list of algorithms (e.g. `--print-script=gcra`), print the script
    /// a gateway sends for requests that use only those.
    #[arg(long = "print-script", value_name = "ALGORITHMS", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    print_script: Option<String>,
    /// Print the same as a Redis 7 function library (`FUNCTION LOAD`, then `FCALL sluice_<sha>`),
    /// the form a gateway loads on Redis 7 and later.
    #[arg(long = "print-library", value_name = "ALGORITHMS", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    print_library: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

/// Tools that need no configuration (docs/consumers.md).
#[derive(Debug, Subcommand)]
enum Command {
    /// Read an API key from standard input (one line) and print the hash to list in the key file.
    HashKey,
    /// Print a new random API key, then its hash to list in the key file.
    GenKey,
    /// Tell what the configuration (-c) does with a request, without Redis: its route (or why
    /// none), the client's standing, the caller, the tier, every limit with its key. JSON on
    /// standard output (docs/operations.md).
    Explain(ExplainArgs),
}

/// The request `sluice explain` tells of.
#[derive(Debug, clap::Args)]
struct ExplainArgs {
    /// The request's method (GET, POST...).
    method: String,
    /// The request's URL: http://HOST/PATH?QUERY.
    url: String,
    /// A request header, `Name: value` (repeat for more; an API key goes in its header).
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// The TCP peer the request comes from.
    #[arg(long, default_value = "127.0.0.1")]
    peer: std::net::IpAddr,
    /// The consumer the request stands for, instead of its credentials.
    #[arg(long)]
    consumer: Option<String>,
    /// That consumer's plan (default: its own).
    #[arg(long, requires = "consumer")]
    plan: Option<String>,
}

/// mimalloc instead of glibc malloc: the proxy path allocates small, short-lived buffers from
/// several threads, where glibc's arenas spent about a tenth of the gateway's CPU
/// (docs/performance.md).
#[global_allocator]
static ALLOCATOR: MiMalloc = MiMalloc;

/// Returns the calling thread's freed pages to the system, and those of the abandoned segments
/// of threads that have ended (`mi_collect(true)`): mimalloc keeps them until their thread's
/// next use of the allocator, and the thread that read a large configuration may then stay
/// idle (`runtime::memory`).
fn mimalloc_hand_back() {
    // SAFETY: `mi_collect` takes no pointer and may be called from any thread at any time; it
    // frees only pages that hold no live block.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// Prints the decision script holding the algorithms named in `names` (comma-separated; empty:
/// all of them), as a script or as a function library.
fn print_script(names: &str, library: bool) -> ExitCode {
    use sluice::limiter::redis::script::{decision_script, decision_source, Algorithms};
    let algorithms = if names.is_empty() {
        Some(Algorithms::ALL)
    } else {
        Algorithms::named(names.split(','))
    };
    match algorithms {
        Some(algorithms) if library => {
            print!("{}", decision_script(algorithms).library);
            ExitCode::SUCCESS
        }
        Some(algorithms) => {
            print!("{}", decision_source(algorithms));
            ExitCode::SUCCESS
        }
        None => {
            eprintln!("sluice: {names:?} names an unknown algorithm (known: gcra, fixed_window, calendar, sliding_window, sliding_log, concurrency)");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Relative paths (the file's and those in it) are taken from here, before anything moves.
    sluice::config::paths::start_directory();
    if let Some(command) = cli.command {
        return match command {
            Command::HashKey => hash_key(),
            Command::GenKey => gen_key(),
            Command::Explain(args) => explain(&cli.conf, args),
        };
    }
    if let Some(names) = cli.print_script {
        return print_script(&names, false);
    }
    if let Some(names) = cli.print_library {
        return print_script(&names, true);
    }
    sluice::observe::logging::init();

    let (config, read) = match checked_apart(&cli.conf) {
        Ok((config, read, warnings)) => {
            for warning in warnings {
                eprintln!("sluice: warning: {warning}");
            }
            (config, read)
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
    match server::run(
        config,
        read,
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

/// [`checked`] on a thread of its own, which ends with it. The configuration it keeps was
/// allocated by that thread, whose segments the allocator abandons when the thread ends, so
/// the reload that drops this configuration can hand its memory back (`runtime::memory`, told
/// here how). Read on the main thread, which then stays idle, it would be kept for the
/// process's life.
fn checked_apart(conf: &Path) -> Result<(Config, Sources, Vec<String>), ConfigError> {
    sluice::runtime::memory::set_hand_back(mimalloc_hand_back);
    std::thread::scope(|s| match s.spawn(|| checked(conf)).join() {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// The file compiled, and what start will need checked with it (certificates, users,
/// directories): `-t` passes only what can start. Those checks run on whatever compiled even
/// when the file has other problems, so that one run reports every problem.
fn checked(conf: &Path) -> Result<(Config, Sources, Vec<String>), ConfigError> {
    let mut read = Sources::default();
    let (config, mut problems) = Config::load_all(conf, &mut read);
    sluice::runtime::memory::hand_back_freed();
    let warnings = match config
        .as_ref()
        .map(|config| server::preflight(config, &mut read))
    {
        Some(Ok(warnings)) => warnings,
        Some(Err(mut error)) => {
            problems.append(&mut error.problems);
            Vec::new()
        }
        None => Vec::new(),
    };
    config::all_or_error(conf, (config, problems)).map(|config| (config, read, warnings))
}

/// `sluice explain`: the explanation of one request under the configuration at `conf`, as
/// JSON; exit 1 when the configuration does not load, 2 when the request cannot be described.
fn explain(conf: &Path, args: ExplainArgs) -> ExitCode {
    use sluice::edge::explain::{offline, Described, Unexplained};
    let mut described = match Described::from_url(&args.method, &args.url, &args.headers) {
        Ok(described) => described,
        Err(why) => {
            eprintln!("sluice: {}", why);
            return ExitCode::from(2);
        }
    };
    described.peer = args.peer;
    described.consumer = args.consumer.map(|id| (id, args.plan));
    match offline(conf, &described) {
        Ok(answer) => match serde_json::to_string_pretty(&answer) {
            Ok(pretty) => {
                println!("{pretty}");
                ExitCode::SUCCESS
            }
            Err(why) => {
                eprintln!("sluice: the explanation cannot be written as JSON: {why}");
                ExitCode::from(1)
            }
        },
        Err(Unexplained::Config(why)) => {
            eprintln!("{why}");
            ExitCode::from(1)
        }
        Err(Unexplained::Request(why)) => {
            eprintln!("sluice: {why}");
            ExitCode::from(2)
        }
    }
}

/// The longest input `sluice hash-key` reads: a key and its newline fit many times over.
const MAX_HASH_KEY_INPUT: u64 = 4096;

/// `sluice hash-key`: one key on standard input (its newline dropped), its hash on standard
/// output; a key that could not be issued (too short, too long, not one line) is refused. At a
/// terminal the key ends with Enter; piped, the whole input must be that one line.
fn hash_key() -> ExitCode {
    use std::io::{BufRead, IsTerminal};
    let stdin = std::io::stdin();
    let mut input = Vec::new();
    let mut bounded = stdin.lock().take(MAX_HASH_KEY_INPUT);
    let read = if stdin.is_terminal() {
        bounded.read_until(b'\n', &mut input)
    } else {
        bounded.read_to_end(&mut input)
    };
    if let Err(e) = read {
        eprintln!("sluice: cannot read the key from standard input: {e}");
        return ExitCode::from(1);
    }
    let line = input.strip_suffix(b"\n").unwrap_or(&input);
    let key = line.strip_suffix(b"\r").unwrap_or(line);
    let checked = if key.contains(&b'\n') {
        Err("give one key, on one line".to_string())
    } else {
        sluice::caller::api_keys::check_new_key(key)
    };
    match checked {
        Ok(()) => {
            println!("{}", sluice::caller::api_keys::KeyHash::of(key));
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("sluice: {why}");
            ExitCode::from(1)
        }
    }
}

/// `sluice gen-key`: a new key on the first line, its hash on the second.
fn gen_key() -> ExitCode {
    match sluice::caller::api_keys::generate_key() {
        Ok(key) => {
            println!("{key}");
            println!("{}", sluice::caller::api_keys::KeyHash::of(key.as_bytes()));
            eprintln!("sluice: give the key (first line) to its consumer, list the hash (second line) in the key file; the key is not kept anywhere");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("sluice: {why}");
            ExitCode::from(1)
        }
    }
}
