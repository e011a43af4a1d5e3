//! Which unspent units of a strict global key this region gives to which peer this exchange
//! period: by recent demand, keeping this region's own projected need. Safety never depends on
//! it (a give never takes more than is unspent, `lua/regions/give.lua`); it only decides how
//! few requests are refused for lack of units in the right region.

use super::ledger::{Ledger, Record};
use super::notes::Note;
use super::{Kind, Regions, MAX_REGIONS};

/// A region gives away only what it does not expect to need within its horizon, times this.
const KEEP: f64 = 1.5;

/// An idle borrower gives a calendar quota's units above its seed back home after this many
/// exchange periods without a request.
pub const IDLE_PERIODS: u32 = 10;

/// What one region last published of a key, and its count one exchange period before.
#[derive(Debug, Clone)]
pub struct Heard {
    pub record: Record,
    pub at_us: i64,
    pub before: Option<(u64, i64)>,
}

impl Heard {
    /// Units per microsecond lately: over the last two publications, or since the period began.
    fn rate(&self) -> f64 {
        recent_rate(
            self.record.used,
            self.at_us,
            self.before,
            self.record.note.start_us,
        )
    }
}

/// This region's count of a key and the count one exchange period before.
#[derive(Debug, Clone, Copy, Default)]
pub struct Recent {
    pub before: Option<(u64, i64)>,
    /// Since when the count has not moved.
    pub idle_since_us: Option<i64>,
}

fn recent_rate(used: u64, at_us: i64, before: Option<(u64, i64)>, start_us: i64) -> f64 {
    match before {
        Some((then, then_us)) if at_us > then_us && used >= then => {
            (used - then) as f64 / (at_us - then_us) as f64
        }
        _ if at_us > start_us && start_us > 0 => used as f64 / (at_us - start_us) as f64,
        _ => 0.0,
    }
}

/// Units this region gives `taker` of `note`'s key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Give {
    pub note: Note,
    /// This region's base for the key (what `give.lua` checks the unspent against).
    pub base: u64,
    pub taker: usize,
    pub units: u64,
}

/// What this region gives of one strict key: `ledger` is its own, `heard` the peers' latest
/// records of the same period, `recent` its own recent count.
pub fn gives(
    regions: &Regions,
    now_us: i64,
    note: &Note,
    ledger: &Ledger,
    heard: &[Option<Heard>; MAX_REGIONS],
    recent: &Recent,
) -> Vec<Give> {
    if note.kind == Kind::Approx || note.end_us <= now_us {
        return Vec::new();
    }
    let this = regions.this;
    let base = note.kind.base(regions, this, note.whole);
    let horizon = (note.end_us - now_us).min(regions.shortest_window().as_micros() as i64) as f64;
    let mine = ledger.unspent(base);
    let my_rate = recent_rate(ledger.used, now_us, recent.before, note.start_us);
    let need = (my_rate * horizon * KEEP).ceil() as u64;
    let mut spare = mine.saturating_sub(need);
    let give = |taker: usize, units: u64| Give {
        note: note.clone(),
        base,
        taker,
        units,
    };
    let wants = wants(regions, (note, ledger), heard, horizon);
    let wanted: u64 = wants.iter().sum();
    let cap = (note.whole / (4 * regions.list.len() as u64)).max(1);
    let mut out = Vec::new();
    if wanted > 0 && spare > 0 {
        let share = spare;
        for (peer, &want) in wants.iter().enumerate().filter(|(_, w)| **w > 0) {
            let fair = (u128::from(share) * u128::from(want)).div_ceil(u128::from(wanted));
            let units = want.min(cap).min(fair as u64).min(spare);
            if units > 0 {
                spare -= units;
                out.push(give(peer, units));
            }
        }
    }
    let idle = recent
        .idle_since_us
        .is_some_and(|since| now_us - since >= (regions.every * IDLE_PERIODS).as_micros() as i64);
    if note.kind == Kind::Quota && this != regions.home && idle && out.is_empty() {
        let above_seed = mine.saturating_sub(regions.seed(note.whole));
        if above_seed > 0 {
            out.push(give(regions.home, above_seed));
        }
    }
    out
}

