//! The Lua scripts, composed from `lua/`, and the encoding of their arguments and replies. The
//! contracts are stated in `lua/check.lua`, `lua/settle.lua`, `lua/release.lua` and, for the
//! quota admin API's writes, each file of `lua/admin/` but its shared parts.

use std::sync::OnceLock;

use smallvec::SmallVec;

use crate::limiter::algorithm::{Algorithm, Change};
use crate::limiter::clock::{Clock, SystemClock};
use crate::limiter::decision::{Decision, Statuses};
use crate::limiter::error::LimiterError;
use crate::limiter::id::RequestId;
use crate::limiter::limit::{Limit, GLOBAL_SCRIPT};
use crate::limiter::request::LimitRequest;
use crate::limiter::status::LimitStatus;

/// The helpers every script starts with.
const PRELUDE: &str = include_str!("../../../lua/prelude.lua");

/// Each algorithm's name (`Algorithm::script_name`) and file, in the order of [`Algorithms`]'
/// bits.
const ALGORITHM_FILES: [(&str, &str); 7] = [
    ("gcra", include_str!("../../../lua/gcra.lua")),
    (
        "fixed_window",
        include_str!("../../../lua/fixed_window.lua"),
    ),
    ("calendar", include_str!("../../../lua/calendar.lua")),
    (
        "sliding_window",
        include_str!("../../../lua/sliding_window.lua"),
    ),
    ("sliding_log", include_str!("../../../lua/sliding_log.lua")),
    ("concurrency", include_str!("../../../lua/concurrency.lua")),
    (GLOBAL_SCRIPT, include_str!("../../../lua/global.lua")),
];

/// The driver deciding a batch of requests (`lua/check.lua`).
const DRIVER: &str = include_str!("../../../lua/check.lua");

/// A set of algorithms: which ones a decision script holds. Redis runs a script's whole text on
/// every call, so each algorithm a script holds costs every call that does not use it (its
/// closures are made anew each time): the gateway sends each batch to the script of exactly the
/// algorithms its requests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Algorithms(u8);

impl Algorithms {
    /// Every algorithm: the script of the public contract (`sluice --print-script`).
    pub const ALL: Algorithms = Algorithms((1 << ALGORITHM_FILES.len()) - 1);

    /// The set holding `algorithm` alone.
    pub fn of(algorithm: &Algorithm) -> Algorithms {
        let bit = match algorithm {
            Algorithm::Gcra { .. } => 0,
            Algorithm::FixedWindow { .. } => 1,
            Algorithm::Calendar { .. } => 2,
            Algorithm::SlidingWindow { .. } => 3,
            Algorithm::SlidingLog { .. } => 4,
            Algorithm::Concurrency { .. } => 5,
        };
        Algorithms(1 << bit)
    }

    /// The set holding the function that decides `limit` (a limit kept across regions:
    /// `global`, bit 6).
    pub fn of_limit(limit: &Limit) -> Algorithms {
        if limit.synced() {
            Algorithms(1 << 6)
        } else {
            Algorithms::of(&limit.algorithm)
        }
    }

    /// The set of the algorithms of `limits`.
    pub fn of_limits<'a>(limits: impl IntoIterator<Item = &'a Limit>) -> Algorithms {
        limits
            .into_iter()
            .fold(Algorithms::default(), |set, limit| {
                set.with(Algorithms::of_limit(limit))
            })
    }

    /// The set of the names in `names` (`Algorithm::script_name`); `None` names one unknown.
    pub fn named<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<Algorithms> {
        names
            .into_iter()
            .try_fold(Algorithms::default(), |set, name| {
                let bit = ALGORITHM_FILES.iter().position(|(file, _)| *file == name)?;
                Some(set.with(Algorithms(1 << bit)))
            })
    }

    /// Both sets.
    pub fn with(self, other: Algorithms) -> Algorithms {
        Algorithms(self.0 | other.0)
    }

    fn holds(self, bit: usize) -> bool {
        self.0 & (1 << bit) != 0
    }

    /// Every set of some of its algorithms, itself included, the empty set not: each is the
    /// script of a batch whose requests use only those.
    pub fn subsets(self) -> impl Iterator<Item = Algorithms> {
        // Counting down through the bit patterns inside `self.0`, each once.
        let mut next = Some(self.0).filter(|bits| *bits != 0);
        std::iter::from_fn(move || {
            let bits = next?;
            let smaller = (bits - 1) & self.0;
            next = Some(smaller).filter(|bits| *bits != 0);
            Some(Algorithms(bits))
        })
    }

    /// Its place among all sets (each set's script has its own place; see [`decision_script`]).
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// The decision script of `algorithms`: the prelude, their files, the tables the driver
/// dispatches on, then the driver (`lua/check.lua`). One EVALSHA of it decides a batch of
/// requests (`coalesce.rs`), each with every limit of its route.
pub fn decision_source(algorithms: Algorithms) -> String {
    let mut source = decision_head(algorithms);
    source.push_str(DRIVER);
    source
}

