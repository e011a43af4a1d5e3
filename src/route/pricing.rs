//! Where priced limits read their costs: the request header a limit's `cost_header` names and
//! the response header or trailer its `cost_from_response` names. The limiter knows costs as
//! numbers ([`Sent`]); the header names, compiled once per route, live here beside the route.

use http::header::{HeaderMap, HeaderName};

use crate::limiter::{CostReport, Limit, Sent};

/// The headers one limit reads its cost from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CostHeaders {
    /// `cost_header`: the request says its cost.
    pub request: Option<HeaderName>,
    /// `cost_from_response.header`: the response (or its trailers) reports the cost.
    pub response: Option<HeaderName>,
}

impl CostHeaders {
    /// What the request `headers` say this limit costs.
    pub fn request(&self, headers: &HeaderMap) -> Sent {
        match &self.request {
            Some(name) => whole_number(headers, name),
            None => Sent::Nothing,
        }
    }

    /// Reads what `headers` (a response head, or its trailers) say the response cost, when
    /// `limit` is priced by the response: a report found replaces the one held in `report`.
    pub fn read_report(&self, limit: &Limit, headers: &HeaderMap, report: &mut CostReport) {
        let (Some(price), Some(name)) = (&limit.priced_by_response, &self.response) else {
            return;
        };
        match price.report(whole_number(headers, name)) {
            CostReport::Missing => {}
            found => *report = found,
        }
    }
}

/// The whole number a header (or trailer) holds: nothing when absent; malformed when it is
/// sent twice, holds a list, or is not one whole number — never one of its values.
pub fn whole_number(headers: &HeaderMap, name: &HeaderName) -> Sent {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Sent::Nothing;
    };
    if values.next().is_some() {
        return Sent::Malformed;
    }
    std::str::from_utf8(value.as_bytes())
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .map_or(Sent::Malformed, Sent::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{BadCost, Cost, ResponsePrice};

    #[test]
    fn header_costs_are_whole_numbers_within_the_cap() {
        let name = HeaderName::from_static("x-cost");
        let cost = Cost::Requested { max: 5, default: 2 };
        let of = |headers: &HeaderMap| cost.of(whole_number(headers, &name));
        let mut headers = HeaderMap::new();
        assert_eq!(of(&headers), Ok(2));
        for (value, expected) in [
            ("3", Ok(3)),
            (" 5 ", Ok(5)),
            ("6", Err(BadCost)),
            ("0", Err(BadCost)),
            ("x", Err(BadCost)),
            ("1, 5", Err(BadCost)),
        ] {
            headers.insert("x-cost", value.parse().unwrap());
            assert_eq!(of(&headers), expected, "{value:?}");
        }
        headers.insert("x-cost", "5".parse().unwrap());
        headers.append("x-cost", "1".parse().unwrap());
        assert_eq!(of(&headers), Err(BadCost), "twice is never the smaller");
    }

    #[test]
    fn a_response_reports_one_whole_number_and_is_capped_at_max() {
        let name = HeaderName::from_static("x-usage-tokens");
        let price = ResponsePrice { max: 100 };
        let read = |headers: &HeaderMap| price.report(whole_number(headers, &name));
        let mut headers = HeaderMap::new();
        assert_eq!(read(&headers), CostReport::Missing);
        for (value, expected) in [
            ("0", CostReport::Reported(0)),
            (" 42 ", CostReport::Reported(42)),
            ("100", CostReport::Reported(100)),
            ("101", CostReport::Capped(100)),
            ("99999999999999999999999", CostReport::Invalid),
            ("-1", CostReport::Invalid),
            ("1.5", CostReport::Invalid),
            ("1, 2", CostReport::Invalid),
        ] {
            headers.insert("x-usage-tokens", value.parse().unwrap());
            assert_eq!(read(&headers), expected, "{value:?}");
        }
        headers.append("x-usage-tokens", "1".parse().unwrap());
        assert_eq!(read(&headers), CostReport::Invalid, "sent twice");
    }
}