/// What each peer lacks of `note`'s key within `horizon` (us): its recent rate over the horizon,
/// less what it has unspent and what this region gave it that it has not applied yet; at least
/// a unit for a peer that had none left.
fn wants(
    regions: &Regions,
    (note, ledger): (&Note, &Ledger),
    heard: &[Option<Heard>; MAX_REGIONS],
    horizon: f64,
) -> [u64; MAX_REGIONS] {
    let mut wants = [0u64; MAX_REGIONS];
    for (peer, _) in regions.peers() {
        let Some(heard) = &heard[peer] else { continue };
        let record = &heard.record;
        if !record.note.same_period(note) {
            continue;
        }
        let in_flight = ledger.given_out[peer].saturating_sub(record.given_in[regions.this]);
        let free = record.room.saturating_sub(record.used) + in_flight;
        let mut needed = (heard.rate() * horizon).ceil() as u64;
        if record.used >= record.room {
            needed = needed.max(1);
        }
        wants[peer] = needed.saturating_sub(free);
    }
    wants
}

/// `recent` after this region counted `used` at `now_us`.
pub fn remember(recent: &mut Recent, used: u64, now_us: i64) {
    let moved = recent.before.is_none_or(|(then, _)| then != used);
    recent.idle_since_us = if moved {
        None
    } else {
        recent.idle_since_us.or(Some(now_us))
    };
    recent.before = Some((used, now_us));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(kind: Kind) -> Note {
        Note {
            key: b"k".to_vec(),
            limit: "l".into(),
            kind,
            whole: 900,
            start_us: 0,
            end_us: 60_000_000,
        }
    }

    fn heard(used: u64, room: u64, at_us: i64) -> Option<Heard> {
        Some(Heard {
            record: Record {
                note: note(Kind::Strict),
                used,
                room,
                given_in: [0; MAX_REGIONS],
                given_out: [0; MAX_REGIONS],
            },
            at_us,
            before: None,
        })
    }

    #[test]
    fn an_idle_region_gives_a_busy_one_what_it_lacks_and_no_more_than_it_has() {
        let regions = super::super::three(0);
        let mut peers: [Option<Heard>; MAX_REGIONS] = Default::default();
        peers[1] = heard(300, 300, 10_000_000);
        let gives = gives(
            &regions,
            10_000_000,
            &note(Kind::Strict),
            &Ledger::default(),
            &peers,
            &Recent::default(),
        );
        assert_eq!(gives.len(), 1);
        assert_eq!(gives[0].taker, 1);
        assert!(
            gives[0].units > 0 && gives[0].units <= 75,
            "{}: capped at whole / 4N",
            gives[0].units
        );
    }

    #[test]
    fn units_in_flight_to_a_peer_are_not_given_twice() {
        let regions = super::super::three(0);
        let mut peers: [Option<Heard>; MAX_REGIONS] = Default::default();
        peers[1] = heard(300, 300, 10_000_000);
        let mut ledger = Ledger::default();
        ledger.given_out[1] = 200;
        let gives = gives(
            &regions,
            10_000_000,
            &note(Kind::Strict),
            &ledger,
            &peers,
            &Recent::default(),
        );
        assert!(gives.is_empty(), "{gives:?}");
    }

    #[test]
    fn an_idle_borrower_gives_a_quota_back_home_above_its_seed() {
        let regions = super::super::three(1);
        let mut ledger = Ledger::default();
        ledger.given_in[0] = 50;
        let recent = Recent {
            before: Some((0, 0)),
            idle_since_us: Some(0),
        };
        let peers: [Option<Heard>; MAX_REGIONS] = Default::default();
        let gives = gives(
            &regions,
            10_000_000,
            &note(Kind::Quota),
            &ledger,
            &peers,
            &recent,
        );
        assert_eq!(gives.len(), 1);
        assert_eq!(
            (gives[0].taker, gives[0].units),
            (0, 50 + 9 - 9),
            "the seed of 1 % stays"
        );
    }
}