/// Everything of a decision script but its driver: what a function library creates once.
fn decision_head(algorithms: Algorithms) -> String {
    let held = || {
        ALGORITHM_FILES
            .iter()
            .enumerate()
            .filter(move |(bit, _)| algorithms.holds(*bit))
            .map(|(_, file)| file)
    };
    let mut source = String::from(PRELUDE);
    for (_, file) in held() {
        source.push('\n');
        source.push_str(file);
    }
    let table = |function: &str| {
        held()
            .map(|(name, _)| format!("{name} = {name}_{function}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    source.push_str(&format!(
        "\nlocal DECIDE = {{ {} }}\nlocal COMMIT = {{ {} }}\n\n",
        table("decide"),
        table("commit")
    ));
    source
}

/// A decision script in both of the forms Redis runs: a script (`EVALSHA`) and a function
/// library (Redis 7: `FCALL`). A library is loaded once per server and kept with the dataset,
/// so it is persisted and replicated: a promoted replica already has it. Its text (the
/// prelude, the algorithms, their tables) runs once, at load, where a script's runs on every
/// call; the driver is the library's one function.
pub struct DecisionScript {
    pub script: redis::Script,
    /// The library's and its function's name: `sluice_` and the script's SHA1, so that
    /// gateways of different releases (different texts) never replace each other's.
    pub function: String,
    /// The library's source, for `FUNCTION LOAD REPLACE`.
    pub library: String,
}

impl DecisionScript {
    fn of(algorithms: Algorithms) -> DecisionScript {
        let head = decision_head(algorithms);
        let script = redis::Script::new(&format!("{head}{DRIVER}"));
        let function = format!("sluice_{}", script.get_hash());
        let library = format!(
            "#!lua name={function}\n{head}\nredis.register_function('{function}', function(KEYS, ARGV)\n{DRIVER}\nend)\n"
        );
        DecisionScript {
            script,
            function,
            library,
        }
    }
}

/// The decision script of `algorithms`, composed on its first use.
pub fn decision_script(algorithms: Algorithms) -> &'static DecisionScript {
    static SCRIPTS: [OnceLock<DecisionScript>; 1 << ALGORITHM_FILES.len()] =
        [const { OnceLock::new() }; 1 << ALGORITHM_FILES.len()];
    SCRIPTS[algorithms.index()].get_or_init(|| DecisionScript::of(algorithms))
}

/// How a decision script is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invoke {
    /// `FCALL` of its library's function (Redis 7 and later).
    Function,
    /// `EVALSHA` of its script.
    Script,
}

/// Settles units earlier calls took: gives back the unspent, charges the overspent
/// (`lua/settle.lua`, which writes a charge with the algorithms' own commit functions).
pub const SETTLE_SOURCE: &str = concat!(
    include_str!("../../../lua/prelude.lua"),
    "\n",
    include_str!("../../../lua/gcra.lua"),
    "\n",
    include_str!("../../../lua/fixed_window.lua"),
    "\n",
    include_str!("../../../lua/settle.lua"),
);

