//! A global key's state in one region (its ledger: the hash `lua/global.lua` decides on) and the
//! record region sync publishes of it. Every number but the count is a total that only grows
//! within a period, so records merge by taking the larger value.

use std::fmt::Write as _;

use super::notes::Note;
use super::{Regions, MAX_REGIONS};

/// One global key's hash in one region, for one period.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// The period's bounds as stored (us; 0: not known yet).
    pub start_us: i64,
    pub end_us: i64,
    /// Units this region counted.
    pub used: u64,
    /// `i:<region>`: units each region gave this one, in total.
    pub given_in: [u64; MAX_REGIONS],
    /// `o:<region>`: units this region gave each region, in total.
    pub given_out: [u64; MAX_REGIONS],
    /// `r:<region>`: each region's latest known count (approx).
    pub counted: [u64; MAX_REGIONS],
}

/// The field of `region`'s total of `kind` (`i`, `o`, `r`).
pub fn field(kind: char, region: &str) -> String {
    format!("{kind}:{region}")
}

impl Ledger {
    /// The ledger of a hash's `fields` (name, value pairs, `HGETALL`); fields of regions not in
    /// `regions` are counted nowhere (they are logged where read).
    pub fn of_fields<'a>(
        regions: &Regions,
        fields: impl IntoIterator<Item = (&'a str, i64)>,
    ) -> Ledger {
        let mut ledger = Ledger::default();
        for (name, value) in fields {
            let units = u64::try_from(value).unwrap_or(0);
            match name {
                "s" => ledger.start_us = value,
                "e" => ledger.end_us = value,
                "n" => ledger.used = units,
                _ => {
                    let Some((kind, region)) = name.split_once(':') else {
                        continue;
                    };
                    let Some(at) = regions.index_of(region) else {
                        continue;
                    };
                    match kind {
                        "i" => ledger.given_in[at] = units,
                        "o" => ledger.given_out[at] = units,
                        "r" => ledger.counted[at] = units,
                        _ => {}
                    }
                }
            }
        }
        ledger
    }

    /// What this region may count to in its period: `base` plus what was given in, less what
    /// was given away and what the others counted (mirrors `global_decide`).
    pub fn room(&self, base: u64) -> u64 {
        let sum = |totals: &[u64; MAX_REGIONS]| totals.iter().map(|&t| i128::from(t)).sum::<i128>();
        let room =
            i128::from(base) + sum(&self.given_in) - sum(&self.given_out) - sum(&self.counted);
        u64::try_from(room.max(0)).unwrap_or(u64::MAX)
    }

    /// Units of the room not counted yet.
    pub fn unspent(&self, base: u64) -> u64 {
        self.room(base).saturating_sub(self.used)
    }

    /// Whether the stored counter is the period `[start, end)`'s (either known bound matches).
    pub fn is_period(&self, start_us: i64, end_us: i64) -> bool {
        (self.start_us != 0 && self.start_us == start_us)
            || (self.end_us != 0 && self.end_us == end_us)
    }
}

/// What one region publishes of one global key each exchange period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The key, its limit and period (each reader computes its own base from the whole).
    pub note: Note,
    /// The publisher's count, room and totals given in and out, per region.
    pub used: u64,
    pub room: u64,
    pub given_in: [u64; MAX_REGIONS],
    pub given_out: [u64; MAX_REGIONS],
}

impl Record {
    /// One line of an entry: the note's member, then `used room in,.. out,..`.
    pub fn write(&self, regions: usize, out: &mut String) {
        let totals = |t: &[u64; MAX_REGIONS]| {
            t[..regions]
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let _ = writeln!(
            out,
            "{} {} {} {} {}",
            self.note.member(),
            self.used,
            self.room,
            totals(&self.given_in),
            totals(&self.given_out),
        );
    }

    /// The records of an entry's text; `None` for one that is not well formed.
    pub fn read_all(text: &str, regions: usize) -> Option<Vec<Record>> {
        text.lines()
            .map(|line| Record::read(line, regions))
            .collect()
    }

    fn read(line: &str, regions: usize) -> Option<Record> {
        let mut parts = line.rsplitn(5, ' ');
        let given_out = totals(parts.next()?, regions)?;
        let given_in = totals(parts.next()?, regions)?;
        let room = parts.next()?.parse().ok()?;
        let used = parts.next()?.parse().ok()?;
        let note = Note::of_member(parts.next()?)?;
        Some(Record {
            note,
            used,
            room,
            given_in,
            given_out,
        })
    }
}

fn totals(text: &str, regions: usize) -> Option<[u64; MAX_REGIONS]> {
    let mut out = [0; MAX_REGIONS];
    let mut count = 0;
    for (at, value) in text.split(',').enumerate() {
        *out.get_mut(at)? = value.parse().ok()?;
        count += 1;
    }
    (count == regions).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::regions::Kind;

    #[test]
    fn a_record_reads_back_as_written() {
        let mut record = Record {
            note: Note {
                key: b"sluice:{k\xff}".to_vec(),
                limit: "per_min".into(),
                kind: Kind::Approx,
                whole: 1000,
                start_us: 60_000_000,
                end_us: 120_000_000,
            },
            used: 12,
            room: 400,
            given_in: [0; MAX_REGIONS],
            given_out: [0; MAX_REGIONS],
        };
        record.given_in[1] = 7;
        record.given_out[2] = 9;
        let mut text = String::new();
        record.write(3, &mut text);
        record.write(3, &mut text);
        assert_eq!(
            Record::read_all(&text, 3),
            Some(vec![record.clone(), record])
        );
        assert_eq!(Record::read_all("s 1 2 3 l zz 4 5 0,0,0 0,0,0", 3), None);
        assert_eq!(
            Record::read_all("s 1 2 3 l 00 4 5 0,0 0,0,0", 3),
            None,
            "regions differ"
        );
    }

    #[test]
    fn the_room_is_the_base_moved_by_every_total() {
        let regions = super::super::three(0);
        let fields = [
            ("s", 1),
            ("e", 2),
            ("n", 5),
            ("i:eu-west", 30),
            ("o:ap-south", 10),
            ("r:x", 99),
        ];
        let ledger = Ledger::of_fields(&regions, fields);
        assert_eq!(ledger.room(100), 120);
        assert_eq!(ledger.unspent(100), 115);
        assert_eq!(ledger.room(5), 25);
        let mut given = ledger.clone();
        given.given_out[2] = 1000;
        assert_eq!(given.room(100), 0, "never below nothing");
    }
}