/// The four arguments of one key's change in a settle call (`lua/settle.lua`): what it settles
/// (the algorithm's name; `gcra_lease` for a lease's unspent GCRA units), its parameter (GCRA:
/// the emission interval; fixed window: the window length; calendar: unused, 1), the signed
/// change in units, and the mark of the call that took them (giving back).
pub fn settle_args(algorithm: &Algorithm, change: Change) -> (&'static str, u64, i64, i64) {
    let param = match *algorithm {
        Algorithm::Gcra { emission_us, .. } => emission_us,
        Algorithm::FixedWindow { window_us, .. } => window_us,
        _ => 1,
    };
    let name = match (algorithm, change) {
        (Algorithm::Gcra { .. }, Change::Return { .. }) => "gcra_lease",
        _ => algorithm.script_name(),
    };
    let units = |units: u64| i64::try_from(units).unwrap_or(i64::MAX);
    let (change, mark) = match change {
        Change::GiveBack { units: u, mark_us } | Change::Return { units: u, mark_us } => {
            (-units(u), mark_us)
        }
        Change::Charge { units: u } => (units(u), 0),
    };
    (name, param, change, mark)
}

/// The text of the files of `lua/` named (without `.lua`), in order, each followed by a line
/// break: one script composed at compile time.
macro_rules! lua {
    ($($file:literal),+ $(,)?) => {
        concat!($(include_str!(concat!("../../../lua/", $file, ".lua")), "\n"),+)
    };
}

/// Deletes limits' keys: a full quota again (`lua/admin/reset.lua`; it reads no clock).
pub const RESET_SOURCE: &str = lua!("admin/reset");

/// Gives units back to a limit's key once per id (`lua/admin/credit.lua`).
pub const CREDIT_SOURCE: &str = lua!("prelude", "admin/credit");

/// Sets or replaces an override (`lua/admin/override_put.lua`).
pub const OVERRIDE_PUT_SOURCE: &str = lua!(
    "prelude",
    "admin/epoch",
    "admin/overrides",
    "admin/override_put"
);

/// Writes an override back where none is in force (`lua/admin/override_restore.lua`).
pub const OVERRIDE_RESTORE_SOURCE: &str = lua!(
    "prelude",
    "admin/epoch",
    "admin/overrides",
    "admin/override_restore"
);

/// Removes an override (`lua/admin/override_delete.lua`).
pub const OVERRIDE_DELETE_SOURCE: &str = lua!(
    "prelude",
    "admin/epoch",
    "admin/overrides",
    "admin/override_delete"
);

/// Counts a reset's or a credit's change in the admin epoch (`lua/admin/announce.lua`).
pub const ANNOUNCE_SOURCE: &str = lua!("prelude", "admin/epoch", "admin/announce");

/// The quota admin API's writes in Redis, one script per operation, each composed of the
/// prelude, the shared parts it uses (`lua/admin/epoch.lua`, `lua/admin/overrides.lua`) and its
/// own body, which states its contract. Each is called by `EVALSHA` and loaded on `NOSCRIPT`
/// (redis-rs's [`redis::Script`]), as the settle and release scripts are: an admin write is
/// rare, and a decision never waits on one. Each field is the script of
/// `lua/admin/<field>.lua`.
pub struct AdminScripts {
    pub reset: redis::Script,
    pub credit: redis::Script,
    pub override_put: redis::Script,
    pub override_restore: redis::Script,
    pub override_delete: redis::Script,
    pub announce: redis::Script,
}

impl AdminScripts {
    /// Every admin script, hashed.
    pub fn new() -> AdminScripts {
        AdminScripts {
            reset: redis::Script::new(RESET_SOURCE),
            credit: redis::Script::new(CREDIT_SOURCE),
            override_put: redis::Script::new(OVERRIDE_PUT_SOURCE),
            override_restore: redis::Script::new(OVERRIDE_RESTORE_SOURCE),
            override_delete: redis::Script::new(OVERRIDE_DELETE_SOURCE),
            announce: redis::Script::new(ANNOUNCE_SOURCE),
        }
    }
}

impl Default for AdminScripts {
    fn default() -> AdminScripts {
        AdminScripts::new()
    }
}

/// Returns a request's concurrency leases.
pub const RELEASE_SOURCE: &str = include_str!("../../../lua/release.lua");

/// Integers per limit in the reply.
pub const REPLY_STRIDE: usize = 6;

/// One limit's arguments in a script call.
#[derive(Debug, Clone, Copy)]
struct LimitArgs {
    algorithm: &'static str,
    params: [u64; 3],
    cost: u64,
    shadow: bool,
}

impl LimitArgs {
    fn of(limit: &Limit, cost: u64, now_us: i64) -> LimitArgs {
        LimitArgs {
            algorithm: limit.script_name(),
            params: limit.algorithm.script_params(now_us),
            cost,
            shadow: limit.shadow,
        }
    }

    /// Writes the six ARGV values of this limit (`lua/check.lua`), one argument each.
    fn write(&self, out: &mut impl Arguments) {
        out.bytes(self.algorithm.as_bytes());
        for param in self.params {
            out.integer(param);
        }
        out.integer(self.cost);
        out.integer(u64::from(self.shadow));
    }
}

/// One request's part of a script call, owned so it can wait for its batch: its id and, per
/// limit, the key and arguments. Keys live inline for the usual route (up to 256 bytes).
#[derive(Debug, Clone)]
pub struct Call {
    id: RequestId,
    keys: SmallVec<[u8; 256]>,
    key_ends: SmallVec<[usize; 4]>,
    limits: SmallVec<[LimitArgs; 4]>,
    algorithms: Algorithms,
}

impl Call {
    /// The call for `request`; calendar bounds are those around the gateway's clock now.
    pub fn of(request: &LimitRequest<'_>) -> Call {
        Call::at(request, SystemClock.now_us())
    }

    /// The call for `request`, with calendar bounds computed around `now_us`.
    pub fn at(request: &LimitRequest<'_>, now_us: i64) -> Call {
        let mut call = Call {
            id: request.id,
            keys: SmallVec::new(),
            key_ends: SmallVec::new(),
            limits: SmallVec::new(),
            algorithms: Algorithms::default(),
        };
        for entry in request.entries {
            call.algorithms = call.algorithms.with(Algorithms::of_limit(entry.limit));
            call.keys.extend_from_slice(entry.key);
            call.key_ends.push(call.keys.len());
            call.limits
                .push(LimitArgs::of(entry.limit, entry.cost, now_us));
        }
        call
    }

    /// How many limits it decides (its keys, and its reply's statuses).
    pub fn limits(&self) -> usize {
        self.limits.len()
    }

    /// Its keys, in limit order.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        // Each key runs from where the one before it ended.
        self.key_ends.iter().scan(0, |start, &end| {
            let key = self.keys.get(*start..end);
            *start = end;
            key
        })
    }

    /// Its first key (which names the Cluster slot of all of them).
    pub fn first_key(&self) -> &[u8] {
        &self.keys[..self.key_ends.first().copied().unwrap_or(0)]
    }
}

/// The decision script holding every algorithm of `calls`.
pub fn script_for(calls: &[&Call]) -> &'static DecisionScript {
    let algorithms = calls
        .iter()
        .fold(Algorithms::default(), |set, call| set.with(call.algorithms));
    decision_script(algorithms)
}

/// Where a decision call's arguments are written: a redis-rs command, or the RESP bytes the
/// decision lane's own connection sends (`direct.rs`).
pub trait Arguments {
    fn bytes(&mut self, argument: &[u8]);
    fn integer(&mut self, argument: u64);
}

impl Arguments for redis::Cmd {
    fn bytes(&mut self, argument: &[u8]) {
        self.arg(argument);
    }

    fn integer(&mut self, argument: u64) {
        self.arg(argument);
    }
}

/// How many arguments the call deciding `calls` has, command name included: the command, the
/// function or SHA, the key count, the keys, the clock and the request count, then per request
/// its id, its count of limits and six values per limit.
pub fn batch_arguments(calls: &[&Call]) -> usize {
    let keys: usize = calls.iter().map(|call| call.limits()).sum();
    5 + 7 * keys + 2 * calls.len()
}

/// The `FCALL` or `EVALSHA` of `decision` (holding every algorithm of `calls`) deciding `calls`
/// in order, at `now_us` (`None`: Redis's clock, the production path), as a redis-rs command
/// sized once: no allocation per argument.
pub fn batch_command(
    decision: &DecisionScript,
    invoke: Invoke,
    calls: &[&Call],
    now_us: Option<u64>,
) -> redis::Cmd {
    let key_bytes: usize = calls.iter().map(|call| call.keys.len()).sum();
    let keys: usize = calls.iter().map(|call| call.limits()).sum();
    let mut command = redis::Cmd::with_capacity(
        batch_arguments(calls),
        64 + key_bytes + 40 * calls.len() + 6 * 20 * keys,
    );
    write_batch(&mut command, decision, invoke, calls, now_us);
    command
}

/// Writes the arguments of the call deciding `calls` (see [`batch_command`]) into `out`.
pub fn write_batch(
    out: &mut impl Arguments,
    decision: &DecisionScript,
    invoke: Invoke,
    calls: &[&Call],
    now_us: Option<u64>,
) {
    match invoke {
        Invoke::Function => {
            out.bytes(b"FCALL");
            out.bytes(decision.function.as_bytes());
        }
        Invoke::Script => {
            out.bytes(b"EVALSHA");
            out.bytes(decision.script.get_hash().as_bytes());
        }
    }
    out.integer(calls.iter().map(|call| call.limits() as u64).sum());
    for call in calls {
        for key in call.keys() {
            out.bytes(key);
        }
    }
    match now_us {
        Some(now) => out.integer(now),
        None => out.bytes(b""),
    }
    out.integer(calls.len() as u64);
    for call in calls {
        out.bytes(&call.id.hex());
        out.integer(call.limits() as u64);
        for limit in &call.limits {
            limit.write(out);
        }
    }
}

/// Turns the script's flat integer reply into a decision where every limit is enforced.
pub fn parse_reply(reply: &[i64], limits: usize) -> Result<Decision, LimiterError> {
    parse_statuses(reply, limits).map(Decision::from_statuses)
}

/// The per-limit statuses of the script's flat integer reply, refusing anything malformed.
pub fn parse_statuses(reply: &[i64], limits: usize) -> Result<Statuses, LimiterError> {
    if reply.len() != limits * REPLY_STRIDE {
        return Err(LimiterError::Reply(format!(
            "expected {} integers for {limits} limits, got {}",
            limits * REPLY_STRIDE,
            reply.len()
        )));
    }
    let statuses = reply
        .chunks_exact(REPLY_STRIDE)
        .map(|status| {
            let [allowed, remaining, retry, reset, delay, mark] = [
                status[0], status[1], status[2], status[3], status[4], status[5],
            ];
            if !(0..=1).contains(&allowed)
                || remaining < 0
                || retry < -1
                || reset < 0
                || delay < 0
                || mark < 0
            {
                return Err(LimiterError::Reply(format!(
                    "out-of-range status {status:?}"
                )));
            }
            Ok(LimitStatus {
                allowed: allowed == 1,
                remaining: remaining as u64,
                retry_after_ms: (retry >= 0).then_some(retry as u64),
                reset_after_ms: reset as u64,
                delay_ms: delay as u64,
                mark_us: mark,
            })
        })
        .collect::<Result<Statuses, _>>()?;
    Ok(statuses)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_reply_and_names_the_longest_denial() {
        let d = parse_reply(&[1, 4, 0, 100, 0, 7, 0, 0, 250, 1000, 0, 0], 2).unwrap();
        assert_eq!(d.denied_by, Some(1));
        assert_eq!(d.statuses[0].remaining, 4);
        assert_eq!(d.statuses[1].retry_after_ms, Some(250));
        assert_eq!(d.statuses[0].mark_us, 7);
        let never = parse_reply(&[0, 0, -1, 0, 0, 0], 1).unwrap();
        assert_eq!(never.retry(), crate::limiter::decision::Retry::Never);
        let shaped = parse_reply(&[1, 0, 0, 300, 120, 9], 1).unwrap();
        assert_eq!(shaped.delay_ms(), 120);
    }

    #[test]
    fn each_admin_operation_is_a_script_of_its_own_holding_only_the_parts_it_uses() {
        let sources = [
            ("reset", RESET_SOURCE),
            ("credit", CREDIT_SOURCE),
            ("override_put", OVERRIDE_PUT_SOURCE),
            ("override_restore", OVERRIDE_RESTORE_SOURCE),
            ("override_delete", OVERRIDE_DELETE_SOURCE),
            ("announce", ANNOUNCE_SOURCE),
        ];
        for (name, source) in sources {
            for (other, _) in sources {
                let header = format!("-- admin/{other}.lua:");
                assert_eq!(
                    source.contains(&header),
                    name == other,
                    "{name} holds {other}"
                );
            }
            let holds = |function: &str| source.contains(&format!("local function {function}("));
            let epoch = name.starts_with("override_") || name == "announce";
            assert_eq!(holds("announce"), epoch, "{name}: the epoch's part");
            assert_eq!(
                holds("has_room"),
                name.starts_with("override_"),
                "{name}: the overrides' part"
            );
            assert_eq!(holds("now_us"), name != "reset", "{name}: the prelude");
        }
        let scripts = AdminScripts::new();
        let each = [
            &scripts.reset,
            &scripts.credit,
            &scripts.override_put,
            &scripts.override_restore,
            &scripts.override_delete,
            &scripts.announce,
        ];
        for ((name, source), script) in sources.iter().zip(each) {
            let hash = redis::Script::new(source).get_hash().to_string();
            assert_eq!(script.get_hash(), hash, "{name} runs its own source");
        }
        let mut hashes: Vec<&str> = each.iter().map(|script| script.get_hash()).collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), sources.len(), "six scripts, six hashes");
    }

    #[test]
    fn each_algorithm_has_its_file_and_a_script_holds_only_its_algorithms() {
        use crate::limiter::algorithm::Period;
        use crate::limiter::testing::{concurrency, gcra, limit, window};
        let windowed = |algorithm: fn(u64, u64) -> Algorithm| algorithm(5, 60_000_000);
        let algorithms = [
            gcra(10, 1),
            window(5),
            Algorithm::Calendar {
                limit: 5,
                period: Period::Aligned {
                    length_us: 60_000_000,
                },
            },
            windowed(|limit, window_us| Algorithm::SlidingWindow { limit, window_us }),
            windowed(|limit, window_us| Algorithm::SlidingLog { limit, window_us }),
            concurrency(2),
        ];
        let mut limits: Vec<Limit> = algorithms.into_iter().map(|a| limit("l", a)).collect();
        let regions = crate::limiter::regions::three(0);
        let (part, global) = regions.compile(
            window(300),
            crate::limiter::regions::Consistency::Strict,
            300,
        );
        limits.push(Limit {
            global: Some(global),
            ..limit("g", part)
        });
        for limit in &limits {
            let set = Algorithms::of_limit(limit);
            let name = limit.script_name();
            assert_eq!(Algorithms::named([name]), Some(set));
            let source = decision_source(set);
            assert!(source.contains(&format!("local function {name}_decide(")));
            assert!(source.contains(&format!("DECIDE = {{ {name} = {name}_decide }}")));
            for other in ALGORITHM_FILES
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| *n != name)
            {
                assert!(!source.contains(&format!("local function {other}_decide(")));
            }
        }
        assert_eq!(Algorithms::of_limits(&limits), Algorithms::ALL);
        assert_eq!(Algorithms::named(["gcra", "leaky"]), None);
        let all = decision_script(Algorithms::ALL);
        assert!(std::ptr::eq(all, decision_script(Algorithms::ALL)));
        assert_eq!(all.function, format!("sluice_{}", all.script.get_hash()));
        assert!(all
            .library
            .starts_with(&format!("#!lua name={}\n", all.function)));
        assert!(all.library.contains(DRIVER));
    }

    #[test]
    fn refuses_malformed_replies() {
        assert!(parse_reply(&[1, 2, 3], 1).is_err());
        assert!(parse_reply(&[2, 0, 0, 0, 0, 0], 1).is_err());
        assert!(parse_reply(&[0, -1, 0, 0, 0, 0], 1).is_err());
        assert!(parse_reply(&[1, 0, 0, 0, -3, 0], 1).is_err());
        assert!(parse_reply(&[1, 0, 0, 0, 0, -1], 1).is_err());
    }
}
